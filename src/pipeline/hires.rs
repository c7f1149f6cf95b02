//! The hires fix (`--hires`): generate at the requested size, upscale the result (its latent,
//! or its decoded image with a filter or an ESRGAN model), then sample again as img2img at the
//! larger size with the hires steps and denoising strength (upstream sd-cli's
//! `generate_image`, whose rules follow sd-webui).
//!
//! Upstream's rules kept here: the second pass samples `floor(steps / strength)` scheduler
//! steps and keeps the tail img2img keeps ([`super::img2img_sigmas`]), so it runs about
//! `steps` steps; `--hires-sigmas` replace that schedule; both RNGs restart from the image's
//! seed; the prompt's conditioning is the first pass's (SDXL's size conditioning included);
//! a `--mask` is carried to the new size by nearest-maximum.

use crate::error::{Error, Result};
use crate::models::vae::tiling::TileSettings;
use crate::rng::Rng;
use crate::sampling::SamplingPlan;
use crate::tensor::HostTensor;

use super::mask::InpaintMask;
use super::resample::{resize, Resample};
use super::vae::VaeStage;

/// An image-space upscaler the hires fix can call (ESRGAN: the app's `--hires-upscaler`
/// model).
pub trait ImageUpscaler {
    /// Upscales an image [W, H, 3] in [0, 1].
    fn upscale_image(&self, image: &HostTensor) -> Result<HostTensor>;
}

/// How the first pass's result is enlarged.
#[derive(Clone, Copy)]
pub enum HiresUpscaler<'a> {
    /// The latent itself ("Latent", "Latent (nearest)", ...).
    Latent(Resample),
    /// The decoded image with a filter ("Lanczos", "Nearest"), clamped and encoded again.
    Image(Resample),
    /// The decoded image through an upscaling model, resized (nearest) to the target if its
    /// scale does not land there, encoded again.
    Model(&'a dyn ImageUpscaler),
}

impl HiresUpscaler<'_> {
    /// Whether the VAE's encoder is needed.
    pub fn needs_encoder(&self) -> bool {
        !matches!(self, HiresUpscaler::Latent(_))
    }
}

/// The second pass of one image.
pub struct HiresJob<'a> {
    /// Target size (a multiple of the model's size rule).
    pub width: usize,
    pub height: usize,
    pub upscaler: HiresUpscaler<'a>,
    /// The second pass's schedule: [`hires_plan`].
    pub plan: SamplingPlan,
    /// `--hires-denoising-strength`.
    pub strength: f32,
    /// Fresh generators seeded like the first pass's.
    pub noise_rng: Box<dyn Rng>,
    pub sampler_rng: Box<dyn Rng>,
}

/// What a family samples in the second pass.
pub struct HiresPass<'a> {
    pub width: usize,
    pub height: usize,
    /// The upscaled latent in the sampler's space, [w, h, C].
    pub init: &'a HostTensor,
    pub strength: f32,
    pub plan: &'a SamplingPlan,
    pub noise_rng: &'a mut dyn Rng,
    pub sampler_rng: &'a mut dyn Rng,
    /// `--mask` at the new latent size.
    pub mask: Option<&'a HostTensor>,
}

/// The second pass's plan from the first's: `steps` (0: the first pass's) become
/// `floor(steps / strength)` scheduler steps, or `sigmas` replace the schedule.
pub fn hires_plan(
    base: &SamplingPlan,
    steps: usize,
    strength: f32,
    sigmas: Option<Vec<f32>>,
) -> SamplingPlan {
    let mut plan = base.clone();
    let effective = if steps > 0 { steps } else { base.steps }.max(1);
    plan.steps = ((effective as f32 / strength) as usize).max(1);
    plan.custom_sigmas = sigmas;
    plan
}

/// The strength the second pass trims its schedule with: custom sigmas run whole.
pub fn pass_strength(job: &HiresJob<'_>) -> f32 {
    if job.plan.custom_sigmas.is_some() {
        1.0
    } else {
        job.strength
    }
}

/// Upscales the first pass's latent `z` (in the sampler's space, [w, h, C]) as `job` says and
/// runs `sample` on it; returns what `sample` returns.
pub fn second_pass(
    vae: &VaeStage,
    z: &HostTensor,
    mut job: HiresJob<'_>,
    tiling: Option<&TileSettings>,
    mask: Option<&InpaintMask>,
    sample: impl FnOnce(HiresPass<'_>) -> Result<HostTensor>,
) -> Result<HostTensor> {
    let f = vae.scale_factor();
    let (lw, lh) = (job.width / f, job.height / f);
    if lw == 0 || lh == 0 {
        return Err(Error::Flag {
            flag: "--hires-width/--hires-height".into(),
            reason: format!(
                "{}x{} is smaller than one latent pixel",
                job.width, job.height
            ),
        });
    }
    log::info!(
        "hires fix: {}x{} -> {}x{}",
        z.width() * f,
        z.height() * f,
        job.width,
        job.height
    );
    let init = match job.upscaler {
        HiresUpscaler::Latent(mode) => resize(z, lw, lh, mode),
        HiresUpscaler::Image(mode) => {
            let image = vae.decode(z, tiling)?;
            let up = resize(&image, job.width, job.height, mode).map(|v| v.clamp(0.0, 1.0));
            vae.encode(&up.map(|v| v * 2.0 - 1.0), tiling)?
        }
        HiresUpscaler::Model(model) => {
            let image = vae.decode(z, tiling)?;
            let mut up = model.upscale_image(&image)?;
            if (up.width(), up.height()) != (job.width, job.height) {
                up = resize(&up, job.width, job.height, Resample::Nearest);
            }
            vae.encode(&up.map(|v| v * 2.0 - 1.0), tiling)?
        }
    };
    let mask = mask.map(|m| resize(&m.latent, lw, lh, Resample::NearestMax));
    let strength = pass_strength(&job);
    sample(HiresPass {
        width: job.width,
        height: job.height,
        init: &init,
        strength,
        plan: &job.plan,
        noise_rng: job.noise_rng.as_mut(),
        sampler_rng: job.sampler_rng.as_mut(),
        mask: mask.as_ref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{SamplerKind, ScheduleKind};

    #[test]
    fn second_pass_schedules_steps_over_strength() {
        let base = SamplingPlan::new(SamplerKind::Euler, ScheduleKind::Discrete, 20);
        assert_eq!(hires_plan(&base, 0, 0.7, None).steps, 28);
        assert_eq!(hires_plan(&base, 10, 0.5, None).steps, 20);
        assert_eq!(hires_plan(&base, 3, 1.0, None).steps, 3);
        let custom = hires_plan(&base, 0, 0.7, Some(vec![2.0, 1.0, 0.0]));
        assert_eq!(custom.custom_sigmas, Some(vec![2.0, 1.0, 0.0]));
    }
}
