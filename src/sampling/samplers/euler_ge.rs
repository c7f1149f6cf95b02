//! `euler_ge`: gradient-estimation Euler (`d_bar = gamma d + (1 - gamma) d_prev`),
//! optional ancestral noise.

use super::{add_noise, ancestral, eval, to_d};
use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

/// Runs the sampler (`gamma` from the extra args).
pub fn sample(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    let gamma = opts.extra.ge_gamma;
    let mut old_d: Option<Vec<f32>> = None;
    for i in 0..sigmas.len() - 1 {
        let (sigma, sigma_to) = (sigmas[i], sigmas[i + 1]);
        let denoised = eval(denoiser, &x, sigma, i + 1)?;
        if sigma_to == 0.0 {
            x = denoised;
            continue;
        }
        let (down, up, alpha) = ancestral(sigma, sigma_to, opts.eta, opts.is_flow);
        let d = to_d(&x, &denoised, sigma);
        let dt = down - sigma;
        match &old_d {
            Some(od) => x
                .iter_mut()
                .zip(d.iter().zip(od))
                .for_each(|(v, (d, o))| *v += (d * gamma + o * (1.0 - gamma)) * dt),
            None => x.iter_mut().zip(&d).for_each(|(v, d)| *v += d * dt),
        }
        old_d = Some(d);
        if up > 0.0 {
            if opts.is_flow {
                x.iter_mut().for_each(|v| *v *= alpha);
            }
            add_noise(&mut x, rng, up);
        }
    }
    Ok(x)
}
