//! `euler_cfg_pp`: CFG++ Euler, renoising along the unconditional direction.

use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

/// Runs the sampler (needs [`Denoiser::denoise_cfg_pp`]).
pub fn sample(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    _rng: &mut dyn Rng,
    _opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    for i in 0..sigmas.len() - 1 {
        let sigma = sigmas[i];
        let out = cfg_pp_eval(denoiser, &x, sigma, i + 1, "euler_cfg_pp")?;
        let next = sigmas[i + 1];
        x.iter_mut()
            .zip(out.denoised.iter().zip(&out.uncond_denoised))
            .for_each(|(v, (d, u))| *v = d + ((*v - u) / sigma) * next);
    }
    Ok(x)
}

/// CFG++ evaluation with length checks; names the sampler when unsupported.
pub(crate) fn cfg_pp_eval(
    denoiser: &mut dyn Denoiser,
    x: &[f32],
    sigma: f32,
    step: usize,
    name: &'static str,
) -> Result<crate::sampling::CfgPpOutput, SamplingError> {
    let out = denoiser
        .denoise_cfg_pp(x, sigma, step)
        .map_err(|e| match e {
            SamplingError::NeedsUncond(_) => SamplingError::NeedsUncond(name),
            e => e,
        })?;
    for len in [out.denoised.len(), out.uncond_denoised.len()] {
        if len != x.len() {
            return Err(SamplingError::LengthMismatch {
                what: "denoiser output vs latent",
                expected: x.len(),
                got: len,
            });
        }
    }
    Ok(out)
}
