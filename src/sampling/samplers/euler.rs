//! `euler`: first-order ODE step `x += d * (sigma_next - sigma)`.

use super::{eval, to_d};
use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

/// Runs the sampler (rng and eta unused).
pub fn sample(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    _rng: &mut dyn Rng,
    _opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    for i in 0..sigmas.len() - 1 {
        let sigma = sigmas[i];
        let denoised = eval(denoiser, &x, sigma, i + 1)?;
        let d = to_d(&x, &denoised, sigma);
        let dt = sigmas[i + 1] - sigma;
        x.iter_mut().zip(&d).for_each(|(v, d)| *v += d * dt);
    }
    Ok(x)
}
