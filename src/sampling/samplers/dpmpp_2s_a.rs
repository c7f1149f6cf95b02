//! `dpm++2s_a`: DPM-Solver++(2S) ancestral. Flow models use upstream's flow form
//! (midpoint in logit space, flow ancestral noise).

use super::{add_noise, ancestral_step, ancestral_step_flow, eval};
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
    if opts.is_flow {
        sample_flow(denoiser, x, sigmas, rng, opts.eta)
    } else {
        sample_k(denoiser, x, sigmas, rng, opts.eta)
    }
}

fn sample_k(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    eta: f32,
) -> Result<Vec<f32>, SamplingError> {
    for i in 0..sigmas.len() - 1 {
        let denoised = eval(denoiser, &x, sigmas[i], i + 1)?;
        let (down, up) = ancestral_step(sigmas[i], sigmas[i + 1], eta);
        if down == 0.0 {
            x = denoised;
        } else {
            let t = -sigmas[i].ln();
            let t_next = -down.ln();
            let h = t_next - t;
            let s = t + 0.5 * h;
            let sigma_s = (-s).exp();
            let sigma_t = (-t).exp();
            let a = sigma_s / sigma_t;
            let b = (-h * 0.5).exp() - 1.0;
            let x2: Vec<f32> = x
                .iter()
                .zip(&denoised)
                .map(|(v, d)| a * v - b * d)
                .collect();
            let denoised2 = eval(denoiser, &x2, sigma_s, i + 1)?;
            let a2 = (-t_next).exp() / sigma_t;
            let b2 = (-h).exp() - 1.0;
            x.iter_mut()
                .zip(&denoised2)
                .for_each(|(v, d)| *v = a2 * *v - b2 * d);
        }
        if sigmas[i + 1] > 0.0 {
            add_noise(&mut x, rng, up);
        }
    }
    Ok(x)
}

fn sample_flow(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    eta: f32,
) -> Result<Vec<f32>, SamplingError> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, sigma_to) = (sigmas[i], sigmas[i + 1]);
        // At sigma = 1 the midpoint coincides with the current point: reuse the eval.
        let first_step = 1.0 - f64::from(sigma) < 1e-6;
        let denoised = eval(denoiser, &x, sigma, i + 1)?;
        if sigma_to == 0.0 {
            x = denoised;
            continue;
        }
        let (down, up, alpha) = ancestral_step_flow(sigma, sigma_to, eta);
        let d_i = if first_step {
            denoised
        } else {
            // Midpoint of lambda = log((1 - s) / s), written to avoid the s -> 1 pole.
            let exp_s = (((1.0 - sigma) / sigma) * ((1.0 - down) / down)).sqrt();
            let sigma_s = 1.0 / (exp_s + 1.0);
            let r = sigma_s / sigma;
            let u: Vec<f32> = x
                .iter()
                .zip(&denoised)
                .map(|(v, d)| v * r + d * (1.0 - r))
                .collect();
            eval(denoiser, &u, sigma_s, i + 1)?
        };
        let r = down / sigma;
        x.iter_mut()
            .zip(&d_i)
            .for_each(|(v, d)| *v = *v * r + d * (1.0 - r));
        if eta > 0.0 {
            x.iter_mut().for_each(|v| *v *= alpha);
            add_noise(&mut x, rng, up);
        }
    }
    Ok(x)
}
