//! Turns the sampling flags into validated sampling types before any model is loaded, so a
//! misspelled `--sampling-method` fails in milliseconds with the flag named.

use crate::cli::RunConfig;
use crate::error::{Error, Result};
use crate::rng::RngKind;
use crate::sampling::{
    custom_sigmas, parse_extra_sample_args, ExtraSampleArgs, SamplerKind, SamplingPlan,
    ScheduleKind, ScheduleOptions,
};

#[derive(Debug)]
pub struct SamplingSetup {
    /// `--sampling-method`, when given (else the model family's default).
    pub sampler: Option<SamplerKind>,
    /// `--scheduler`, when given.
    pub schedule: Option<ScheduleKind>,
    pub steps: usize,
    pub eta: Option<f32>,
    /// `--rng`: initial noise.
    pub rng: RngKind,
    /// `--sampler-rng`: ancestral/SDE noise (defaults to `--rng`).
    pub sampler_rng: RngKind,
    pub extra: ExtraSampleArgs,
    pub sigmas: Option<Vec<f32>>,
}

fn flag_err(flag: &str, e: impl std::fmt::Display) -> Error {
    Error::Flag {
        flag: flag.to_string(),
        reason: e.to_string(),
    }
}

impl SamplingSetup {
    pub fn resolve(cfg: &RunConfig) -> Result<Self> {
        let s = &cfg.sampling;
        let sampler = s
            .sampling_method
            .as_deref()
            .map(str::parse::<SamplerKind>)
            .transpose()
            .map_err(|e| flag_err("--sampling-method", e))?;
        let schedule = s
            .scheduler
            .as_deref()
            .map(str::parse::<ScheduleKind>)
            .transpose()
            .map_err(|e| flag_err("--scheduler", e))?;
        let rng: RngKind = s.rng.parse().map_err(|e| flag_err("--rng", e))?;
        let sampler_rng = match &s.sampler_rng {
            Some(name) => name.parse().map_err(|e| flag_err("--sampler-rng", e))?,
            None => rng,
        };
        let extra = parse_extra_sample_args(&s.extra_sample_args)
            .map_err(|e| flag_err("--extra-sample-args", e))?;
        for key in &extra.unknown {
            log::warn!("--extra-sample-args: unknown key '{key}' ignored");
        }
        let sigmas = s
            .sigmas
            .as_deref()
            .map(custom_sigmas)
            .transpose()
            .map_err(|e| flag_err("--sigmas", e))?;
        if s.steps == 0 && sigmas.is_none() {
            return Err(flag_err("--steps", "must be at least 1"));
        }
        Ok(Self {
            sampler,
            schedule,
            steps: s.steps as usize,
            eta: s.eta,
            rng,
            sampler_rng,
            extra,
            sigmas,
        })
    }

    /// The plan for a model whose defaults are `sampler` and `schedule`.
    pub fn plan(
        &self,
        default_sampler: SamplerKind,
        default_schedule: ScheduleKind,
    ) -> SamplingPlan {
        self.plan_with_options(
            default_sampler,
            default_schedule,
            ScheduleOptions::default(),
        )
    }

    /// Like [`Self::plan`], starting from the model's schedule presets `options` (e.g. Qwen
    /// Image 2.1's flux parameters); `--extra-sample-args` still override them.
    pub fn plan_with_options(
        &self,
        default_sampler: SamplerKind,
        default_schedule: ScheduleKind,
        options: ScheduleOptions,
    ) -> SamplingPlan {
        let mut plan = SamplingPlan::new(
            self.sampler.unwrap_or(default_sampler),
            self.schedule.unwrap_or(default_schedule),
            self.steps,
        );
        plan.schedule_opts = options;
        plan.eta = self.eta;
        plan.custom_sigmas = self.sigmas.clone();
        plan.apply_extra_args(&self.extra);
        plan
    }
}
