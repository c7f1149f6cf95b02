//! `euler_a_cfg_pp`: CFG++ Euler ancestral (k-diffusion ancestral split).

use super::euler_cfg_pp::cfg_pp_eval;
use super::{add_noise, ancestral_step};
use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

/// Runs the sampler (needs [`Denoiser::denoise_cfg_pp`]).
pub fn sample(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    for i in 0..sigmas.len() - 1 {
        let sigma = sigmas[i];
        let out = cfg_pp_eval(denoiser, &x, sigma, i + 1, "euler_a_cfg_pp")?;
        let (down, up) = ancestral_step(sigma, sigmas[i + 1], opts.eta);
        x.iter_mut()
            .zip(out.denoised.iter().zip(&out.uncond_denoised))
            .for_each(|(v, (d, u))| *v = d + ((*v - u) / sigma) * down);
        if sigmas[i + 1] > 0.0 {
            add_noise(&mut x, rng, up);
        }
    }
    Ok(x)
}
