//! ESRGAN upscaling: `-M upscale` (the init image), and after generation when `--upscale-model`
//! is given (each image, before it is written), `--upscale-repeats` passes, tile by tile
//! (`--upscale-tile-size` input pixels, overlap 0.25 as upstream) when the image is larger.

use std::path::Path;
use std::time::Instant;

use super::RunConfig;
use crate::error::{Error, Result};
use crate::image_io::{read_image, write_generation_image, Channels, Image};
use crate::models::upscaler::esrgan::{Esrgan, EsrganConfig};
use crate::models::vae::tiling::{plan_tiles_latent, tiled_decode, TileSettings};
use crate::pipeline::resample::{resize, Resample};
use crate::progress::Progress;
use crate::runner::{BackendPlan, LoadOptions, Loaded, Role, Runner, StoreSource};
use crate::tensor::HostTensor;
use crate::weights::TensorStore;

/// Upstream's tile overlap for upscaling.
const TILE_OVERLAP: f32 = 0.25;

/// Where checkpoints keep the network: BasicSR's `.pth` files nest it under `params_ema` (or
/// `params`), conversions keep it at the root.
const PREFIXES: [&str; 3] = ["params_ema.", "params.", ""];

/// A loaded upscaler and how it runs.
pub(super) struct Upscaler {
    model: Loaded<Esrgan>,
    repeats: u32,
    tile_size: usize,
}

impl Upscaler {
    /// Loads `--upscale-model` on the VAE's backend.
    pub fn load(cfg: &RunConfig, path: &Path) -> Result<Upscaler> {
        Self::load_with(cfg, path, cfg.upscale.repeats, cfg.upscale.tile_size)
    }

    /// Loads an ESRGAN model for `repeats` passes of `tile_size`-pixel tiles.
    pub fn load_with(
        cfg: &RunConfig,
        path: &Path,
        repeats: u32,
        tile_size: u32,
    ) -> Result<Upscaler> {
        let store = TensorStore::open(path)?;
        let prefix = PREFIXES
            .iter()
            .find(|p| store.contains(&format!("{p}conv_first.weight")))
            .ok_or_else(|| Error::Model {
                path: path.to_path_buf(),
                reason: if store.contains("model.0.weight") {
                    "the old ESRGAN layout (`model.0.weight`, ...) is not supported; use a \
                     BasicSR/Real-ESRGAN model (`conv_first.weight`, `body.N.rdbK.convM`)"
                        .into()
                } else {
                    "not an ESRGAN model: no `conv_first.weight` (BasicSR RRDBNet names)".into()
                },
            })?;
        let src = StoreSource::new(&store, prefix);
        let plan = BackendPlan::new(cfg.runtime.backends.clone(), cfg.runtime.threads as usize);
        let opts = LoadOptions {
            backend: plan.backend(Role::Vae)?,
            wtype: None,
            run: crate::runner::RunOptions {
                flash_attn: cfg.runtime.flash_attn,
                memory: cfg.runtime.memory.clone(),
                ..Default::default()
            },
            adapters: None,
        };
        let model = Runner::load("esrgan", &src, opts, |wb| -> Result<Esrgan> {
            let config = EsrganConfig::detect(wb)?;
            log::debug!("esrgan: {config:?}");
            if config.in_ch != 3 || config.out_ch != 3 {
                return Err(Error::Model {
                    path: path.to_path_buf(),
                    reason: format!(
                        "an upscaler of {} input and {} output channels; RGB (3) is needed",
                        config.in_ch, config.out_ch
                    ),
                });
            }
            Ok(Esrgan::new(wb, config)?)
        })?;
        Ok(Upscaler {
            model,
            repeats: repeats.max(1),
            tile_size: tile_size.max(1) as usize,
        })
    }

