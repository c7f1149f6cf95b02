//! Wan 2.2 A14B's two experts (`--high-noise-diffusion-model`): the high-noise transformer
//! samples the first steps with its own guidance and sampler, the low-noise one (the
//! `--diffusion-model`) the rest, continuing from the expert's latent without new noise.
//!
//! As upstream's `generate_video`: with `--high-noise-steps` n the schedule has steps + n
//! steps and the expert runs the first n; otherwise the schedule has `--steps` steps and the
//! expert runs those before the first sigma below `--moe-boundary` (diffusers: steps with
//! `t ≥ boundary_ratio · 1000` on `transformer`, the rest on `transformer_2`, the same split).

use crate::error::Result;
use crate::pipeline::family::HighNoiseJob;
use crate::pipeline::{start_latent, SampleJob};
use crate::progress::Progress;
use crate::sampling::{GuidedDenoiser, GuidedModel, ModelSchedule, Prediction, StepState};

/// How many of `sigmas`' steps the expert runs.
pub fn expert_steps(sigmas: &[f32], job: &HighNoiseJob<'_>) -> usize {
    let steps = sigmas.len().saturating_sub(1);
    match job.steps {
        Some(n) => n.min(steps),
        None => sigmas
            .iter()
            .position(|&s| s < job.boundary)
            // No sigma below the boundary: upstream leaves the expert out.
            .unwrap_or(0)
            .min(steps),
    }
}

/// Samples with the expert (`high`) then the main model (`low`); returns the final latent
/// and the steps run. Previews and `--mask` are not offered here (the caller refuses them).
pub fn denoise_two_experts<H: GuidedModel, L: GuidedModel>(
    high: H,
    low: L,
    prediction: Prediction,
    schedule: &ModelSchedule,
    job: SampleJob<'_>,
    expert: &HighNoiseJob<'_>,
    shape: (usize, usize, usize),
) -> Result<(Vec<f32>, usize)> {
    let mut plan = job.plan.clone();
    if let Some(n) = expert.steps {
        plan.steps += n;
    }
    let sigmas = plan.sigmas(schedule)?;
    let (x0, sigmas) = start_latent(schedule, sigmas, job.noise_rng, shape, job.init)?;
    let steps = sigmas.len().saturating_sub(1);
    let k = expert_steps(&sigmas, expert);
    log::debug!("wan: high-noise expert runs {k} of {steps} steps");
    let mut progress = Progress::new("sampling", steps);
    let mut x = x0;
    if k > 0 {
        let mut on_step = |s: StepState<'_>| progress.set(s.step);
        let mut denoiser = GuidedDenoiser {
            model: high,
            prediction,
            schedule,
            guidance: expert.guidance,
            mask: None,
            slg: None,
            on_step: &mut on_step,
        };
        x = expert
            .plan
            .run(schedule, &mut denoiser, x, &sigmas[..=k], job.sampler_rng)?;
    }
    if k < steps {
        let mut on_step = |s: StepState<'_>| progress.set(k + s.step);
        let mut denoiser = GuidedDenoiser {
            model: low,
            prediction,
            schedule,
            guidance: job.guidance,
            mask: None,
            slg: plan.slg.as_ref().map(|g| (g, sigmas.len())),
            on_step: &mut on_step,
        };
        x = plan.run(schedule, &mut denoiser, x, &sigmas[k..], job.sampler_rng)?;
    }
    Ok((x, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{Guidance, SamplerKind, SamplingPlan, ScheduleKind};

    #[test]
    fn expert_steps_follow_the_boundary_or_the_count() {
        let plan = SamplingPlan::new(SamplerKind::Euler, ScheduleKind::Discrete, 4);
        let mut job = HighNoiseJob {
            plan: &plan,
            guidance: Guidance {
                scale: 4.0,
                img_scale: 4.0,
                distilled: 3.5,
            },
            boundary: 0.875,
            steps: None,
        };
        let sigmas = [1.0, 0.9375, 0.8333, 0.625, 0.0];
        assert_eq!(expert_steps(&sigmas, &job), 2);
        job.boundary = 0.95;
        assert_eq!(expert_steps(&sigmas, &job), 1);
        job.boundary = 1.5;
        assert_eq!(expert_steps(&sigmas, &job), 0);
        job.boundary = 0.0;
        assert_eq!(expert_steps(&sigmas, &job), 0);
        job.steps = Some(3);
        assert_eq!(expert_steps(&sigmas, &job), 3);
        job.steps = Some(9);
        assert_eq!(expert_steps(&sigmas, &job), 4);
    }
}
