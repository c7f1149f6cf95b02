//! What the pipeline calls: a [`SamplingPlan`] (sampler + schedule + settings) and the
//! `--sigmas` custom schedule.
//!
//! Upstream takes `--sigmas` as given (it neither appends a final 0 nor checks the
//! order); the step count becomes `len - 1`. We keep the list as given too — a last
//! sigma above 0 leaves that much noise in the result, as upstream — but reject lists a
//! sampler cannot walk: fewer than 2 values, non-finite or negative values, or a value
//! larger than the one before it.

use super::extra_args::ExtraSampleArgs;
use super::samplers::{validate_sigmas, SamplerExtraArgs};
use super::schedules::{get_sigmas, ScheduleKind, ScheduleOptions};
use super::{sample, Denoiser, ModelSchedule, SamplerKind, SamplerOptions, SamplingError};
use crate::rng::Rng;

/// Parses a `--sigmas` value: comma-separated floats, optionally in `[...]`
/// (e.g. `"[14.61, 7.8, 3.5, 0.0]"`), then checks it with [`custom_sigmas`].
pub fn parse_sigmas_arg(text: &str) -> Result<Vec<f32>, SamplingError> {
    let t = text.trim();
    let t = t.strip_prefix('[').unwrap_or(t);
    let t = t.strip_suffix(']').unwrap_or(t);
    let mut list = vec![];
    for item in t.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let v = item.parse::<f32>().map_err(|_| {
            SamplingError::InvalidSigmas(format!("--sigmas: '{item}' is not a number"))
        })?;
        list.push(v);
    }
    custom_sigmas(&list)
}

/// Validates a custom sigma list (`--sigmas`): at least 2 values, all finite and >= 0,
/// non-increasing. Returned unchanged (upstream does not append a final 0).
pub fn custom_sigmas(list: &[f32]) -> Result<Vec<f32>, SamplingError> {
    let err = |m: String| Err(SamplingError::InvalidSigmas(format!("--sigmas: {m}")));
    if list.len() < 2 {
        return err(format!(
            "need at least 2 values (one step), got {}",
            list.len()
        ));
    }
    for (i, &s) in list.iter().enumerate() {
        if !s.is_finite() || s < 0.0 {
            return err(format!("value #{} ({s}) must be finite and >= 0", i + 1));
        }
        if i > 0 && s > list[i - 1] {
            return err(format!(
                "value #{} ({s}) is larger than the one before it ({}); sigmas must not increase",
                i + 1,
                list[i - 1]
            ));
        }
    }
    Ok(list.to_vec())
}

/// Everything needed to turn a noised latent into a denoised one.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingPlan {
    /// `--sampling-method`.
    pub sampler: SamplerKind,
    /// `--scheduler`.
    pub schedule: ScheduleKind,
    /// `--steps` (ignored when `custom_sigmas` is set).
    pub steps: usize,
    /// `--eta`; `None` takes [`SamplerKind::default_eta`].
    pub eta: Option<f32>,
    /// Schedule inputs (token count, AYS family, model presets, overrides).
    pub schedule_opts: ScheduleOptions,
    /// Sampler `--extra-sample-args`.
    pub sampler_args: SamplerExtraArgs,
    /// `--sigmas`, already checked by [`custom_sigmas`]; replaces the schedule.
    pub custom_sigmas: Option<Vec<f32>>,
    /// Skip-layer guidance (`--slg-scale` with `--skip-layers`), for models that can skip.
    pub slg: Option<super::SkipLayerGuidance>,
}

impl SamplingPlan {
    /// A plan with default options.
    pub fn new(sampler: SamplerKind, schedule: ScheduleKind, steps: usize) -> Self {
        SamplingPlan {
            sampler,
            schedule,
            steps,
            eta: None,
            schedule_opts: ScheduleOptions::default(),
            sampler_args: SamplerExtraArgs::default(),
            custom_sigmas: None,
            slg: None,
        }
    }

    /// Applies parsed `--extra-sample-args` (call after setting the model's
    /// `schedule_opts`, so the overrides win over model presets).
    pub fn apply_extra_args(&mut self, args: &ExtraSampleArgs) {
        args.schedule.apply_to(&mut self.schedule_opts);
        self.sampler_args = args.sampler.clone();
    }

    /// The eta in effect.
    pub fn eta(&self) -> f32 {
        self.eta.unwrap_or_else(|| self.sampler.default_eta())
    }

    /// The full sigma list (`--sigmas` if given, else the schedule for `steps`).
    pub fn sigmas(&self, model: &ModelSchedule) -> Result<Vec<f32>, SamplingError> {
        if let Some(list) = &self.custom_sigmas {
            return custom_sigmas(list);
        }
        if self.steps == 0 {
            return Err(SamplingError::InvalidSigmas(
                "--steps must be at least 1".into(),
            ));
        }
        let sigmas = get_sigmas(self.schedule, self.steps, model, &self.schedule_opts)?;
        validate_sigmas(&sigmas)?;
        if sigmas.len() < 2 {
            return Err(SamplingError::InvalidSigmas(format!(
                "scheduler '{}' gave {} sigmas for {} steps",
                self.schedule,
                sigmas.len(),
                self.steps
            )));
        }
        Ok(sigmas)
    }

    /// Sampler options for `model`.
    pub fn sampler_options(&self, model: &ModelSchedule) -> SamplerOptions {
        SamplerOptions {
            eta: self.eta(),
            is_flow: model.is_flow(),
            extra: self.sampler_args.clone(),
        }
    }

    /// Runs the sampler from `x` (noised to `sigmas[0]`) along `sigmas`: pass
    /// [`Self::sigmas`], or its tail for img2img.
    pub fn run(
        &self,
        model: &ModelSchedule,
        denoiser: &mut dyn Denoiser,
        x: Vec<f32>,
        sigmas: &[f32],
        rng: &mut dyn Rng,
    ) -> Result<Vec<f32>, SamplingError> {
        sample(
            self.sampler,
            denoiser,
            x,
            sigmas,
            rng,
            &self.sampler_options(model),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmas_arg_parsing() {
        assert_eq!(
            parse_sigmas_arg("[14.61, 7.8,3.5 , 0.0]").unwrap(),
            vec![14.61, 7.8, 3.5, 0.0]
        );
        // Kept as given: no 0 appended (upstream behaviour).
        assert_eq!(parse_sigmas_arg("1.0,0.5").unwrap(), vec![1.0, 0.5]);
        assert_eq!(parse_sigmas_arg("2,2,0").unwrap(), vec![2.0, 2.0, 0.0]);
        for (text, want) in [
            ("1.0", "at least 2"),
            ("", "at least 2"),
            ("1.0,x,0", "'x'"),
            ("1.0,2.0,0", "#2 (2)"),
            ("1.0,-0.5", "#2 (-0.5)"),
            ("inf,0", "#1 (inf)"),
            ("1,NaN", "#2 (NaN)"),
        ] {
            let e = parse_sigmas_arg(text).unwrap_err().to_string();
            assert!(e.contains("--sigmas") && e.contains(want), "{text}: {e}");
        }
    }
}
