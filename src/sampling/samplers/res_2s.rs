//! `res_2s`: two-stage exponential integrator (RES 2S, c2 = 0.5), optional
//! ancestral noise (eta).

use super::{add_noise, ancestral, eval, phi1, phi2};
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
    const C2: f32 = 0.5;
    for i in 0..sigmas.len() - 1 {
        let (from, to) = (sigmas[i], sigmas[i + 1]);
        let denoised = eval(denoiser, &x, from, i + 1)?;
        let (down, up, alpha) = ancestral(from, to, opts.eta, opts.is_flow);
        if down == 0.0 || from == 0.0 {
            x = denoised;
        } else {
            let t = -from.ln();
            let h = -down.ln() - t;
            let a21 = C2 * phi1(-h * C2);
            let b2 = phi2(-h) / C2;
            let b1 = phi1(-h) - b2;
            let sigma_c2 = (-(t + h * C2)).exp();
            let eps1: Vec<f32> = denoised.iter().zip(&x).map(|(d, v)| d - v).collect();
            let x2: Vec<f32> = x
                .iter()
                .zip(&eps1)
                .map(|(v, e)| v + e * (h * a21))
                .collect();
            let denoised2 = eval(denoiser, &x2, sigma_c2, i + 1)?;
            x.iter_mut()
                .zip(eps1.iter().zip(&denoised2))
                .for_each(|(v, (e1, d2))| {
                    let e2 = d2 - *v;
                    *v += h * (b1 * e1 + b2 * e2);
                });
        }
        if to > 0.0 && up > 0.0 {
            if opts.is_flow {
                x.iter_mut().for_each(|v| *v *= alpha);
            }
            add_noise(&mut x, rng, up);
        }
    }
    Ok(x)
}
