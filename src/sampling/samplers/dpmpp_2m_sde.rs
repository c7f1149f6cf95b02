//! `dpm++2m_sde`: DPM-Solver++(2M) SDE, midpoint variant (k-diffusion
//! `sample_dpmpp_2m_sde`, s_noise = 1, plain Gaussian noise from the rng).
//!
//! The step is shared with `dpm++2m_sde_bt`, which only swaps the noise source.

use super::eval;
use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

/// Runs the sampler.
pub fn sample(
    denoiser: &mut dyn Denoiser,
    x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    run(denoiser, x, sigmas, opts.eta, |_, _, n| Ok(rng.randn(n)))
}

/// The 2M SDE loop; `noise(sigma, sigma_next, len)` returns unit-variance noise for
/// the step `sigma -> sigma_next` (only called when eta > 0).
pub(crate) fn run(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    eta: f32,
    mut noise: impl FnMut(f32, f32, usize) -> Result<Vec<f32>, SamplingError>,
) -> Result<Vec<f32>, SamplingError> {
    let mut old: Option<Vec<f32>> = None;
    let mut h_last = 0.0f32;
    for i in 0..sigmas.len() - 1 {
        let denoised = eval(denoiser, &x, sigmas[i], i + 1)?;
        if sigmas[i + 1] == 0.0 {
            x.clone_from(&denoised);
        } else {
            let t = -sigmas[i].ln();
            let s = -sigmas[i + 1].ln();
            let h = s - t;
            let eta_h = eta * h;
            let a = sigmas[i + 1] / sigmas[i] * (-eta_h).exp();
            let b = -(-h - eta_h).exp_m1();
            x.iter_mut()
                .zip(&denoised)
                .for_each(|(v, d)| *v = a * *v + b * d);
            if let Some(old) = &old {
                let c = 0.5 * b / (h_last / h);
                x.iter_mut()
                    .zip(denoised.iter().zip(old))
                    .for_each(|(v, (d, o))| *v += c * (d - o));
            }
            if eta > 0.0 {
                let scale = sigmas[i + 1] * (-(-2.0 * eta_h).exp_m1()).sqrt();
                let n = noise(sigmas[i], sigmas[i + 1], x.len())?;
                if n.len() != x.len() {
                    return Err(SamplingError::LengthMismatch {
                        what: "sampler noise vs latent",
                        expected: x.len(),
                        got: n.len(),
                    });
                }
                x.iter_mut().zip(n).for_each(|(v, n)| *v += n * scale);
            }
            h_last = h;
        }
        old = Some(denoised);
    }
    Ok(x)
}
