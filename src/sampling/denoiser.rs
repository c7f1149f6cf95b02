//! The denoiser seen by samplers, and model parameterisations that build one.
//!
//! k-diffusion convention: `denoise(x, sigma)` returns the estimate of the clean
//! latent. A raw model output becomes that estimate through the scalings
//! `model_in = x * c_in`, `denoised = out * c_out + x * c_skip` (upstream
//! `get_scalings`), and the model's timestep input comes from
//! [`ModelSchedule::sigma_to_t`].

use std::fmt;
use std::str::FromStr;

use super::timesteps::ModelSchedule;
use super::SamplingError;

/// Output of a CFG++ evaluation: the guided estimate and the unconditional one.
#[derive(Debug, Clone, PartialEq)]
pub struct CfgPpOutput {
    /// Guided denoised estimate.
    pub denoised: Vec<f32>,
    /// Unconditional denoised estimate.
    pub uncond_denoised: Vec<f32>,
}

/// (x, sigma) -> denoised latent. Implemented by the model runner (with guidance
/// applied) and by test doubles.
pub trait Denoiser {
    /// Denoised estimate of `x` at noise level `sigma`. `step` is the 1-based sampling
    /// step the evaluation belongs to (samplers that evaluate twice per step pass the
    /// same number both times).
    fn denoise(&mut self, x: &[f32], sigma: f32, step: usize) -> Result<Vec<f32>, SamplingError>;

    /// Guided and unconditional estimates, for the CFG++ samplers. The default says
    /// this denoiser cannot provide them.
    fn denoise_cfg_pp(
        &mut self,
        _x: &[f32],
        _sigma: f32,
        _step: usize,
    ) -> Result<CfgPpOutput, SamplingError> {
        Err(SamplingError::NeedsUncond("euler_cfg_pp / euler_a_cfg_pp"))
    }
}

/// `c_skip`, `c_out`, `c_in` of a parameterisation at one sigma.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scalings {
    /// Weight of the input in the denoised estimate.
    pub c_skip: f32,
    /// Weight of the model output in the denoised estimate.
    pub c_out: f32,
    /// Input scaling applied before the model.
    pub c_in: f32,
}

/// What the network predicts (upstream `prediction_t`, subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prediction {
    /// `eps`: noise prediction (SD1/SD2-base/SDXL).
    Eps,
    /// `v`: v-prediction on the discrete table (SD2-v).
    V,
    /// `edm_v`: v-prediction with EDM sigmas.
    EdmV,
    /// `sd3_flow`: rectified flow, velocity output (SD3, Wan, Qwen Image...).
    Sd3Flow,
    /// `flux_flow`: rectified flow with the Flux time shift.
    FluxFlow,
}

impl Prediction {
    /// Upstream name.
    pub fn name(self) -> &'static str {
        match self {
            Prediction::Eps => "eps",
            Prediction::V => "v",
            Prediction::EdmV => "edm_v",
            Prediction::Sd3Flow => "sd3_flow",
            Prediction::FluxFlow => "flux_flow",
        }
    }

    /// Scalings at `sigma` (sigma_data = 1).
    pub fn scalings(self, sigma: f32) -> Scalings {
        let norm = (sigma * sigma + 1.0).sqrt();
        match self {
            Prediction::Eps => Scalings {
                c_skip: 1.0,
                c_out: -sigma,
                c_in: 1.0 / norm,
            },
            Prediction::V | Prediction::EdmV => Scalings {
                c_skip: 1.0 / (sigma * sigma + 1.0),
                c_out: -sigma / norm,
                c_in: 1.0 / norm,
            },
            Prediction::Sd3Flow | Prediction::FluxFlow => Scalings {
                c_skip: 1.0,
                c_out: -sigma,
                c_in: 1.0,
            },
        }
    }

    /// The model's noise table for this prediction type (`flow_shift` for flow models).
    pub fn default_schedule(self, flow_shift: f32) -> ModelSchedule {
        match self {
            Prediction::Eps | Prediction::V => ModelSchedule::sd_discrete(),
            Prediction::EdmV => ModelSchedule::edm_v_default(),
            Prediction::Sd3Flow => ModelSchedule::Flow { shift: flow_shift },
            Prediction::FluxFlow => ModelSchedule::FluxFlow { shift: flow_shift },
        }
    }

    /// Scaled model input `x * c_in`.
    pub fn model_input(self, x: &[f32], sigma: f32) -> Vec<f32> {
        let c_in = self.scalings(sigma).c_in;
        x.iter().map(|v| v * c_in).collect()
    }

    /// Denoised estimate from a raw model output: `out * c_out + x * c_skip`.
    pub fn to_denoised(
        self,
        model_out: &[f32],
        x: &[f32],
        sigma: f32,
    ) -> Result<Vec<f32>, SamplingError> {
        if model_out.len() != x.len() {
            return Err(SamplingError::LengthMismatch {
                what: "model output vs latent",
                expected: x.len(),
                got: model_out.len(),
            });
        }
        let s = self.scalings(sigma);
        Ok(model_out
            .iter()
            .zip(x)
            .map(|(o, xi)| o * s.c_out + xi * s.c_skip)
            .collect())
    }
}

impl fmt::Display for Prediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Prediction {
    type Err = SamplingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Prediction::Eps,
            Prediction::V,
            Prediction::EdmV,
            Prediction::Sd3Flow,
            Prediction::FluxFlow,
        ]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| SamplingError::UnknownPrediction(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_round_trip() {
        // With x = x0 + sigma * eps and a perfect eps model, denoised == x0.
        let (x0, eps, sigma) = (0.3f32, -1.2f32, 2.5f32);
        let x = [x0 + sigma * eps];
        let d = Prediction::Eps.to_denoised(&[eps], &x, sigma).unwrap();
        assert!((d[0] - x0).abs() < 1e-6);
    }

    #[test]
    fn v_round_trip() {
        // v = alpha * eps - sigma_t * x0 in the VP frame; the k-diffusion x is VP x / alpha.
        let (x0, eps, sigma) = (0.7f32, 0.4f32, 1.3f32);
        let alpha = 1.0 / (sigma * sigma + 1.0).sqrt();
        let v = alpha * eps - (sigma * alpha) * x0;
        let x = [x0 + sigma * eps];
        let d = Prediction::V.to_denoised(&[v], &x, sigma).unwrap();
        assert!((d[0] - x0).abs() < 1e-5, "{}", d[0]);
    }

    #[test]
    fn flow_round_trip() {
        // x = (1 - s) x0 + s * noise, velocity = noise - x0.
        let (x0, n, s) = (0.2f32, -0.9f32, 0.6f32);
        let x = [(1.0 - s) * x0 + s * n];
        let d = Prediction::Sd3Flow.to_denoised(&[n - x0], &x, s).unwrap();
        assert!((d[0] - x0).abs() < 1e-6);
        assert_eq!(
            "flux_flow".parse::<Prediction>().unwrap(),
            Prediction::FluxFlow
        );
        assert!("x0".parse::<Prediction>().is_err());
    }
}
