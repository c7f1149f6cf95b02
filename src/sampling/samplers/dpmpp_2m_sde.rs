//! `dpm++2m_sde`: DPM-Solver++(2M) SDE, midpoint variant (k-diffusion
//! `sample_dpmpp_2m_sde`, s_noise = 1, plain Gaussian noise from the rng).

use super::{add_noise, eval};
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
                add_noise(&mut x, rng, scale);
            }
            h_last = h;
        }
        old = Some(denoised);
    }
    Ok(x)
}
