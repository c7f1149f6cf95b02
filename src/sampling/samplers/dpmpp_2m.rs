//! `dpm++2m`: DPM-Solver++(2M), multistep second order.

use super::eval;
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
    let t_fn = |s: f32| -s.ln();
    let mut old: Vec<f32> = vec![];
    for i in 0..sigmas.len() - 1 {
        let denoised = eval(denoiser, &x, sigmas[i], i + 1)?;
        let (t, t_next) = (t_fn(sigmas[i]), t_fn(sigmas[i + 1]));
        let h = t_next - t;
        let a = sigmas[i + 1] / sigmas[i];
        let b = (-h).exp() - 1.0;
        if i == 0 || sigmas[i + 1] == 0.0 {
            x.iter_mut()
                .zip(&denoised)
                .for_each(|(v, d)| *v = a * *v - b * d);
        } else {
            let h_last = t - t_fn(sigmas[i - 1]);
            let r = h_last / h;
            let k = 1.0 / (2.0 * r);
            x.iter_mut()
                .zip(denoised.iter().zip(&old))
                .for_each(|(v, (d, o))| *v = a * *v - b * ((1.0 + k) * d - k * o));
        }
        old = denoised;
    }
    Ok(x)
}
