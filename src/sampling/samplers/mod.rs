//! The samplers, one per file, all `fn sample(denoiser, x, sigmas, rng, opts)`.
//!
//! Transcribed from stable-diffusion.cpp `denoiser.hpp` (itself mostly k-diffusion's
//! `sampling.py`), including its flow-model variants of the ancestral step.

pub mod dpm2;
pub mod dpmpp_2m;
pub mod dpmpp_2m_sde;
pub mod dpmpp_2m_sde_bt;
pub mod dpmpp_2m_v2;
pub mod dpmpp_2s_a;
pub mod er_sde;
pub mod euler;
pub mod euler_a;
pub mod euler_a_cfg_pp;
pub mod euler_cfg_pp;
pub mod euler_ge;
pub mod heun;
pub mod ipndm;
pub mod ipndm_v;
pub mod lcm;
pub mod lms;
pub mod res_2s;
pub mod res_multistep;
pub mod tcd;

use super::{Denoiser, SamplingError};
use crate::rng::Rng;

/// Sampler-specific `--extra-sample-args` (upstream keys in the field docs).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerExtraArgs {
    /// lcm `noise_clip_std`: clip fresh noise to this many standard deviations (0 = off).
    pub lcm_noise_clip_std: f32,
    /// lcm `noise_scale_start`.
    pub lcm_noise_scale_start: f32,
    /// lcm `noise_scale_end` (defaults to the start value when only that is set).
    pub lcm_noise_scale_end: f32,
    /// lms `lms_max_order` (>= 1).
    pub lms_max_order: usize,
    /// lms `lms_shift` history shift (0 = original k-diffusion).
    pub lms_shift: usize,
    /// lms `lms_divisions` for the coefficient integral (0 = plain Euler weights).
    pub lms_divisions: usize,
    /// euler_ge `gamma`.
    pub ge_gamma: f32,
}

impl Default for SamplerExtraArgs {
    fn default() -> Self {
        SamplerExtraArgs {
            lcm_noise_clip_std: 0.0,
            lcm_noise_scale_start: 1.0,
            lcm_noise_scale_end: 1.0,
            lms_max_order: 4,
            lms_shift: 1,
            lms_divisions: 1000,
            ge_gamma: 2.0,
        }
    }
}

impl SamplerExtraArgs {
    /// Applies `key=value` pairs in order; returns the keys it did not recognise (other
    /// layers, e.g. schedules or guidance, may own them). Bad values are errors.
    pub fn apply<'a>(
        &mut self,
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Vec<&'a str>, SamplingError> {
        let mut unknown = vec![];
        let mut end_set = false;
        let bad = |k: &str, v: &str, reason| SamplingError::InvalidArg {
            key: k.to_string(),
            value: v.to_string(),
            reason,
        };
        for (k, v) in pairs {
            let float = || {
                v.trim()
                    .parse::<f32>()
                    .map_err(|_| bad(k, v, "not a number"))
            };
            let int = || {
                v.trim()
                    .parse::<i64>()
                    .map_err(|_| bad(k, v, "not an integer"))
            };
            match k {
                "noise_clip_std" => self.lcm_noise_clip_std = float()?,
                "noise_scale_start" => {
                    self.lcm_noise_scale_start = float()?;
                    if !end_set {
                        self.lcm_noise_scale_end = self.lcm_noise_scale_start;
                    }
                }
                "noise_scale_end" => {
                    self.lcm_noise_scale_end = float()?;
                    end_set = true;
                }
                "lms_max_order" => self.lms_max_order = int()?.max(1) as usize,
                "lms_shift" => self.lms_shift = int()?.max(0) as usize,
                "lms_divisions" => {
                    self.lms_divisions =
                        usize::try_from(int()?).map_err(|_| bad(k, v, "must not be negative"))?
                }
                "gamma" => self.ge_gamma = float()?,
                _ => unknown.push(k),
            }
        }
        Ok(unknown)
    }
}

/// Rejects sigma lists no sampler can use.
pub fn validate_sigmas(sigmas: &[f32]) -> Result<(), SamplingError> {
    if sigmas.is_empty() {
        return Err(SamplingError::InvalidSigmas("no sigmas".into()));
    }
    if let Some(s) = sigmas.iter().find(|s| !s.is_finite() || **s < 0.0) {
        return Err(SamplingError::InvalidSigmas(format!(
            "sigma {s} is negative or not finite"
        )));
    }
    Ok(())
}

