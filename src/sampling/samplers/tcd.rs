//! `tcd`: Trajectory Consistency Distillation sampler (gamma = eta), on the SD
//! scaled-linear DDPM table.

use super::{eval, to_d};
use crate::rng::Rng;
use crate::sampling::timesteps::TIMESTEPS;
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
    // Upstream builds this table in f64 from f32 betas.
    let (bs, be) = (0.000_85f32.sqrt(), 0.012f32.sqrt());
    let mut alphas_cumprod = vec![0.0f64; TIMESTEPS];
    let mut table = vec![0.0f64; TIMESTEPS];
    for i in 0..TIMESTEPS {
        let beta = bs + (be - bs) * (i as f32 / (TIMESTEPS - 1) as f32);
        let prev = if i == 0 { 1.0 } else { alphas_cumprod[i - 1] };
        // `std::pow(float, 2)` promotes to double upstream.
        alphas_cumprod[i] = prev * (1.0 - f64::from(beta).powi(2));
        table[i] = ((1.0 - alphas_cumprod[i]) / alphas_cumprod[i]).sqrt();
    }
    let timestep_of = |s: f32| -> usize {
        let s = f64::from(s);
        let hi = table.partition_point(|&v| v < s);
        if hi == 0 {
            return 0;
        }
        if hi == TIMESTEPS {
            return TIMESTEPS - 1;
        }
        if (table[hi] - s).abs() < (table[hi - 1] - s).abs() {
            hi
        } else {
            hi - 1
        }
    };
    for i in 0..sigmas.len() - 1 {
        let (sigma, sigma_to) = (sigmas[i], sigmas[i + 1]);
        let prev_t = timestep_of(sigma_to);
        let t_s = ((1.0 - eta) * prev_t as f32).floor().max(0.0) as usize;
        let t_s = t_s.min(TIMESTEPS - 1);
        let denoised = eval(denoiser, &x, sigma, i + 1)?;
        let d = to_d(&x, &denoised, sigma);
        let alpha_prev = 1.0 / (sigma_to * sigma_to + 1.0);
        let alpha_s = alphas_cumprod[t_s] as f32;
        let beta_s = 1.0 - alpha_s;
        let (c0, c1) = ((alpha_s / alpha_prev).sqrt(), (beta_s / alpha_prev).sqrt());
        x = denoised
            .iter()
            .zip(&d)
            .map(|(dn, dd)| c0 * dn + c1 * dd)
            .collect();
        if eta > 0.0 && sigma_to > 0.0 {
            let noise = rng.randn(x.len());
            let k0 = (alpha_prev / alpha_s).sqrt();
            let k1 = (1.0 / alpha_prev - 1.0 / alpha_s).sqrt();
            x.iter_mut()
                .zip(&noise)
                .for_each(|(v, n)| *v = k0 * *v + k1 * n);
        }
    }
    Ok(x)
}
