//! `ipndm`: improved PNDM, Adams-Bashforth on the last up to 4 derivatives with
//! fixed (equal-step) coefficients.

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
    const MAX_ORDER: usize = 4;
    let mut hist: Vec<Vec<f32>> = vec![];
    for i in 0..sigmas.len() - 1 {
        let (sigma, sigma_next) = (sigmas[i], sigmas[i + 1]);
        let denoised = eval(denoiser, &x, sigma, i + 1)?;
        let d = to_d(&x, &denoised, sigma);
        let dt = sigma_next - sigma;
        let n = hist.len();
        for (k, v) in x.iter_mut().enumerate() {
            let step = match (i + 1).min(MAX_ORDER) {
                1 => d[k],
                2 => (3.0 * d[k] - hist[n - 1][k]) / 2.0,
                3 => (23.0 * d[k] - 16.0 * hist[n - 1][k] + 5.0 * hist[n - 2][k]) / 12.0,
                _ => {
                    (55.0 * d[k] - 59.0 * hist[n - 1][k] + 37.0 * hist[n - 2][k]
                        - 9.0 * hist[n - 3][k])
                        / 24.0
                }
            };
            *v += step * dt;
        }
        if hist.len() == MAX_ORDER - 1 {
            hist.remove(0);
        }
        hist.push(d);
    }
    Ok(x)
}
