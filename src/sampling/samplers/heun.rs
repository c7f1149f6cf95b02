//! `heun`: second-order (trapezoidal) correction except on the final step to 0.

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
        let dt = sigmas[i + 1] - sigmas[i];
        if sigmas[i + 1] == 0.0 {
            x.iter_mut().zip(&d).for_each(|(v, d)| *v += d * dt);
        } else {
            let x2: Vec<f32> = x.iter().zip(&d).map(|(v, d)| v + d * dt).collect();
            let denoised2 = eval(denoiser, &x2, sigmas[i + 1], i + 1)?;
            let d2 = to_d(&x2, &denoised2, sigmas[i + 1]);
            x.iter_mut()
                .zip(d.iter().zip(&d2))
                .for_each(|(v, (a, b))| *v += ((a + b) / 2.0) * dt);
        }
    }
    Ok(x)
}
