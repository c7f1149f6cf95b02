//! `-M img_gen`: load the model files, detect the family, run its pipeline, write PNGs.

use std::path::Path;
use std::time::Instant;

use super::{BackendPlan, SamplingSetup};
use crate::cli::PrefixCacheType;
use crate::cli::{align_size_up, RunConfig};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::image_io::{
    base_name, read_png, resize_bilinear, write_generation_png, Channels, GenerationParams, Image,
};
use crate::models::vae::tiling::Planar;
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::pixart::{self, PixArtLoad, PixArtPipeline, PixArtRequest};
use crate::pipeline::qwen_image_2_1::{
    self, prefix_cache_type, prepare_reference, QwenImage21Load, QwenImage21Pipeline,
    QwenImage21Request,
};
use crate::pipeline::FloatImage;
use crate::rng::Rng;
use crate::runner::{MaxVram, MemoryOptions};
use crate::sampling::SamplingPlan;
use crate::weights::{detect_family, Component, ModelFamily, TensorStore};

/// Loads every model file of the run into one store, each under its component prefix.
fn open_store(cfg: &RunConfig) -> Result<TensorStore> {
    let m = &cfg.models;
    let mut store = TensorStore::new();
    // Vision weights sit beside the LLM's: a separate file (`--llm_vision`, HF `model.visual.*`
    // or an mmproj GGUF) reads the same as vision weights inside the LLM file.
    let parts: [(&Option<std::path::PathBuf>, &str); 6] = [
        (&m.model, ""),
        (&m.diffusion_model, Component::Diffusion.prefix()),
        (&m.t5xxl, Component::T5.prefix()),
        (&m.llm, Component::Llm.prefix()),
        (&m.llm_vision, Component::Llm.prefix()),
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
        Some(name) => Some(DType::from_name(name).ok_or_else(|| Error::Flag {
            flag: "--type".into(),
            reason: format!("unknown ggml type '{name}'"),
        })?),
        None => None,
    };
    let ctx = Ctx {
        cfg,
        sampling: &sampling,
        backends: &backends,
        memory,
        wtype,
        flash_attn: cfg.runtime.flash_attn || cfg.runtime.diffusion_flash_attn,
    };

    let t_load = Instant::now();
    let store = open_store(cfg)?;
    match detect_family(&store) {
        ModelFamily::PixArt(_) => run_pixart(&ctx, &store, t_load),
        ModelFamily::QwenImage21 => run_qwen_image_2_1(&ctx, &store, t_load),
        ModelFamily::Unknown => Err(Error::Unsupported(
            "could not recognise the diffusion model from its tensor names; supported families: \
             PixArt-α/Σ, Qwen Image 2.1"
                .into(),
        )),
        other => Err(Error::Unsupported(format!(
            "model family {other:?} was recognised, but its pipeline is not implemented in this build yet"
        ))),
    }
}

/// What every family's run needs besides the model files.
struct Ctx<'a> {
    cfg: &'a RunConfig,
    sampling: &'a SamplingSetup,
    backends: &'a BackendPlan,
    memory: MemoryOptions,
    wtype: Option<DType>,
    flash_attn: bool,
}

/// What every image of a `--batch-count` run shares.
struct Batch<'a> {
    width: u32,
    height: u32,
    plan: &'a SamplingPlan,
    text_encoders: Vec<String>,
    strength: Option<f32>,
}

/// Generates the batch: image i uses seed + i (upstream rule) with fresh noise and sampler
/// RNGs, and is written with its metadata as soon as it is done.
fn run_batch<F>(ctx: &Ctx<'_>, batch: &Batch<'_>, mut generate: F) -> Result<()>
where
    F: FnMut(u32, &mut dyn Rng, &mut dyn Rng) -> Result<FloatImage>,
{
    let cfg = ctx.cfg;
    for i in 0..cfg.batch_count {
        let seed = cfg.seed.wrapping_add(i as i64);
        let mut noise_rng = ctx.sampling.rng.create(seed as u64);
        let mut sampler_rng = ctx.sampling.sampler_rng.create(seed as u64);
        let t0 = Instant::now();
        let image = generate(i, noise_rng.as_mut(), sampler_rng.as_mut())?;
        let out = Output {
            index: i,
            seed,
            width: batch.width,
            height: batch.height,
            plan: batch.plan,
            text_encoders: batch.text_encoders.clone(),
            strength: batch.strength,
        };
        write_output(ctx, &out, &image, t0)?;
    }
    Ok(())
}

/// One finished image of a batch and how it was made.
struct Output<'a> {
    index: u32,
    seed: i64,
    width: u32,
    height: u32,
    plan: &'a SamplingPlan,
    text_encoders: Vec<String>,
    strength: Option<f32>,
}

