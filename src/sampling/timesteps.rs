//! Noise-level tables of the model families: sigma <-> model timestep.
//!
//! Mirrors upstream's `CompVisDenoiser` (1000-entry DDPM sigma table, log-sigma
//! interpolation as in k-diffusion's `DiscreteSchedule`), `EDMVDenoiser`,
//! `DiscreteFlowDenoiser` (SD3-style shifted rectified flow) and `FluxFlowDenoiser`.

use super::SamplingError;

/// Number of training timesteps of the discrete models.
pub const TIMESTEPS: usize = 1000;

/// Default SD1/SD2/SDXL betas (`scaled_linear`, DDPM): linear in sqrt space.
pub const SD_LINEAR_START: f32 = 0.000_85;
/// See [`SD_LINEAR_START`].
pub const SD_LINEAR_END: f32 = 0.012;

/// `alphas_cumprod` for betas linear in sqrt space from `linear_start` to `linear_end`,
/// accumulated in f32 exactly like upstream `calculate_alphas_cumprod`.
pub fn scaled_linear_alphas_cumprod(linear_start: f32, linear_end: f32) -> Vec<f32> {
    let ls = linear_start.sqrt();
    let amount = linear_end.sqrt() - ls;
    let mut product = 1.0f32;
    (0..TIMESTEPS)
        .map(|i| {
            let beta = ls + amount * (i as f32 / (TIMESTEPS - 1) as f32);
            product *= 1.0 - beta.powf(2.0);
            product
        })
        .collect()
}

/// The 1000-entry sigma table of a discrete (eps / v) model.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscreteSigmas {
    sigmas: Vec<f32>,
    log_sigmas: Vec<f32>,
}

impl DiscreteSigmas {
    /// Table from an `alphas_cumprod` tensor (e.g. one stored in the checkpoint).
    pub fn from_alphas_cumprod(alphas_cumprod: &[f32]) -> Result<Self, SamplingError> {
        if alphas_cumprod.len() != TIMESTEPS {
            return Err(SamplingError::InvalidModelTable(format!(
                "alphas_cumprod has {} values, expected {TIMESTEPS}",
                alphas_cumprod.len()
            )));
        }
        if let Some(a) = alphas_cumprod
            .iter()
            .find(|a| !a.is_finite() || **a <= 0.0 || **a > 1.0)
        {
            return Err(SamplingError::InvalidModelTable(format!(
                "alphas_cumprod value {a} is outside (0, 1]"
            )));
        }
        let sigmas: Vec<f32> = alphas_cumprod
            .iter()
            .map(|a| ((1.0 - a) / a).sqrt())
            .collect();
        let log_sigmas = sigmas.iter().map(|s| s.ln()).collect();
        Ok(DiscreteSigmas { sigmas, log_sigmas })
    }

    /// The standard SD table (betas 0.00085 -> 0.012 in sqrt space).
    pub fn sd_default() -> Self {
        let ac = scaled_linear_alphas_cumprod(SD_LINEAR_START, SD_LINEAR_END);
        let sigmas: Vec<f32> = ac.iter().map(|a| ((1.0 - a) / a).sqrt()).collect();
        let log_sigmas = sigmas.iter().map(|s| s.ln()).collect();
        DiscreteSigmas { sigmas, log_sigmas }
    }

    /// The sigma of every training timestep (ascending).
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    /// Continuous timestep for `sigma`, interpolating linearly in log sigma.
    pub fn sigma_to_t(&self, sigma: f32) -> f32 {
        let log_sigma = sigma.ln();
        let above = self
            .log_sigmas
            .iter()
            .filter(|&&l| log_sigma - l >= 0.0)
            .count() as i64;
        let low = (above - 1).clamp(0, TIMESTEPS as i64 - 2) as usize;
        let (lo, hi) = (self.log_sigmas[low], self.log_sigmas[low + 1]);
        let w = ((lo - log_sigma) / (lo - hi)).clamp(0.0, 1.0);
        (1.0 - w) * low as f32 + w * (low + 1) as f32
    }

    /// Sigma at continuous timestep `t` in `[0, 999]` (clamped).
    pub fn t_to_sigma(&self, t: f32) -> f32 {
        let t = if t.is_nan() {
            0.0
        } else {
            t.clamp(0.0, (TIMESTEPS - 1) as f32)
        };
        let low = t.floor() as usize;
        let high = t.ceil() as usize;
        let w = t - low as f32;
        ((1.0 - w) * self.log_sigmas[low] + w * self.log_sigmas[high]).exp()
    }
}

/// How a model family maps sigma to its timestep input (upstream denoiser classes).
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSchedule {
    /// SD1/SD2/SDXL-style discrete DDPM table (eps or v prediction).
    Discrete(DiscreteSigmas),
    /// EDM v-prediction (e.g. SDXL-based EDM models): `sigma = exp(4 t / 1000)`.
    EdmV {
        /// Smallest sigma (upstream default 0.002).
        sigma_min: f32,
        /// Largest sigma (upstream default 120).
        sigma_max: f32,
    },
    /// SD3-style rectified flow, `--flow-shift` applied as `shift t / (1 + (shift-1) t)`;
    /// model timestep `1000 sigma`.
    Flow {
        /// The flow shift.
        shift: f32,
    },
    /// Flux-style rectified flow, `exp(shift) / (exp(shift) + 1/t - 1)`; model
    /// timestep = sigma.
    FluxFlow {
        /// The flow shift (mu).
        shift: f32,
    },
}

/// SD3 time shift (`time_snr_shift` upstream).
pub fn time_snr_shift(alpha: f32, t: f32) -> f32 {
    if alpha == 1.0 {
        return t;
    }
    alpha * t / (1.0 + (alpha - 1.0) * t)
}

