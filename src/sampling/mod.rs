//! The sampling layer: sigma schedules, model parameterisations, guidance and the
//! k-diffusion style samplers of stable-diffusion.cpp.
//!
//! A sampler only sees a [`Denoiser`] (x, sigma) -> denoised estimate; the model
//! parameterisation (eps / v / EDM / flow) lives behind it (see [`denoiser`]), and every
//! family's model runs behind the one [`GuidedDenoiser`] (guidance, CFG++).
//! All samplers share one signature and are reached through [`sample`].
//!
//! The pipeline's entry points: [`SamplingPlan`] (sampler + schedule + settings,
//! `sigmas()` then `run()`), [`parse_extra_sample_args`] for `--extra-sample-args` and
//! [`parse_sigmas_arg`] / [`custom_sigmas`] for `--sigmas`.

pub mod denoiser;
pub mod extra_args;
pub mod guided;
pub mod plan;
pub mod samplers;
pub mod schedules;
mod special;
mod tables;
pub mod timesteps;

use std::fmt;
use std::str::FromStr;

use crate::rng::Rng;

pub use denoiser::{CfgPpOutput, Denoiser, Prediction, Scalings};
pub use extra_args::{
    parse_extra_sample_args, split_extra_sample_args, ExtraSampleArgs, ScheduleOverrides,
};
pub use guided::{
    DenoiseMask, Guidance, GuidedDenoiser, GuidedModel, ModelCall, Needs, Predictions,
    SkipLayerGuidance, StepState,
};
pub use plan::{custom_sigmas, parse_sigmas_arg, SamplingPlan};
pub use samplers::SamplerExtraArgs;
pub use schedules::{get_sigmas, AysFamily, ScheduleKind, ScheduleOptions};
pub use timesteps::{DiscreteSigmas, ModelSchedule};

/// Errors of the sampling layer.
#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    /// `--sampling-method` value that names no sampler.
    #[error("unknown sampling method '{0}' (expected one of: {list})", list = SamplerKind::names())]
    UnknownSampler(String),
    /// `--scheduler` value that names no schedule.
    #[error("unknown scheduler '{0}' (expected one of: normal, {list})", list = schedule_names())]
    UnknownScheduler(String),
    /// `--prediction` value that names no parameterisation.
    #[error("unknown prediction type '{0}' (expected one of: eps, v, edm_v, sd3_flow, flux_flow)")]
    UnknownPrediction(String),
    /// A known sampler that this build does not implement (all are implemented now;
    /// kept for callers that gate optional samplers).
    #[error("sampling method '{0}' is not implemented yet")]
    SamplerNotImplemented(&'static str),
    /// A schedule that cannot serve this model.
    #[error("scheduler '{schedule}' cannot be used here: {reason}")]
    ScheduleUnsupported {
        /// Schedule name.
        schedule: &'static str,
        /// Why.
        reason: String,
    },
    /// A sampler needs the unconditional prediction (CFG++), which the denoiser lacks.
    #[error("sampling method '{0}' needs the unconditional prediction (CFG++), which this denoiser does not provide")]
    NeedsUncond(&'static str),
    /// Two buffers that must have the same length do not.
    #[error("{what}: expected {expected} values, got {got}")]
    LengthMismatch {
        /// Which buffers.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// A sigma list a sampler cannot use.
    #[error("invalid sigma schedule: {0}")]
    InvalidSigmas(String),
    /// A malformed model noise table.
    #[error("invalid model noise table: {0}")]
    InvalidModelTable(String),
    /// A bad `--extra-sample-args` entry.
    #[error("invalid sample argument '{key}={value}': {reason}")]
    InvalidArg {
        /// Key.
        key: String,
        /// Value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// The model evaluation failed (message from the model runner).
    #[error("denoiser failed at sigma {sigma}: {message}")]
    Denoiser {
        /// Sigma of the failed evaluation.
        sigma: f32,
        /// What went wrong.
        message: String,
    },
    /// Sampling was cancelled by the denoiser.
    #[error("sampling cancelled")]
    Cancelled,
    /// An internal invariant broke (a bug, reported instead of panicking).
    #[error("internal sampling error: {0}")]
    Internal(String),
}

fn schedule_names() -> String {
    ScheduleKind::ALL.map(|k| k.name()).join(", ")
}

/// The sampler (upstream `sample_method_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SamplerKind {
    /// `euler`
    Euler,
    /// `euler_a`
    EulerA,
    /// `heun`
    Heun,
    /// `dpm2`
    Dpm2,
    /// `dpm++2s_a`
    Dpmpp2sA,
    /// `dpm++2m`
    Dpmpp2m,
    /// `dpm++2mv2`
    Dpmpp2mV2,
    /// `ipndm`
    Ipndm,
    /// `ipndm_v`
    IpndmV,
    /// `lcm`
    Lcm,
    /// `ddim_trailing`
    DdimTrailing,
    /// `tcd`
    Tcd,
    /// `res_multistep`
    ResMultistep,
    /// `res_2s`
    Res2s,
    /// `er_sde`
    ErSde,
    /// `euler_cfg_pp`
    EulerCfgPp,
    /// `euler_a_cfg_pp`
    EulerACfgPp,
    /// `euler_ge`
    EulerGe,
    /// `dpm++2m_sde`
    Dpmpp2mSde,
    /// `dpm++2m_sde_bt`
    Dpmpp2mSdeBt,
    /// `lms`
    Lms,
}

impl SamplerKind {
    /// All samplers in upstream enum order.
    pub const ALL: [SamplerKind; 21] = [
        SamplerKind::Euler,
        SamplerKind::EulerA,
        SamplerKind::Heun,
        SamplerKind::Dpm2,
        SamplerKind::Dpmpp2sA,
        SamplerKind::Dpmpp2m,
        SamplerKind::Dpmpp2mV2,
        SamplerKind::Ipndm,
        SamplerKind::IpndmV,
        SamplerKind::Lcm,
        SamplerKind::DdimTrailing,
        SamplerKind::Tcd,
        SamplerKind::ResMultistep,
        SamplerKind::Res2s,
        SamplerKind::ErSde,
        SamplerKind::EulerCfgPp,
        SamplerKind::EulerACfgPp,
        SamplerKind::EulerGe,
        SamplerKind::Dpmpp2mSde,
        SamplerKind::Dpmpp2mSdeBt,
        SamplerKind::Lms,
    ];

    /// Upstream CLI name.
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Euler => "euler",
            SamplerKind::EulerA => "euler_a",
            SamplerKind::Heun => "heun",
            SamplerKind::Dpm2 => "dpm2",
            SamplerKind::Dpmpp2sA => "dpm++2s_a",
            SamplerKind::Dpmpp2m => "dpm++2m",
            SamplerKind::Dpmpp2mV2 => "dpm++2mv2",
            SamplerKind::Ipndm => "ipndm",
            SamplerKind::IpndmV => "ipndm_v",
            SamplerKind::Lcm => "lcm",
            SamplerKind::DdimTrailing => "ddim_trailing",
            SamplerKind::Tcd => "tcd",
            SamplerKind::ResMultistep => "res_multistep",
            SamplerKind::Res2s => "res_2s",
            SamplerKind::ErSde => "er_sde",
            SamplerKind::EulerCfgPp => "euler_cfg_pp",
            SamplerKind::EulerACfgPp => "euler_a_cfg_pp",
            SamplerKind::EulerGe => "euler_ge",
            SamplerKind::Dpmpp2mSde => "dpm++2m_sde",
            SamplerKind::Dpmpp2mSdeBt => "dpm++2m_sde_bt",
            SamplerKind::Lms => "lms",
        }
    }

    fn names() -> String {
        SamplerKind::ALL.map(|k| k.name()).join(", ")
    }

    /// The eta used when `--eta` is not given (upstream `resolve_eta`, non-HiDream).
    pub fn default_eta(self) -> f32 {
        match self {
            SamplerKind::EulerA
            | SamplerKind::Dpmpp2sA
            | SamplerKind::ErSde
            | SamplerKind::EulerACfgPp
            | SamplerKind::Dpmpp2mSde
            | SamplerKind::Dpmpp2mSdeBt => 1.0,
            _ => 0.0,
        }
    }

    /// Whether the sampler needs [`Denoiser::denoise_cfg_pp`].
    pub fn needs_uncond(self) -> bool {
        matches!(self, SamplerKind::EulerCfgPp | SamplerKind::EulerACfgPp)
    }
}

