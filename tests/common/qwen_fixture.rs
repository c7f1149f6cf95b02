//! The tiny Qwen Image 2.1 fixture folders (`qwen_image_pipeline`, `qwen_edit_pipeline`):
//! their files as one store, and the pipeline loaded from them.

use std::path::Path;

use sd_cli::app::BackendPlan;
use sd_cli::dtype::DType;
use sd_cli::pipeline::qwen_image_2_1::{QwenImage21Load, QwenImage21Pipeline};
use sd_cli::runner::MemoryOptions;
use sd_cli::weights::{Component, TensorStore};

/// The transformer, LLM and VAE files of `dir` (and its `llm_vision` folder with `vision`).
pub fn qwen_store(dir: &Path, vision: bool) -> TensorStore {
    let mut s = TensorStore::new();
    s.add_file(
        &dir.join("diffusion_model.safetensors"),
        Component::Diffusion.prefix(),
    )
    .unwrap();
    s.add_file(&dir.join("llm.safetensors"), Component::Llm.prefix())
        .unwrap();
    if vision {
        s.add_file(&dir.join("llm_vision"), Component::Llm.prefix())
            .unwrap();
    }
    s.add_file(&dir.join("vae.safetensors"), Component::Vae.prefix())
        .unwrap();
    s
}

/// Which optional parts the pipeline builds.
#[derive(Clone, Copy)]
pub struct QwenParts {
    /// The VAE encoder (init and reference images).
    pub encoder: bool,
    /// The vision tower, from `dir/llm_vision`.
    pub vision: bool,
}

/// The pipeline over `store` (f32 prefix cache when `cache`), tokenizer beside `dir`'s LLM.
pub fn qwen_pipeline(
    dir: &Path,
    store: &TensorStore,
    plan: &BackendPlan,
    cache: bool,
    parts: QwenParts,
) -> QwenImage21Pipeline {
    let llm = dir.join("llm.safetensors");
    let vision = dir.join("llm_vision");
    QwenImage21Pipeline::load(&QwenImage21Load {
        store,
        llm_path: Some(&llm),
        tokenizer_path: None,
        wtype: None,
        flash_attn: false,
        backends: plan,
        memory: MemoryOptions::default(),
        prefix_cache: cache,
        prefix_cache_type: DType::F32,
        need_encoder: parts.encoder,
        need_vision: parts.vision,
        vision_path: parts.vision.then_some(vision.as_path()),
    })
    .expect("pipeline loads")
}
