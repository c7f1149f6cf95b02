//! Any [`Vae`] on its runner, with the family's latent normalisation: decode and encode on
//! host tensors, spatially tiled when asked, decode retried with smaller tiles when it does not
//! fit in memory (`models::vae::tiling`). Every family decodes and encodes through this.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::image_io::{resize_bilinear, Image};
use crate::models::vae::autoencoder_kl::{AutoencoderKl, AutoencoderKlConfig};
use crate::models::vae::qwen_image_2_1_vae::LatentStats;
use crate::models::vae::taesd::Taesd;
use crate::models::vae::tiling::{
    decode_with_retry, plan_tiles, tiled_decode, tiled_encode, tiled_video_decode, TileSettings,
};
use crate::models::vae::Vae;
use crate::progress::Progress;
use crate::runner::{Loaded, Runner, RunnerError, StoreSource};

use super::components::{ComponentFiles, ComponentId, ComponentStore};
use super::family::LoadContext;
use crate::tensor::HostTensor;

/// How the sampler's latent relates to the VAE's own.
#[derive(Clone, Debug, PartialEq)]
pub enum LatentNorm {
    /// VAE latent = latent / scale + shift (SD and SDXL: shift 0; FLUX `ae`: 0.3611, 0.1159).
    Scale { scale: f32, shift: f32 },
    /// VAE latent = latent · std + mean, per channel (Wan-style VAEs).
    Stats(LatentStats),
}

impl LatentNorm {
    /// Sampler latent → VAE latent.
    pub fn to_vae(&self, x: &HostTensor) -> Result<HostTensor> {
        match self {
            LatentNorm::Scale { scale, shift } => Ok(x.clone().map(|v| v / scale + shift)),
            LatentNorm::Stats(stats) => {
                let mut z = x.clone();
                stats.denormalize(&mut z)?;
                Ok(z)
            }
        }
    }

    /// VAE latent → sampler latent.
    pub fn from_vae(&self, z: &HostTensor) -> Result<HostTensor> {
        match self {
            LatentNorm::Scale { scale, shift } => Ok(z.clone().map(|v| (v - shift) * scale)),
            LatentNorm::Stats(stats) => {
                let mut x = z.clone();
                stats.normalize(&mut x)?;
                Ok(x)
            }
        }
    }
}

/// An AutoencoderKL from its component store, with its encoder only when the run encodes
/// images (init images, references, image-space hires upscaling). Convolutions keep the
/// file's float type (`--type` does not apply).
pub fn load_autoencoder_kl(
    files: &ComponentStore,
    ctx: &LoadContext<'_>,
) -> Result<Loaded<AutoencoderKl>> {
    let need_encoder = ctx.needs.encoder;
    let src = StoreSource::new(&files.store, ComponentId::Vae.prefix());
    let opts = ctx.load_options(ComponentId::Vae, false)?;
    Runner::load("vae", &src, opts, |wb| -> Result<AutoencoderKl> {
        let mut config = AutoencoderKlConfig::detect(wb)?;
        if need_encoder && !config.encoder {
            return Err(Error::Unsupported(
                "--init-img needs a VAE with an encoder, but the VAE file has only a decoder"
                    .into(),
            ));
        }
        config.encoder = need_encoder;
        Ok(AutoencoderKl::new(wb, config)?)
    })
}

/// TAESD / TAESDXL / TAEF1 (`--taesd`), when its file was given: it reads the sampler's
/// latents as they are (their channel count comes from the weights).
pub fn load_taesd(files: &ComponentFiles, ctx: &LoadContext<'_>) -> Result<Option<VaeStage>> {
    let Some(tae) = files.get(ComponentId::Taesd).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let need_encoder = ctx.needs.encoder;
    let src = StoreSource::new(&tae.store, ComponentId::Taesd.prefix());
    let opts = ctx.load_options(ComponentId::Taesd, false)?;
    let tae = Runner::load("taesd", &src, opts, |wb| -> Result<Taesd> {
        Ok(Taesd::new(wb, need_encoder)?)
    })?;
    Ok(Some(VaeStage::new(
        tae,
        LatentNorm::Scale {
            scale: 1.0,
            shift: 0.0,
        },
    )))
}

