//! A reference-free family's image: the first sampling pass, then the `--hires` second pass,
//! both through the family's own `sample`, so each family writes only how one pass samples.

use crate::error::Result;
use crate::rng::Rng;
use crate::sampling::{Guidance, SamplingPlan};
use crate::tensor::HostTensor;

use super::family::{ImageJob, Prepared};
use super::hires::second_pass;
use super::preview::PreviewRequest;
use super::vae::VaeStage;

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
pub fn sample_passes(
    mut job: ImageJob<'_>,
    batch: &Prepared,
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
