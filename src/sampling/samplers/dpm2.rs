//! `dpm2`: midpoint (in log sigma) second-order step.

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
        let denoised = eval(denoiser, &x, sigmas[i], i + 1)?;
        let d = to_d(&x, &denoised, sigmas[i]);
        if sigmas[i + 1] == 0.0 {
            let dt = sigmas[i + 1] - sigmas[i];
            x.iter_mut().zip(&d).for_each(|(v, d)| *v += d * dt);
        } else {
            let sigma_mid = (0.5 * (sigmas[i].ln() + sigmas[i + 1].ln())).exp();
            let dt_1 = sigma_mid - sigmas[i];
            let dt_2 = sigmas[i + 1] - sigmas[i];
            let x2: Vec<f32> = x.iter().zip(&d).map(|(v, d)| v + d * dt_1).collect();
            let denoised2 = eval(denoiser, &x2, sigma_mid, i + 1)?;
            let d2 = to_d(&x2, &denoised2, sigma_mid);
            x.iter_mut().zip(&d2).for_each(|(v, d)| *v += d * dt_2);
        }
    }
    Ok(x)
}