/// The final decoder and the preview decoder of a family with an AutoencoderKL: TAESD
/// (`--taesd`) decodes instead of the VAE, or with `--taesd-preview-only` draws only the
/// previews; otherwise the VAE (latent normalisation `norm`) decodes, and `missing` is the
/// error when no VAE file was given.
pub fn load_decoders(
    files: &ComponentFiles,
    ctx: &LoadContext<'_>,
    norm: LatentNorm,
    missing: &str,
) -> Result<(VaeStage, Option<VaeStage>)> {
    let vae = || -> Result<VaeStage> {
        let f = files
            .get(ComponentId::Vae)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::Unsupported(missing.to_string()))?;
        Ok(VaeStage::new(load_autoencoder_kl(f, ctx)?, norm.clone()))
    };
    Ok(match load_taesd(files, ctx)? {
        Some(tae) if ctx.taesd_preview_only => (vae()?, Some(tae)),
        Some(tae) => (tae, None),
        None => (vae()?, None),
    })
}

/// A loaded VAE and its latent normalisation.
pub struct VaeStage {
    vae: Box<dyn Vae>,
    runner: Runner,
    pub norm: LatentNorm,
}

impl VaeStage {
    pub fn new<V: Vae + 'static>(loaded: Loaded<V>, norm: LatentNorm) -> Self {
        Self {
            vae: Box::new(loaded.model),
            runner: loaded.runner,
            norm,
        }
    }

    pub fn scale_factor(&self) -> usize {
        self.vae.scale_factor()
    }

    pub fn has_encoder(&self) -> bool {
        self.vae.has_encoder()
    }

    /// Image channels the encoder takes.
    pub fn image_channels(&self) -> usize {
        self.vae.image_channels()
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// Decodes a video latent [w, h, T, C] in the VAE's space to frames [W, H, F, C_out] in
    /// [−1, 1] (video VAEs only). With `tiling`, the clip is cut into spatial tiles, each decoded
    /// over all its frames and blended as image tiles are (upstream tiles video the same way);
    /// an allocation failure is retried with smaller tiles, as for images. Time needs no
    /// tiling: the video VAEs already decode one latent frame per graph.
    pub fn decode_video(
        &self,
        z: &HostTensor,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        let whole = |z: &HostTensor| -> Result<HostTensor> {
            match self.vae.decode_video(&self.runner, z) {
                Some(r) => Ok(r?),
                None => Err(Error::Unsupported(
                    "this VAE decodes single images only".into(),
                )),
            }
        };
        tiled_video_decode(
            z,
            self.scale_factor(),
            tiling,
            whole,
            |e: &Error| matches!(e, Error::Runner(r) if r.is_alloc_failure()),
        )
    }

    /// Encodes frames [W, H, F, C_in] in [−1, 1] to the posterior mean [w, h, T, C] in the
    /// VAE's space (video VAEs with an encoder only).
    pub fn encode_video(&self, frames: &HostTensor) -> Result<HostTensor> {
        if !self.vae.has_encoder() {
            return Err(Error::Unsupported(
                "the VAE was loaded without its encoder".into(),
            ));
        }
        match self.vae.encode_video(&self.runner, frames) {
            Some(r) => Ok(r?),
            None => Err(Error::Unsupported(
                "this VAE encodes single images only".into(),
            )),
        }
    }

    /// Decodes a sampler latent [w, h, C] to an image in [0, 1], [W, H, C_out].
    pub fn decode(&self, latent: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        self.decode_vae_latent(&self.norm.to_vae(latent)?, tiling)
    }

    /// Decodes a latent already in the VAE's space to an image in [0, 1]: the decoder's
    /// output clamped to [−1, 1] and mapped by `x / 2 + 0.5`.
    pub fn decode_vae_latent(
        &self,
        z: &HostTensor,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        Ok(self
            .decode_raw(z, tiling)?
            .map(|v| (v * 0.5 + 0.5).clamp(0.0, 1.0)))
    }

    /// Decodes a VAE latent to the raw decoder output (about [−1, 1]). Tiles when `tiling`
    /// is set; an allocation failure is retried with smaller tiles (also untiled).
    pub fn decode_raw(&self, z: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        if !self.vae.has_decoder() {
            return Err(Error::Unsupported(
                "the VAE file has no decoder weights".into(),
            ));
        }
        let scale = self.scale_factor();
        decode_with_retry(
            z.width() * scale,
            z.height() * scale,
            scale,
            tiling,
            |grid| match grid {
                Some(grid) if !grid.is_single() => {
                    log::debug!(
                        "VAE decode: {} tiles of {}x{} image pixels",
                        grid.len(),
                        grid.tile_w_px(),
                        grid.tile_h_px()
                    );
                    let mut bar = Progress::new("decoding", grid.len());
                    tiled_decode(
                        z,
                        scale,
                        grid,
                        |tile| self.decode_one(tile),
                        |i, _| bar.set(i),
                    )
                }
                _ => self.decode_one(z),
            },
            |e: &Error| matches!(e, Error::Runner(r) if r.is_alloc_failure()),
        )
    }

    fn decode_one(&self, z: &HostTensor) -> Result<HostTensor> {
        let data = z.data.clone();
        let out = self
            .runner
            .compute(|g| vec![self.vae.decode(g, g.input_f32("vae.z", z.ne, data))])?;
        Ok(single(out, "VAE decode")?)
    }

    /// Encodes an `--init-img` for img2img: [`Self::init_pixels`], encoded to the sampler
    /// latent.
    pub fn encode_init(
        &self,
        image: &Image,
        width: usize,
        height: usize,
        tiling: Option<&TileSettings>,
    ) -> Result<HostTensor> {
        self.encode_unit(
            &self.init_pixels(image, width, height),
            tiling,
            "init image",
        )
    }

    /// An `--init-img` as the encoder reads it: resized (bilinear, as upstream) to
    /// `width × height` RGB in [0, 1].
    pub fn init_pixels(&self, image: &Image, width: usize, height: usize) -> HostTensor {
        let img = resize_bilinear(&image.to_rgb(), width as u32, height as u32);
        HostTensor::from_u8_interleaved(width, height, 3, 3, &img.data)
    }

    /// Encodes an image in [0, 1] (mapped to [−1, 1]) to the sampler latent, logging the time
    /// under `what`.
    pub fn encode_unit(
        &self,
        x: &HostTensor,
        tiling: Option<&TileSettings>,
        what: &str,
    ) -> Result<HostTensor> {
        let t = Instant::now();
        let z = self.encode(&x.clone().map(|v| v * 2.0 - 1.0), tiling)?;
        log::debug!("{what} encoded in {:.2}s", t.elapsed().as_secs_f64());
        Ok(z)
    }

    /// Encodes an image [W, H, C] in [−1, 1] to the sampler latent (the posterior mean,
    /// normalised). Tiles when asked; encode does not retry on allocation failure (upstream).
    pub fn encode(&self, image: &HostTensor, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        if !self.vae.has_encoder() {
            return Err(Error::Unsupported(
                "the VAE was loaded without its encoder".into(),
            ));
        }
        self.vae.check_encode_size(image.width(), image.height())?;
        let want = self.vae.image_channels();
        if image.channels() != want {
            return Err(Error::Unsupported(format!(
                "the VAE encodes {want}-channel images, got {}",
                image.channels()
            )));
        }
        let scale = self.scale_factor();
        let grid = match tiling {
            Some(settings) => Some(plan_tiles(image.width(), image.height(), scale, settings)?),
            None => None,
        };
        let mean = match grid {
            Some(grid) if !grid.is_single() => {
                let mut bar = Progress::new("encoding", grid.len());
                tiled_encode(
                    image,
                    scale,
                    &grid,
                    |t| self.encode_one(t),
                    |i, _| bar.set(i),
                )?
            }
            _ => self.encode_one(image)?,
        };
        self.norm.from_vae(&mean)
    }

    fn encode_one(&self, x: &HostTensor) -> Result<HostTensor> {
        let data = x.data.clone();
        let out = self
            .runner
            .compute(|g| vec![self.vae.encode_mean(g, g.input_f32("vae.x", x.ne, data))])?;
        Ok(single(out, "VAE encode")?)
    }
}

fn single(mut out: Vec<HostTensor>, what: &str) -> Result<HostTensor, RunnerError> {
    out.pop()
        .ok_or_else(|| RunnerError::Internal(format!("{what}: no output")))
}

/// A decoded clip [W, H, F, C] in [−1, 1] as video frames [W, H, C, F] in [0, 1] (what
/// video families return).
pub(crate) fn clip_to_frames(clip: &HostTensor) -> HostTensor {
    let [w, h, f, c] = clip.ne;
    let plane = w * h;
    let mut data = vec![0f32; clip.data.len()];
    for fr in 0..f {
        for ch in 0..c {
            let src = &clip.data[(ch * f + fr) * plane..(ch * f + fr + 1) * plane];
            let dst = &mut data[(fr * c + ch) * plane..(fr * c + ch + 1) * plane];
            for (d, s) in dst.iter_mut().zip(src) {
                *d = (s * 0.5 + 0.5).clamp(0.0, 1.0);
            }
        }
    }
    HostTensor {
        ne: [w, h, c, f],
        data,
    }
}
