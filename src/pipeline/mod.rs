//! Model families: the registry ([`registry`]), what a family is ([`family`]), the
//! components and their files ([`components`]), `--model-args` ([`model_args`]), prompt
//! templates ([`prompt`]), reference-image settings ([`ref_args`]), the VAE stage every family
//! decodes through ([`vae`]), and one folder per family (condition → sample → decode). No
//! ggml calls here; models run through their runners.

pub mod components;
pub mod family;
pub mod flux;
pub mod hires;
pub mod lora;
pub mod mask;
mod memo;
pub mod minimax_h3;
pub mod model_args;
pub mod passes;
pub mod pixart;
pub mod preview;
pub mod prompt;
pub mod qwen3_vision;
pub mod qwen_image;
pub mod qwen_image_2_1;
pub mod ref_args;
pub mod registry;
pub mod resample;
pub mod sd;
pub mod sd3;
pub mod text;
pub mod vae;
pub mod wan;
pub mod z_image;

pub use components::{ComponentFiles, ComponentId, ComponentSpec, ComponentStore, ModelFiles};
pub use family::{
    BatchInputs, Defaults, Family, Generator, ImageJob, LoadContext, RefVideo, SizeRule,
};
pub use model_args::{CacheType, ModelArgs};
pub use ref_args::{RefImageArgs, RefIndexMode};

/// Checks that an image size is a non-zero multiple of the model's size `multiple`.
pub(crate) fn check_size(width: usize, height: usize, multiple: usize) -> crate::error::Result<()> {
    if width == 0
        || height == 0
        || !width.is_multiple_of(multiple)
        || !height.is_multiple_of(multiple)
    {
        return Err(crate::error::Error::Flag {
            flag: "-W/-H".into(),
            reason: format!("{width}x{height} is not a multiple of {multiple} for this model"),
        });
    }
    Ok(())
}

/// Where sampling starts: fresh noise (drawn first, as upstream, so the RNG stream does not
/// depend on the mode) scaled to the first sigma, or for img2img (`init`: the init image's
/// sampler latent and `--strength`) the tail of `sigmas` with the latent noised to its first
/// sigma. `shape` is the latent's (w, h, channels). Returns (x0, the sigmas to sample along).
pub(crate) fn start_latent(
    schedule: &crate::sampling::ModelSchedule,
    sigmas: Vec<f32>,
    noise_rng: &mut dyn crate::rng::Rng,
    shape: (usize, usize, usize),
    init: Option<(&crate::tensor::HostTensor, f32)>,
) -> crate::error::Result<(Vec<f32>, Vec<f32>)> {
    let (w, h, c) = shape;
    let noise = noise_rng.randn(w * h * c);
    let (start, sigmas) = match init {
        None => (vec![0.0; noise.len()], sigmas),
        Some((latent, strength)) => {
            if latent.ne != [w, h, c, 1] {
                return Err(crate::error::Error::Unsupported(format!(
                    "init image latent is {}x{}x{}, expected {w}x{h}x{c}",
                    latent.width(),
                    latent.height(),
                    latent.channels()
                )));
            }
            (latent.data.clone(), img2img_sigmas(&sigmas, strength))
        }
    };
    let first = *sigmas
        .first()
        .ok_or_else(|| crate::error::Error::Unsupported("the sampling schedule is empty".into()))?;
    Ok((schedule.noise_scaling(first, &noise, &start)?, sigmas))
}

/// What every family's sampling takes from its request.
pub(crate) struct SampleJob<'a> {
    pub plan: &'a crate::sampling::SamplingPlan,
    pub guidance: crate::sampling::Guidance,
    pub noise_rng: &'a mut dyn crate::rng::Rng,
    pub sampler_rng: &'a mut dyn crate::rng::Rng,
    /// img2img: the init image's sampler latent and `--strength`.
    pub init: Option<(&'a crate::tensor::HostTensor, f32)>,
    /// `--preview`: pictures of the latent while sampling.
    pub preview: Option<preview::LatentPreview<'a>>,
    /// `--mask`: the latent mask [w, h] each denoised estimate is blended with (the init
    /// latent kept where it is 0).
    pub mask: Option<&'a crate::tensor::HostTensor>,
}

