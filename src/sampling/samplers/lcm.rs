//! `lcm`: take the denoised estimate, re-noise to the next sigma (flow models scale
//! the estimate by `1 - sigma_next` first). Optional noise clipping / scaling from
//! the extra args.

use super::eval;
use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

/// Runs the sampler.
pub fn sample(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    let a = &opts.extra;
    let steps = sigmas.len() - 1;
    for i in 0..steps {
        x = eval(denoiser, &x, sigmas[i], i + 1)?;
        let next = sigmas[i + 1];
        if next > 0.0 {
            if opts.is_flow {
                x.iter_mut().for_each(|v| *v *= 1.0 - next);
            }
            let mut noise = rng.randn(x.len());
            if a.lcm_noise_clip_std > 0.0 && !noise.is_empty() {
                let len = noise.len() as f64;
                let mean = noise.iter().map(|&v| f64::from(v)).sum::<f64>() / len;
                let var = noise
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / len;
                let clip = a.lcm_noise_clip_std * var.sqrt() as f32;
                noise.iter_mut().for_each(|v| *v = v.clamp(-clip, clip));
            }
            let t = if steps > 1 {
                i as f32 / (steps - 1) as f32
            } else {
                0.0
            };
            let scale =
                a.lcm_noise_scale_start + (a.lcm_noise_scale_end - a.lcm_noise_scale_start) * t;
            let k = next * scale;
            x.iter_mut().zip(&noise).for_each(|(v, n)| *v += n * k);
        }
    }
    Ok(x)
}
