//! A reference-free family's image: the first sampling pass, then the `--hires` second pass,
//! both through the family's own `sample`, so each family writes only how one pass samples.

use crate::error::Result;
use crate::rng::Rng;
use crate::sampling::{Guidance, GuidedModel, ModelSchedule, Prediction, SamplingPlan};
use crate::tensor::HostTensor;

use super::family::{ImageJob, Prepared};
use super::hires::second_pass;
use super::preview::PreviewRequest;
use super::vae::VaeStage;
use super::{denoise, SampleJob};

/// One sampling pass (first or hires) of a family without reference images.
pub struct PassRequest<'a> {
    pub prompt: &'a str,
    pub negative_prompt: &'a str,
    pub width: usize,
    pub height: usize,
    pub guidance: Guidance,
    pub plan: &'a SamplingPlan,
    pub noise_rng: &'a mut dyn Rng,
    pub sampler_rng: &'a mut dyn Rng,
    /// img2img: the encoded init latent and the strength.
    pub init: Option<(&'a HostTensor, f32)>,
    pub preview: Option<PreviewRequest<'a>>,
    /// `--mask` at the latent size.
    pub mask: Option<&'a HostTensor>,
}

/// The job's final latent (in the VAE stage's normalised space): `sample` at the batch's size
/// (img2img from `--init-img` when there is one), then, with `--hires`, again at the larger
/// size from the enlarged first result.
pub fn sample_passes<E>(
    mut job: ImageJob<'_>,
    batch: &Prepared<E>,
    vae: &VaeStage,
    mut sample: impl FnMut(PassRequest<'_>) -> Result<HostTensor>,
) -> Result<HostTensor> {
    let hires = job.hires.take();
    let x = sample(PassRequest {
        prompt: job.prompt,
        negative_prompt: job.negative_prompt,
        width: batch.width,
        height: batch.height,
        guidance: job.guidance,
        plan: job.plan,
        noise_rng: job.noise_rng,
        sampler_rng: job.sampler_rng,
        init: batch.init.as_ref().map(|z| (z, job.strength)),
        preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
        mask: batch.denoise_mask(),
    })?;
    match hires {
        Some(h) => second_pass(vae, &x, h, job.tiling, batch.mask.as_ref(), |p| {
            sample(PassRequest {
                prompt: job.prompt,
                negative_prompt: job.negative_prompt,
                width: p.width,
                height: p.height,
                guidance: job.guidance,
                plan: p.plan,
                noise_rng: p.noise_rng,
                sampler_rng: p.sampler_rng,
                init: Some((p.init, p.strength)),
                preview: ImageJob::preview_request(job.preview.as_deref_mut(), job.tiling),
                mask: p.mask,
            })
        }),
        None => Ok(x),
    }
}

/// What one pass of a flow DiT family samples with: its VAE (and `--taesd` preview decoder),
/// prediction and schedule.
pub struct PassStage<'a> {
    pub vae: &'a VaeStage,
    pub preview_vae: Option<&'a VaeStage>,
    pub prediction: Prediction,
    pub schedule: &'a ModelSchedule,
    /// The family's name in messages ("SD3").
    pub family: &'a str,
}

/// Denoises `req` with `model` into a latent [w, h, channels] (in the VAE stage's space) and
/// returns it with the number of steps run.
pub fn denoise_pass<M: GuidedModel>(
    req: PassRequest<'_>,
    model: M,
    stage: &PassStage<'_>,
    lat: (usize, usize, usize),
) -> Result<(HostTensor, usize)> {
    let job = SampleJob {
        plan: req.plan,
        guidance: req.guidance,
        noise_rng: req.noise_rng,
        sampler_rng: req.sampler_rng,
        init: req.init,
        preview: req
            .preview
            .map(|p| p.with_decoders(None, stage.vae, stage.preview_vae)),
        mask: req.mask,
    };
    if let Some(p) = &job.preview {
        p.check(stage.family);
    }
    let (latent, steps) = denoise(model, stage.prediction, stage.schedule, job, lat)?;
    Ok((HostTensor::image(lat.0, lat.1, lat.2, latent)?, steps))
}
