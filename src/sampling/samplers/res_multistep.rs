//! `res_multistep`: second-order exponential multistep (RES), with optional
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
    let t_fn = |s: f32| -s.ln();
    let mut old: Vec<f32> = vec![];
    let mut old_sigma_down: Option<f32> = None;
    for i in 0..sigmas.len() - 1 {
        let denoised = eval(denoiser, &x, sigmas[i], i + 1)?;
        let (from, to) = (sigmas[i], sigmas[i + 1]);
        let (down, up, alpha) = ancestral(from, to, opts.eta, opts.is_flow);
        match old_sigma_down {
            Some(old_down) if down != 0.0 => {
                let t = t_fn(from);
                let t_old = t_fn(old_down);
                let t_next = t_fn(down);
                let t_prev = t_fn(sigmas[i - 1]);
                let h = t_next - t;
                let c2 = (t_prev - t_old) / h;
                let (p1, p2) = (phi1(-h), phi2(-h));
                let mut b1 = p1 - p2 / c2;
                let mut b2 = p2 / c2;
                if !b1.is_finite() {
                    b1 = 0.0;
                }
                if !b2.is_finite() {
                    b2 = 0.0;
                }
                let e = (-h).exp();
                x.iter_mut()
                    .zip(denoised.iter().zip(&old))
                    .for_each(|(v, (d, o))| *v = e * *v + h * (b1 * d + b2 * o));
            }
            _ => {
                let dt = down - from;
                x.iter_mut()
                    .zip(&denoised)
                    .for_each(|(v, d)| *v += ((*v - d) / from) * dt);
            }
        }
        if to > 0.0 && up > 0.0 {
            if opts.is_flow {
                x.iter_mut().for_each(|v| *v *= alpha);
            }
            add_noise(&mut x, rng, up);
        }
        old = denoised;
        old_sigma_down = Some(down);
    }
    Ok(x)
}