/// Flux time shift `e^mu / (e^mu + (1/t - 1)^sigma)`.
pub fn flux_time_shift(mu: f32, sigma: f32, t: f32) -> f32 {
    mu.exp() / (mu.exp() + (1.0 / t - 1.0).powf(sigma))
}

impl ModelSchedule {
    /// The standard SD discrete table.
    pub fn sd_discrete() -> Self {
        ModelSchedule::Discrete(DiscreteSigmas::sd_default())
    }

    /// EDM-v with upstream's default range.
    pub fn edm_v_default() -> Self {
        ModelSchedule::EdmV {
            sigma_min: 0.002,
            sigma_max: 120.0,
        }
    }

    /// Whether this is a rectified-flow model (`is_flow_denoiser` upstream).
    pub fn is_flow(&self) -> bool {
        matches!(
            self,
            ModelSchedule::Flow { .. } | ModelSchedule::FluxFlow { .. }
        )
    }

    /// Sigma at model timestep `t` (0..=999 for discrete/flow tables).
    pub fn t_to_sigma(&self, t: f32) -> f32 {
        match self {
            ModelSchedule::Discrete(d) => d.t_to_sigma(t),
            ModelSchedule::EdmV { .. } => (t * 4.0 / TIMESTEPS as f32).exp(),
            ModelSchedule::Flow { shift } => time_snr_shift(*shift, (t + 1.0) / 1000.0),
            ModelSchedule::FluxFlow { shift } => {
                flux_time_shift(*shift, 1.0, (t + 1.0) / TIMESTEPS as f32)
            }
        }
    }

    /// Model timestep input for `sigma`.
    pub fn sigma_to_t(&self, sigma: f32) -> f32 {
        match self {
            ModelSchedule::Discrete(d) => d.sigma_to_t(sigma),
            ModelSchedule::EdmV { .. } => 0.25 * sigma.ln(),
            ModelSchedule::Flow { .. } => sigma * 1000.0,
            ModelSchedule::FluxFlow { .. } => sigma,
        }
    }

    /// Smallest sigma of the model.
    pub fn sigma_min(&self) -> f32 {
        match self {
            ModelSchedule::Discrete(d) => d.sigmas[0],
            ModelSchedule::EdmV { sigma_min, .. } => *sigma_min,
            ModelSchedule::Flow { .. } | ModelSchedule::FluxFlow { .. } => self.t_to_sigma(0.0),
        }
    }

    /// Largest sigma of the model.
    pub fn sigma_max(&self) -> f32 {
        match self {
            ModelSchedule::Discrete(d) => d.sigmas[TIMESTEPS - 1],
            ModelSchedule::EdmV { sigma_max, .. } => *sigma_max,
            ModelSchedule::Flow { .. } | ModelSchedule::FluxFlow { .. } => {
                self.t_to_sigma((TIMESTEPS - 1) as f32)
            }
        }
    }

    /// img2img strength -> starting sigma (`noise_level_to_sigma` upstream).
    pub fn noise_level_to_sigma(&self, noise_level: f32) -> f32 {
        if self.is_flow() {
            noise_level
        } else {
            noise_level / (1.0 - noise_level)
        }
    }

    /// Initial latent for sampling: `latent + noise * sigma` (k-diffusion models) or
    /// `latent * (1 - sigma) + noise * sigma` (flow models).
    pub fn noise_scaling(
        &self,
        sigma: f32,
        noise: &[f32],
        latent: &[f32],
    ) -> Result<Vec<f32>, SamplingError> {
        if noise.len() != latent.len() {
            return Err(SamplingError::LengthMismatch {
                what: "noise vs latent",
                expected: latent.len(),
                got: noise.len(),
            });
        }
        let flow = self.is_flow();
        Ok(latent
            .iter()
            .zip(noise)
            .map(|(l, n)| {
                if flow {
                    l * (1.0 - sigma) + n * sigma
                } else {
                    l + n * sigma
                }
            })
            .collect())
    }

    /// Undo the flow models' latent scaling after sampling (identity otherwise).
    pub fn inverse_noise_scaling(&self, sigma: f32, latent: Vec<f32>) -> Vec<f32> {
        if self.is_flow() {
            let k = 1.0 / (1.0 - sigma);
            latent.into_iter().map(|v| v * k).collect()
        } else {
            latent
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discrete_round_trip() {
        let d = DiscreteSigmas::sd_default();
        for t in [0.0f32, 1.5, 10.0, 500.25, 998.0, 999.0] {
            let s = d.t_to_sigma(t);
            assert!((d.sigma_to_t(s) - t).abs() < 2e-3, "t {t}");
        }
        assert!((d.sigmas()[0] - 0.029_167_158).abs() < 1e-5);
        assert!((d.sigmas()[999] - 14.614_641).abs() < 1e-3);
    }

    #[test]
    fn alphas_cumprod_validation() {
        assert!(DiscreteSigmas::from_alphas_cumprod(&[0.5; 10]).is_err());
        let mut ac = scaled_linear_alphas_cumprod(SD_LINEAR_START, SD_LINEAR_END);
        assert_eq!(
            DiscreteSigmas::from_alphas_cumprod(&ac).unwrap(),
            DiscreteSigmas::sd_default()
        );
        ac[3] = 0.0;
        assert!(DiscreteSigmas::from_alphas_cumprod(&ac).is_err());
    }

    #[test]
    fn flow_ranges() {
        let f = ModelSchedule::Flow { shift: 3.0 };
        assert!((f.sigma_max() - 1.0).abs() < 1e-6);
        assert!((f.sigma_to_t(0.5) - 500.0).abs() < 1e-4);
        let e = ModelSchedule::edm_v_default();
        assert_eq!(e.sigma_max(), 120.0);
    }
}