    /// One pass over a planar RGB image in [0, 1].
    fn pass(&self, image: &HostTensor) -> Result<HostTensor> {
        let scale = self.model.model.config.scale;
        let (w, h) = (image.width(), image.height());
        let run = |tile: &HostTensor| -> Result<HostTensor> {
            let ne = tile.ne;
            let out = self.model.runner.compute(|g| {
                let x = g.input_f32("image", ne, tile.data.clone());
                vec![self.model.model.forward(g, x)]
            })?;
            out.into_iter()
                .next()
                .ok_or_else(|| Error::Unsupported("the upscaler returned nothing".into()))
        };
        if w <= self.tile_size && h <= self.tile_size {
            return run(image);
        }
        let t = (self.tile_size * scale) as u32;
        let settings = TileSettings::new(t, t, None, TILE_OVERLAP);
        let grid = plan_tiles_latent(w, h, scale, &settings)?;
        let mut bar = Progress::new("upscaling", grid.len());
        tiled_decode(image, scale, &grid, run, |i, _| bar.set(i))
    }

    /// `--upscale-repeats` passes over `image` (alpha is dropped, as upstream reads RGB).
    pub fn upscale(&self, image: &Image) -> Result<Image> {
        let (w, h) = (image.width as usize, image.height as usize);
        let x = HostTensor::from_u8_interleaved(w, h, image.channels.count(), 3, &image.data);
        let x = self.upscale_tensor(&x)?;
        Ok(Image::new(
            x.width() as u32,
            x.height() as u32,
            Channels::Rgb,
            x.to_u8_interleaved(),
        )?)
    }

    /// The same for a generated image ([W, H, C] in [0, 1]; channels past RGB dropped).
    pub fn upscale_tensor(&self, image: &HostTensor) -> Result<HostTensor> {
        let start = Instant::now();
        let (w, h) = (image.width(), image.height());
        let rgb = image.data[..(w * h * 3).min(image.data.len())].to_vec();
        let mut x = HostTensor::image(w, h, 3, rgb)?;
        for _ in 0..self.repeats {
            // Each pass reads 8-bit pixels, as upstream's (which upscales the saved image).
            x = self.pass(&eight_bit(x))?;
        }
        log::info!(
            "upscaled {w}x{h} to {}x{} in {:.2}s",
            x.width(),
            x.height(),
            start.elapsed().as_secs_f64()
        );
        Ok(x)
    }
}

/// The hires fix's model upscaler: one pass over the decoded image as it is (no 8-bit
/// rounding: nothing was saved); an alpha channel (RGBA VAEs) is resized bilinearly beside it.
impl crate::pipeline::hires::ImageUpscaler for Upscaler {
    fn upscale_image(&self, image: &HostTensor) -> Result<HostTensor> {
        let (w, h, c) = (image.width(), image.height(), image.channels());
        if c < 3 {
            return Err(Error::Unsupported(format!(
                "the hires upscaler model needs an RGB image, the VAE gave {c} channels"
            )));
        }
        let rgb = HostTensor::image(w, h, 3, image.data[..w * h * 3].to_vec())?;
        let up = self.pass(&rgb)?;
        if c == 3 {
            return Ok(up);
        }
        let rest = HostTensor::image(w, h, c - 3, image.data[w * h * 3..].to_vec())?;
        let (uw, uh) = (up.width(), up.height());
        let rest = resize(&rest, uw, uh, Resample::Bilinear { antialias: false });
        Ok(HostTensor::image(uw, uh, c, [up.data, rest.data].concat())?)
    }
}

/// `x` at the 8-bit levels a PNG of it holds (`to_u8_interleaved`'s rounding).
fn eight_bit(x: HostTensor) -> HostTensor {
    x.map(|v| (v.clamp(0.0, 1.0) * 255.0).round() / 255.0)
}

/// `-M upscale --upscale-model M --init-img I -o O`.
pub fn run(cfg: &RunConfig) -> Result<()> {
    let input = cfg
        .inputs
        .init
        .as_deref()
        .ok_or_else(|| Error::Unsupported("upscale mode needs --init-img".into()))?;
    let model = cfg
        .models
        .upscale_model
        .as_deref()
        .ok_or_else(|| Error::Unsupported("upscale mode needs --upscale-model".into()))?;
    let image = read_image(input)?;
    let upscaler = Upscaler::load(cfg, model)?;
    let out = upscaler.upscale(&image)?;
    let path = cfg.output_path_for(0);
    super::output::create_parent(cfg, &path)?;
    write_generation_image(&path, &out, None)?;
    log::info!("saved {}", path.display());
    Ok(())
}