impl fmt::Display for SamplerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SamplerKind {
    type Err = SamplingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SamplerKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| SamplingError::UnknownSampler(s.to_string()))
    }
}

/// Per-run sampler settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerOptions {
    /// Noise amount for ancestral / SDE samplers (see [`SamplerKind::default_eta`]).
    pub eta: f32,
    /// The model is a rectified-flow model ([`ModelSchedule::is_flow`]); switches the
    /// ancestral step to its flow form.
    pub is_flow: bool,
    /// Sampler-specific `--extra-sample-args` values.
    pub extra: samplers::SamplerExtraArgs,
}

impl SamplerOptions {
    /// Options with the sampler's default eta.
    pub fn new(kind: SamplerKind, is_flow: bool) -> Self {
        SamplerOptions {
            eta: kind.default_eta(),
            is_flow,
            extra: samplers::SamplerExtraArgs::default(),
        }
    }
}

/// Runs sampler `kind` from `x` (already noised to `sigmas[0]`) down the `sigmas` list.
pub fn sample(
    kind: SamplerKind,
    denoiser: &mut dyn Denoiser,
    x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    use samplers as s;
    samplers::validate_sigmas(sigmas)?;
    match kind {
        SamplerKind::Euler => s::euler::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::EulerA | SamplerKind::DdimTrailing => {
            // DDIM ("trailing") is euler_a with the simple schedule upstream.
            s::euler_a::sample(denoiser, x, sigmas, rng, opts)
        }
        SamplerKind::Heun => s::heun::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Dpm2 => s::dpm2::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Dpmpp2sA => s::dpmpp_2s_a::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Dpmpp2m => s::dpmpp_2m::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Dpmpp2mV2 => s::dpmpp_2m_v2::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Ipndm => s::ipndm::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::IpndmV => s::ipndm_v::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Lcm => s::lcm::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Tcd => s::tcd::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::ResMultistep => s::res_multistep::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Res2s => s::res_2s::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::ErSde => s::er_sde::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::EulerCfgPp => s::euler_cfg_pp::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::EulerACfgPp => s::euler_a_cfg_pp::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::EulerGe => s::euler_ge::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Dpmpp2mSde => s::dpmpp_2m_sde::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Lms => s::lms::sample(denoiser, x, sigmas, rng, opts),
        SamplerKind::Dpmpp2mSdeBt => s::dpmpp_2m_sde_bt::sample(denoiser, x, sigmas, rng, opts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_names_parse() {
        for k in SamplerKind::ALL {
            assert_eq!(k.name().parse::<SamplerKind>().unwrap(), k);
        }
        let e = "dpm3".parse::<SamplerKind>().unwrap_err().to_string();
        assert!(e.contains("'dpm3'") && e.contains("euler_a"), "{e}");
        assert_eq!(SamplerKind::EulerA.default_eta(), 1.0);
        assert_eq!(SamplerKind::Euler.default_eta(), 0.0);
    }
}
