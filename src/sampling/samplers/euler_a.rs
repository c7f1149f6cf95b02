//! `euler_a` (and `ddim_trailing`): Euler to sigma_down, then fresh noise of size
//! sigma_up; with eta = 0 a deterministic DDIM-like interpolation. Flow models use the
//! flow ancestral split and rescale by alpha before adding noise.

use super::{add_noise, ancestral, eval};
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
    let eta = opts.eta;
    for i in 0..sigmas.len() - 1 {
        let (sigma, sigma_to) = (sigmas[i], sigmas[i + 1]);
        let denoised = eval(denoiser, &x, sigma, i + 1)?;
        if sigma_to == 0.0 {
            x = denoised;
            continue;
        }
        let (down, up, alpha) = if eta == 0.0 {
            (sigma_to, 0.0, 1.0)
        } else {
            ancestral(sigma, sigma_to, eta, opts.is_flow)
        };
        let r = down / sigma;
        x.iter_mut()
            .zip(&denoised)
            .for_each(|(v, d)| *v = r * *v + (1.0 - r) * d);
        if up > 0.0 {
            if opts.is_flow {
                x.iter_mut().for_each(|v| *v *= alpha);
            }
            add_noise(&mut x, rng, up);
        }
    }
    Ok(x)
}
