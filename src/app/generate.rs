//! `-M img_gen`: load the model files, detect the family, run its pipeline, write PNGs.

use std::path::Path;
use std::time::Instant;

use super::{BackendPlan, SamplingSetup};
use crate::cli::{align_size_up, RunConfig};
use crate::error::{Error, Result};
use crate::ggml::GgmlType;
use crate::image_io::{
    base_name, read_png, resize_bilinear, write_generation_png, Channels, GenerationParams, Image,
};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::pixart::{self, PixArtLoad, PixArtPipeline, PixArtRequest};
use crate::pipeline::FloatImage;
use crate::runner::{MaxVram, MemoryOptions};
use crate::weights::{detect_family, Component, ModelFamily, TensorStore};

/// Loads every model file of the run into one store, each under its component prefix.
fn open_store(cfg: &RunConfig) -> Result<TensorStore> {
    let m = &cfg.models;
    let mut store = TensorStore::new();
    let parts: [(&Option<std::path::PathBuf>, &str); 4] = [
        (&m.model, ""),
        (&m.diffusion_model, Component::Diffusion.prefix()),
        (&m.t5xxl, Component::T5.prefix()),
        (&m.vae, Component::Vae.prefix()),
    ];
    for (path, prefix) in parts {
        if let Some(p) = path {
            log::debug!("reading {}", p.display());
            store.add_file(p, prefix)?;
        }
    }
    Ok(store)
}

/// The memory flags: `--max-vram` (> 0 a managed budget in GiB, 0 the device's free memory,
/// < 0 free memory at start less that many GiB, or `device=GiB` items), `--offload-to-cpu`,
/// `--disable-prefetch`, `--disable-segmented-compute`.
fn memory_options(cfg: &RunConfig) -> Result<MemoryOptions> {
    let max_vram = MaxVram::parse(&cfg.runtime.max_vram).map_err(|reason| Error::Flag {
        flag: "--max-vram".into(),
        reason,
    })?;
    Ok(MemoryOptions {
        max_vram,
        offload_to_cpu: cfg.runtime.offload_to_cpu,
        prefetch: !cfg.runtime.disable_prefetch,
        segmented: !cfg.runtime.disable_segmented_compute,
        ..MemoryOptions::default()
    })
}

fn explicit_model_arg(cfg: &RunConfig, key: &str) -> bool {
    cfg.model_args_raw
        .split([',', ';'])
        .any(|kv| kv.split('=').next().map(str::trim) == Some(key))
}

fn to_png_image(img: &FloatImage) -> Result<Image> {
    let channels = if img.channels == 4 {
        Channels::Rgba
    } else {
        Channels::Rgb
    };
    Ok(Image::new(
        img.width as u32,
        img.height as u32,
        channels,
        img.to_u8_interleaved(),
    )?)
}

fn file_name(p: &Option<std::path::PathBuf>) -> Option<String> {
    p.as_deref().map(|p: &Path| base_name(p))
}