/// The sampling every family shares: the start latent ([`start_latent`]), the guided denoiser
/// over `model` with a progress bar, the sampler. `shape` is the latent's (w, h, channels).
/// Returns the final latent and the number of steps run.
pub(crate) fn denoise<M: crate::sampling::GuidedModel>(
    model: M,
    prediction: crate::sampling::Prediction,
    schedule: &crate::sampling::ModelSchedule,
    job: SampleJob<'_>,
    shape: (usize, usize, usize),
) -> crate::error::Result<(Vec<f32>, usize)> {
    let sigmas = job.plan.sigmas(schedule)?;
    let (x0, sigmas) = start_latent(schedule, sigmas, job.noise_rng, shape, job.init)?;
    if let Some(m) = job.mask {
        if (m.width(), m.height()) != (shape.0, shape.1) {
            return Err(crate::error::Error::Unsupported(format!(
                "the mask is {}x{} latent pixels, the latent {}x{}",
                m.width(),
                m.height(),
                shape.0,
                shape.1
            )));
        }
    }
    let steps = sigmas.len().saturating_sub(1);
    let mut progress = crate::progress::Progress::new("sampling", steps);
    let mut preview = job.preview;
    let mut on_step = |s: crate::sampling::StepState<'_>| {
        progress.set(s.step);
        if let Some(p) = preview.as_mut() {
            let latent = if p.sink.noisy() {
                s.model_input
            } else {
                s.denoised
            };
            p.step(s.step, shape, latent);
        }
    };
    if job.plan.slg.is_some() && !crate::sampling::GuidedModel::can_skip_layers(&model) {
        log::warn!("skip-layer guidance (--slg-scale) is not supported by this model; ignored");
    }
    let mut denoiser = crate::sampling::GuidedDenoiser {
        model,
        prediction,
        schedule,
        guidance: job.guidance,
        mask: job.mask.map(|m| crate::sampling::DenoiseMask {
            mask: &m.data,
            init: job.init.map(|(latent, _)| latent.data.as_slice()),
        }),
        slg: job.plan.slg.as_ref().map(|g| (g, sigmas.len())),
        on_step: &mut on_step,
    };
    let latent = job
        .plan
        .run(schedule, &mut denoiser, x0, &sigmas, job.sampler_rng)?;
    Ok((latent, steps))
}

/// The tail of the schedule img2img samples along (upstream sd-cli's rule): with `strength`
/// s over n steps, t = min(floor(s·n), n − 1) and sampling runs the last t + 1 steps; s = 1 is
/// the whole schedule, s = 0 still runs the final step.
pub fn img2img_sigmas(sigmas: &[f32], strength: f32) -> Vec<f32> {
    let steps = sigmas.len().saturating_sub(1);
    if steps == 0 {
        return sigmas.to_vec();
    }
    let t_enc = ((strength.clamp(0.0, 1.0) * steps as f32) as usize).min(steps - 1);
    sigmas[steps - t_enc - 1..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::img2img_sigmas;

    #[test]
    fn img2img_keeps_the_schedule_tail() {
        let s = [10.0, 5.0, 2.0, 1.0, 0.0];
        assert_eq!(img2img_sigmas(&s, 1.0), s.to_vec());
        assert_eq!(img2img_sigmas(&s, 0.75), s.to_vec());
        assert_eq!(img2img_sigmas(&s, 0.5), vec![5.0, 2.0, 1.0, 0.0]);
        assert_eq!(img2img_sigmas(&s, 0.3), vec![2.0, 1.0, 0.0]);
        assert_eq!(img2img_sigmas(&s, 0.0), vec![1.0, 0.0]);
    }
}