fn write_output(ctx: &Ctx<'_>, out: &Output<'_>, image: &FloatImage, t0: Instant) -> Result<()> {
    let cfg = ctx.cfg;
    let path = cfg.output_path_for(out.index);
    if cfg.output.create_parent_dirs {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::Model {
                path: parent.to_path_buf(),
                reason: format!("cannot create the output directory: {e}"),
            })?;
        }
    }
    let plan = out.plan;
    let params = cfg.output.embed_metadata.then(|| {
        let mut p = GenerationParams::new();
        p.prompt = cfg.prompt.clone();
        p.negative_prompt = cfg.negative_prompt.clone();
        p.steps = plan.steps as u32;
        p.cfg_scale = cfg.sampling.cfg_scale;
        p.eta = Some(plan.eta());
        p.seed = out.seed;
        p.batch_index = out.index;
        p.width = out.width;
        p.height = out.height;
        p.sampler = plan.sampler.to_string();
        p.scheduler = plan
            .custom_sigmas
            .is_none()
            .then(|| plan.schedule.to_string());
        p.custom_sigmas = plan.custom_sigmas.clone().unwrap_or_default();
        p.rng = ctx.sampling.rng.to_string();
        p.sampler_rng = cfg.sampling.sampler_rng.clone();
        p.model = file_name(&cfg.models.model);
        p.diffusion_model = file_name(&cfg.models.diffusion_model);
        p.text_encoders = out.text_encoders.clone();
        p.vae = file_name(&cfg.models.vae);
        p.extra_sample_args = cfg.sampling.extra_sample_args_raw.clone();
        p.model_args = cfg.model_args_raw.clone();
        p.strength = out.strength;
        p
    });
    write_generation_png(&path, &to_png_image(image)?, params.as_ref())?;
    log::info!(
        "saved {} ({:.1}s)",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn tiling(cfg: &RunConfig) -> Option<TileSettings> {
    cfg.vae_tiling
        .as_ref()
        .map(|t| TileSettings::new(t.tile_w, t.tile_h, t.relative, t.overlap))
}

fn run_qwen_image_2_1(ctx: &Ctx<'_>, store: &TensorStore, t_load: Instant) -> Result<()> {
    let cfg = ctx.cfg;
    let init_png = cfg.inputs.init.as_deref().map(read_png).transpose()?;
    let ref_pngs = cfg
        .inputs
        .refs
        .iter()
        .map(|p| read_png(p))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let a = &cfg.model_args;
    let requested = match a.qwen_image_2_1_prefix_cache_type {
        PrefixCacheType::Auto => None,
        PrefixCacheType::Ggml(name) => Some(name),
    };
    let pipe = QwenImage21Pipeline::load(&QwenImage21Load {
        store,
        llm_path: cfg.models.llm.as_deref().or(cfg.models.model.as_deref()),
        tokenizer_path: None,
        wtype: ctx.wtype,
        flash_attn: ctx.flash_attn,
        backends: ctx.backends,
        memory: ctx.memory.clone(),
        prefix_cache: a.qwen_image_2_1_prefix_cache,
        prefix_cache_type: prefix_cache_type(requested, ctx.flash_attn)?,
        need_encoder: init_png.is_some() || !ref_pngs.is_empty(),
        need_vision: !ref_pngs.is_empty(),
        vision_path: cfg.models.llm_vision.as_deref(),
    })?;
    log::debug!("models loaded in {:.2}s", t_load.elapsed().as_secs_f64());

    // Without -W/-H the init image, else the first reference, sets the size (upstream rule);
    // the reference pipeline floors it to a multiple of 32.
    let mult = pipe.size_multiple() as u32;
    let (w0, h0) = match (init_png.as_ref().or(ref_pngs.first()), cfg.size_is_set()) {
        (Some(img), false) => (img.width, img.height),
        _ => (cfg.resolved_width(), cfg.resolved_height()),
    };
    let (width, height) = (w0 / mult * mult, h0 / mult * mult);
    if width == 0 || height == 0 {
        return Err(Error::Flag {
            flag: "-W/-H".into(),
            reason: format!("{w0}x{h0} is smaller than {mult} pixels, the model's size multiple"),
        });
    }
    if (width, height) != (w0, h0) {
        log::warn!("image size {w0}x{h0} rounded down to {width}x{height} (a multiple of {mult} for this model)");
    }
    let plan = ctx.sampling.plan_with_options(
        qwen_image_2_1::DEFAULT_SAMPLER,
        qwen_image_2_1::DEFAULT_SCHEDULE,
        qwen_image_2_1::schedule_options(),
    );
    let tiling = tiling(cfg);
    let init_latent = match &init_png {
        Some(img) => {
            let t = Instant::now();
            let prepared = prepare_reference(img, width as usize, height as usize)?;
            let x = Planar::new(width as usize, height as usize, 4, prepared.vae_input)?;
            let z = pipe.encode_image(&x, tiling.as_ref())?;
            log::debug!("init image encoded in {:.2}s", t.elapsed().as_secs_f64());
            Some(z)
        }
        None => None,
    };
    let edit = if ref_pngs.is_empty() {
        None
    } else {
        let args = &cfg.inputs.ref_args;
        if !args.pass_to_vlm || !args.pass_to_dit {
            return Err(Error::Flag {
                flag: "--ref-image-args".into(),
                reason: "Qwen Image 2.1 reads every reference twice (vision slots in the                          prompt and latent tokens in the transformer): pass_to_vlm and                          pass_to_dit must stay true"
                    .into(),
            });
        }
        let t = Instant::now();
        let e = pipe.prepare_edit(
            &ref_pngs,
            args.target_area(u64::from(width) * u64::from(height)) as usize,
            cfg.inputs.auto_resize_ref_image,
            tiling.as_ref(),
        )?;
        log::debug!(
            "{} reference image(s) encoded in {:.2}s",
            ref_pngs.len(),
            t.elapsed().as_secs_f64()
        );
        Some(e)
    };
    let batch = Batch {
        width,
        height,
        plan: &plan,
        text_encoders: file_name(&cfg.models.llm).into_iter().collect(),
        strength: init_latent.is_some().then_some(cfg.strength),
    };
    run_batch(ctx, &batch, |i, noise_rng, sampler_rng| {
        pipe.txt2img(QwenImage21Request {
            prompt: &cfg.prompt,
            negative_prompt: &cfg.negative_prompt,
            width: width as usize,
            height: height as usize,
            cfg_scale: cfg.sampling.cfg_scale,
            plan: &plan,
            noise_rng,
            sampler_rng,
            vae_tiling: tiling.as_ref(),
            // Later images of the batch share the prompts: keep their text K/V.
            keep_prefix_cache: i + 1 < cfg.batch_count,
            init: init_latent.as_ref().map(|z| (z, cfg.strength)),
            edit: edit.as_ref(),
        })
    })?;
    pipe.release_prefix_cache();
    Ok(())
}

fn run_pixart(ctx: &Ctx<'_>, store: &TensorStore, t_load: Instant) -> Result<()> {
    let cfg = ctx.cfg;
    let a = &cfg.model_args;
    if !cfg.inputs.refs.is_empty() {
        return Err(Error::Unsupported(
            "PixArt does not take reference images (-r); use --init-img for img2img".into(),
        ));
    }
    let pipe = PixArtPipeline::load(&PixArtLoad {
        store,
        t5_path: cfg.models.t5xxl.as_deref().or(cfg.models.model.as_deref()),
        tokenizer_path: cfg.models.t5xxl_tokenizer.as_deref(),
        wtype: ctx.wtype,
        flash_attn: ctx.flash_attn,
        backends: ctx.backends,
        pos_embed_base_size: explicit_model_arg(cfg, "pixart_pos_embed_base_size")
            .then_some(a.pixart_pos_embed_base_size as f32),
        interpolation_scale: explicit_model_arg(cfg, "pixart_interpolation_scale")
            .then_some(a.pixart_interpolation_scale),
        vae_scale_factor: a.pixart_vae_scale_factor,
        memory: ctx.memory.clone(),
        need_encoder: cfg.inputs.init.is_some(),
    })?;
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
    let plan = ctx
        .sampling
        .plan(pixart::DEFAULT_SAMPLER, pixart::DEFAULT_SCHEDULE);
    let tiling = tiling(cfg);

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

    let batch = Batch {
        width,
        height,
        plan: &plan,
        text_encoders: file_name(&cfg.models.t5xxl).into_iter().collect(),
        strength: init_latent.is_some().then_some(cfg.strength),
    };
    run_batch(ctx, &batch, |_, noise_rng, sampler_rng| {
        pipe.txt2img(PixArtRequest {
            prompt: &cfg.prompt,
            negative_prompt: &cfg.negative_prompt,
            width: width as usize,
            height: height as usize,
            cfg_scale: cfg.sampling.cfg_scale,
            plan: &plan,
            noise_rng,
            sampler_rng,
            vae_tiling: tiling.as_ref(),
            init: init_latent.as_ref().map(|z| (z, cfg.strength)),
        })
    })?;
    Ok(())
}
