//! `er_sde`: Extended Reverse-time SDE solver (up to 3 stages, noise scaler
//! `x (e^{x^0.3} + 10)`), with upstream's flow-model mapping of sigma to lambda.

use super::{add_noise, eval};
use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

fn flow_sigma(s: f32) -> f32 {
    s.clamp(1e-6, 1.0 - 1e-4)
}

fn noise_scaler(x: f32) -> f32 {
    let x = x.max(0.0);
    x * (x.powf(0.3).exp() + 10.0)
}

/// Runs the sampler (`eta` acts as s_noise: 0 disables the noise).
pub fn sample(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    const MAX_STAGE: usize = 3;
    const POINTS: usize = 200;
    let flow = opts.is_flow;
    let mut sigmas = sigmas.to_vec();
    if flow {
        let n = sigmas.len();
        for s in &mut sigmas[..n - 1] {
            if *s > 1.0 {
                *s = flow_sigma(*s);
            }
        }
    }
    let lambda = |s: f32| {
        if flow {
            let s = flow_sigma(s);
            s / (1.0 - s).max(1e-6)
        } else {
            s.max(1e-6)
        }
    };
    let alpha_of = |s: f32| if flow { 1.0 - flow_sigma(s) } else { 1.0 };
    let lambdas: Vec<f32> = sigmas.iter().map(|&s| lambda(s)).collect();

    let mut old: Option<Vec<f32>> = None;
    let mut old_d: Option<Vec<f32>> = None;
    for i in 0..sigmas.len() - 1 {
        let denoised = eval(denoiser, &x, sigmas[i], i + 1)?;
        let stage = (i + 1).min(MAX_STAGE);
        if sigmas[i + 1] == 0.0 {
            x.clone_from(&denoised);
        } else {
            let (ls, lt) = (lambdas[i], lambdas[i + 1]);
            let (alpha_s, alpha_t) = (alpha_of(sigmas[i]), alpha_of(sigmas[i + 1]));
            let (scaled_s, scaled_t) = (noise_scaler(ls), noise_scaler(lt));
            let r_alpha = if alpha_s > 0.0 {
                alpha_t / alpha_s
            } else {
                0.0
            };
            let r = if scaled_s > 0.0 {
                scaled_t / scaled_s
            } else {
                0.0
            };
            x.iter_mut()
                .zip(&denoised)
                .for_each(|(v, d)| *v = r_alpha * r * *v + alpha_t * (1.0 - r) * d);

            if let (true, Some(old)) = (stage >= 2, &old) {
                let dt = lt - ls;
                let step = -dt / POINTS as f32;
                let (mut s, mut s_u) = (0.0f32, 0.0f32);
                let third = stage >= 3 && old_d.is_some();
                for p in 0..POINTS {
                    let lp = lt + p as f32 * step;
                    let sp = noise_scaler(lp);
                    if sp <= 0.0 {
                        continue;
                    }
                    s += 1.0 / sp;
                    if third {
                        s_u += (lp - ls) / sp;
                    }
                }
                s *= step;
                let denom_d = ls - lambdas[i - 1];
                if denom_d.abs() > 1e-12 {
                    let coeff_d = alpha_t * (dt + s * scaled_t);
                    let dd: Vec<f32> = denoised
                        .iter()
                        .zip(old)
                        .map(|(d, o)| (d - o) / denom_d)
                        .collect();
                    x.iter_mut().zip(&dd).for_each(|(v, d)| *v += coeff_d * d);
                    if let (true, Some(od)) = (third, &old_d) {
                        let denom_u = (ls - lambdas[i - 2]) * 0.5;
                        if denom_u.abs() > 1e-12 {
                            s_u *= step;
                            let coeff_u = alpha_t * (0.5 * dt * dt + s_u * scaled_t);
                            x.iter_mut()
                                .zip(dd.iter().zip(od))
                                .for_each(|(v, (d, o))| *v += coeff_u * ((d - o) / denom_u));
                        }
                    }
                    old_d = Some(dd);
                }
            }
            let nsq = lt * lt - ls * ls * r * r;
            if opts.eta > 0.0 && nsq > 0.0 {
                add_noise(&mut x, rng, alpha_t * nsq.max(0.0).sqrt());
            }
        }
        old = Some(denoised);
    }
    Ok(x)
}