pub fn run(cfg: &RunConfig) -> Result<()> {
    // Flags first: a typo fails before any model file is read.
    let sampling = SamplingSetup::resolve(cfg)?;
    let backends = BackendPlan::resolve(cfg)?;
    let memory = memory_options(cfg)?;
    let wtype = match cfg.weight_type {
        Some(name) => Some(GgmlType::from_name(name).ok_or_else(|| Error::Flag {
            flag: "--type".into(),
            reason: format!("unknown ggml type '{name}'"),
        })?),
        None => None,
    };

    let t_load = Instant::now();
    let store = open_store(cfg)?;
    let family = detect_family(&store);
    let pipe = match family {
        ModelFamily::PixArt(_) => {
            let a = &cfg.model_args;
            PixArtPipeline::load(&PixArtLoad {
                store: &store,
                t5_path: cfg.models.t5xxl.as_deref().or(cfg.models.model.as_deref()),
                tokenizer_path: cfg.models.t5xxl_tokenizer.as_deref(),
                wtype,
                flash_attn: cfg.runtime.flash_attn || cfg.runtime.diffusion_flash_attn,
                backends: &backends,
                pos_embed_base_size: explicit_model_arg(cfg, "pixart_pos_embed_base_size").then_some(a.pixart_pos_embed_base_size as f32),
                interpolation_scale: explicit_model_arg(cfg, "pixart_interpolation_scale").then_some(a.pixart_interpolation_scale),
                vae_scale_factor: a.pixart_vae_scale_factor,
                memory,
                need_encoder: cfg.inputs.init.is_some(),
            })?
        }
        ModelFamily::Unknown => {
            return Err(Error::Unsupported(
                "could not recognise the diffusion model from its tensor names; supported families: PixArt-α/Σ".into(),
            ))
        }
        other => {
            return Err(Error::Unsupported(format!(
                "model family {other:?} was recognised, but its pipeline is not implemented in this build yet"
            )))
        }
    };
    log::debug!("models loaded in {:.2}s", t_load.elapsed().as_secs_f64());

    let mult = pipe.size_multiple() as u32;
    let init_png = match &cfg.inputs.init {
        Some(p) => Some(read_png(p)?),
        None => None,
    };
    // Without -W/-H an init image sets the size (upstream rule).
    let (w0, h0) = match (&init_png, cfg.size_is_set()) {
        (Some(img), false) => (img.width, img.height),
        _ => (cfg.resolved_width(), cfg.resolved_height()),
    };
    let (width, height) = align_size_up(w0, h0, mult);
    if (width, height) != (w0, h0) {
        log::warn!("image size {w0}x{h0} rounded up to {width}x{height} (a multiple of {mult} for this model)");
    }
    let plan = sampling.plan(pixart::DEFAULT_SAMPLER, pixart::DEFAULT_SCHEDULE);
    let tiling = cfg
        .vae_tiling
        .as_ref()
        .map(|t| TileSettings::new(t.tile_w, t.tile_h, t.relative, t.overlap));

    let init_latent = match &init_png {
        Some(img) => {
            let img = resize_bilinear(&img.to_rgb(), width, height);
            let f =
                FloatImage::from_u8_interleaved(width as usize, height as usize, 3, 3, &img.data);
            let t = Instant::now();
            let z = pipe.encode_image(&f, tiling.as_ref())?;
            log::debug!("init image encoded in {:.2}s", t.elapsed().as_secs_f64());
            Some(z)
        }
        None => None,
    };

    for i in 0..cfg.batch_count {
        let seed = cfg.seed.wrapping_add(i as i64);
        let mut noise_rng = sampling.rng.create(seed as u64);
        let mut sampler_rng = sampling.sampler_rng.create(seed as u64);
        let t0 = Instant::now();
        let image = pipe.txt2img(PixArtRequest {
            prompt: &cfg.prompt,
            negative_prompt: &cfg.negative_prompt,
            width: width as usize,
            height: height as usize,
            cfg_scale: cfg.sampling.cfg_scale,
            plan: &plan,
            noise_rng: noise_rng.as_mut(),
            sampler_rng: sampler_rng.as_mut(),
            vae_tiling: tiling.as_ref(),
            init: init_latent.as_ref().map(|z| (z, cfg.strength)),
        })?;
        let path = cfg.output_path_for(i);
        if cfg.output.create_parent_dirs {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| Error::Model {
                    path: parent.to_path_buf(),
                    reason: format!("cannot create the output directory: {e}"),
                })?;
            }
        }
        let params = cfg.output.embed_metadata.then(|| {
            let mut p = GenerationParams::new();
            p.prompt = cfg.prompt.clone();
            p.negative_prompt = cfg.negative_prompt.clone();
            p.steps = plan.steps as u32;
            p.cfg_scale = cfg.sampling.cfg_scale;
            p.eta = Some(plan.eta());
            p.seed = seed;
            p.batch_index = i;
            p.width = width;
            p.height = height;
            p.sampler = plan.sampler.to_string();
            p.scheduler = plan
                .custom_sigmas
                .is_none()
                .then(|| plan.schedule.to_string());
            p.custom_sigmas = plan.custom_sigmas.clone().unwrap_or_default();
            p.rng = sampling.rng.to_string();
            p.sampler_rng = cfg.sampling.sampler_rng.clone();
            p.model = file_name(&cfg.models.model);
            p.diffusion_model = file_name(&cfg.models.diffusion_model);
            p.text_encoders = file_name(&cfg.models.t5xxl).into_iter().collect();
            p.vae = file_name(&cfg.models.vae);
            p.extra_sample_args = cfg.sampling.extra_sample_args_raw.clone();
            p.model_args = cfg.model_args_raw.clone();
            p.strength = init_latent.is_some().then_some(cfg.strength);
            p
        });
        write_generation_png(&path, &to_png_image(&image)?, params.as_ref())?;
        log::info!(
            "saved {} ({:.1}s)",
            path.display(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
