//! The tiny Qwen Image 2.1 fixture folders (`qwen_image_pipeline`, `qwen_edit_pipeline`):
//! their components, and the pipeline loaded from them.

use std::path::Path;

use sd_cli::pipeline::components::{ComponentFiles, ComponentId, ComponentStore, Needs};
use sd_cli::pipeline::qwen_image_2_1::QwenImage21Pipeline;
use sd_cli::pipeline::{LoadContext, ModelArgs};
use sd_cli::runner::{BackendPlan, MemoryOptions};

/// One component opened from `path` (a file or diffusers folder).
pub fn component(id: ComponentId, path: &Path) -> ComponentStore {
    ComponentStore::open(id, path, false).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The transformer, LLM and VAE files of `dir` (and its `llm_vision` folder with `vision`).
pub fn qwen_store(dir: &Path, vision: bool) -> ComponentFiles {
    let mut files = ComponentFiles::new("Qwen Image 2.1")
        .with(
            ComponentId::Diffusion,
            component(
                ComponentId::Diffusion,
                &dir.join("diffusion_model.safetensors"),
            ),
        )
        .with(
            ComponentId::Llm,
            component(ComponentId::Llm, &dir.join("llm.safetensors")),
        )
        .with(
            ComponentId::Vae,
            component(ComponentId::Vae, &dir.join("vae.safetensors")),
        );
    if vision {
        files.insert(
            ComponentId::LlmVision,
            component(ComponentId::LlmVision, &dir.join("llm_vision")),
        );
    }
    files
}

/// Which optional parts the pipeline builds.
#[derive(Clone, Copy)]
pub struct QwenParts {
    /// The VAE encoder (init and reference images).
    pub encoder: bool,
    /// The vision tower, from `dir/llm_vision`.
    pub vision: bool,
}

/// The pipeline over `files` (f32 prefix cache when `cache`, else no cache).
pub fn qwen_pipeline(
    files: &ComponentFiles,
    plan: &BackendPlan,
    cache: bool,
    parts: QwenParts,
) -> QwenImage21Pipeline {
    let args = if cache {
        "qwen_image_2_1_prefix_cache_type=f32"
    } else {
        "qwen_image_2_1_prefix_cache=false"
    };
    let model_args = ModelArgs::parse(args).0;
    QwenImage21Pipeline::load(
        files,
        &LoadContext {
            backends: plan,
            memory: MemoryOptions::default(),
            wtype: None,
            flash_attn: false,
            model_args: &model_args,
            needs: Needs {
                encoder: parts.encoder,
                references: parts.vision,
                audio_references: false,
            },
            t5_tokenizer: None,
            prediction: None,
            clip_skip: None,
            embd_dir: None,
            lora: None,
            taesd_preview_only: false,
            flow_shift: None,
        },
    )
    .expect("pipeline loads")
}