/// One model evaluation with a length check.
pub(crate) fn eval(
    d: &mut dyn Denoiser,
    x: &[f32],
    sigma: f32,
    step: usize,
) -> Result<Vec<f32>, SamplingError> {
    let out = d.denoise(x, sigma, step)?;
    if out.len() != x.len() {
        return Err(SamplingError::LengthMismatch {
            what: "denoiser output vs latent",
            expected: x.len(),
            got: out.len(),
        });
    }
    Ok(out)
}

/// `x += noise * scale` with fresh noise from `rng`.
pub(crate) fn add_noise(x: &mut [f32], rng: &mut dyn Rng, scale: f32) {
    let noise = rng.randn(x.len());
    for (v, n) in x.iter_mut().zip(noise) {
        *v += n * scale;
    }
}

/// `(x - denoised) / sigma`.
pub(crate) fn to_d(x: &[f32], denoised: &[f32], sigma: f32) -> Vec<f32> {
    x.iter()
        .zip(denoised)
        .map(|(a, b)| (a - b) / sigma)
        .collect()
}

/// k-diffusion ancestral split of the step `sigma_from -> sigma_to`: (down, up).
pub fn ancestral_step(sigma_from: f32, sigma_to: f32, eta: f32) -> (f32, f32) {
    if eta <= 0.0 {
        return (sigma_to, 0.0);
    }
    let (f2, t2) = (sigma_from * sigma_from, sigma_to * sigma_to);
    let mut up = 0.0f32;
    if f2 > 0.0 {
        let term = t2 * (f2 - t2) / f2;
        up = sigma_to.min(eta * term.max(0.0).sqrt());
    }
    let down2 = t2 - up * up;
    (if down2 > 0.0 { down2.sqrt() } else { 0.0 }, up)
}

/// Flow-model ancestral split: (down, up, alpha_scale); eta is clamped to 1.
pub fn ancestral_step_flow(sigma_from: f32, sigma_to: f32, eta: f32) -> (f32, f32, f32) {
    if eta <= 0.0 || sigma_from <= 0.0 || sigma_to <= 0.0 {
        return (sigma_to, 0.0, 1.0);
    }
    let eta = eta.min(1.0);
    let ratio = sigma_to / sigma_from;
    let down = (sigma_to * (1.0 + (ratio - 1.0) * eta)).clamp(0.0, sigma_to);
    let denom = 1.0 - down;
    if denom <= 0.0 {
        return (sigma_to, 0.0, 1.0);
    }
    let alpha = (1.0 - sigma_to) / denom;
    let term = ((down / sigma_to) * alpha).clamp(-1.0, 1.0);
    let up = sigma_to * (1.0 - term * term).max(0.0).sqrt();
    (down, up, alpha)
}

/// [`ancestral_step`] or [`ancestral_step_flow`] by model type.
pub fn ancestral(sigma_from: f32, sigma_to: f32, eta: f32, is_flow: bool) -> (f32, f32, f32) {
    if is_flow {
        ancestral_step_flow(sigma_from, sigma_to, eta)
    } else {
        let (down, up) = ancestral_step(sigma_from, sigma_to, eta);
        (down, up, 1.0)
    }
}

/// `phi_1(t) = (e^t - 1) / t` with a series near 0.
pub(crate) fn phi1(t: f32) -> f32 {
    if t.abs() < 1e-6 {
        return 1.0 + t * 0.5 + t * t / 6.0;
    }
    (t.exp() - 1.0) / t
}

/// `phi_2(t) = (phi_1(t) - 1) / t` with a series near 0.
pub(crate) fn phi2(t: f32) -> f32 {
    if t.abs() < 1e-6 {
        return 0.5 + t / 6.0 + t * t / 24.0;
    }
    (phi1(t) - 1.0) / t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_args_apply() {
        let mut a = SamplerExtraArgs::default();
        let unknown = a
            .apply([
                ("lms_max_order", "3"),
                ("noise_scale_start", "0.5"),
                ("alpha", "1"),
            ])
            .unwrap();
        assert_eq!(unknown, vec!["alpha"]);
        assert_eq!(a.lms_max_order, 3);
        assert_eq!(a.lcm_noise_scale_end, 0.5);
        assert!(a.apply([("gamma", "x")]).is_err());
    }

    #[test]
    fn ancestral_split_preserves_variance() {
        let (down, up) = ancestral_step(2.0, 1.0, 1.0);
        assert!((down * down + up * up - 1.0).abs() < 1e-6);
        assert_eq!(ancestral_step(2.0, 1.0, 0.0), (1.0, 0.0));
    }
}
