//! The Qwen3-VL vision tower as the families that read images through their Qwen3-VL text
//! encoder load and run it (Qwen Image 2.1 editing, MiniMax-H3 keyframes): the tower, its
//! image-processor settings, and one image's embeddings with their deepstack features.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::models::te::qwen3::VisionEmbeds;
use crate::models::te::qwen3_vl_vision::{
    encode_image as encode_vision, qwen3_vl_vision_hparams, Qwen3VlVision, Qwen3VlVisionConfig,
    Qwen3VlVisionSource, VisionPreprocessConfig,
};
use crate::pipeline::components::{ComponentId, ComponentStore};
use crate::runner::{LoadOptions, Loaded, Runner};

/// The vision tower with its image-processor settings.
pub struct Vision {
    tower: Loaded<Qwen3VlVision>,
    preprocess: VisionPreprocessConfig,
}

/// The image-processor settings: `preprocessor_config.json` in or beside the vision (then the
/// LLM) file or folder, or in the `processor/` folder next to a diffusers `text_encoder/`;
/// else the vision file's mmproj GGUF metadata; else Qwen3-VL's released values.
fn preprocess_config(
    vision: &ComponentStore,
    llm: &ComponentStore,
) -> Result<VisionPreprocessConfig> {
    const NAME: &str = "preprocessor_config.json";
    let candidates = [&vision.path, &llm.path]
        .into_iter()
        .flat_map(|f: &PathBuf| {
            let inside = f.is_dir().then(|| f.join(NAME));
            let beside = f.parent().map(|d| d.join(NAME));
            let folder = if f.is_dir() {
                Some(f.as_path())
            } else {
                f.parent()
            };
            let processor = folder
                .filter(|d| d.file_name().is_some_and(|n| n == "text_encoder"))
                .and_then(|d| d.parent())
                .map(|root| root.join("processor").join(NAME));
            inside.into_iter().chain(beside).chain(processor)
        });
    for json in candidates {
        if json.is_file() {
            log::debug!("vision preprocessing: {}", json.display());
            return VisionPreprocessConfig::from_json_file(&json)
                .map_err(|e| Error::Unsupported(e.to_string()));
        }
    }
    let mut cfg = VisionPreprocessConfig::default();
    for f in vision.store.files() {
        cfg = cfg.with_gguf(&f.gguf).map_err(|reason| Error::Model {
            path: f.path.clone(),
            reason,
        })?;
    }
    Ok(cfg)
}

impl Vision {
    /// Loads the vision tower from its own files (a `--llm_vision` file, or the LLM file
    /// when that holds the vision weights); hyper-parameters come from those files only.
    /// `purpose` ("Qwen Image 2.1 editing") names what needs it in errors.
    pub fn load(
        vision: &ComponentStore,
        llm: &ComponentStore,
        opts: LoadOptions,
        purpose: &str,
    ) -> Result<Self> {
        let prefix = ComponentId::LlmVision.prefix();
        let src = Qwen3VlVisionSource::new(&vision.store, prefix);
        let hp = qwen3_vl_vision_hparams(&vision.store, prefix);
        let tower = Runner::load(
            "qwen3vl_vision",
            &src,
            opts,
            |wb| -> Result<Qwen3VlVision> {
                let config = Qwen3VlVisionConfig::detect(wb, &hp).map_err(|e| {
                    Error::Unsupported(format!(
                        "{purpose} needs the Qwen3-VL vision weights (pass --llm_vision \
                         with the mmproj GGUF or the vision safetensors, or an LLM file that \
                         holds them): {e}"
                    ))
                })?;
                log::debug!("qwen3-vl vision: {config:?}");
                Ok(Qwen3VlVision::new(wb, config)?)
            },
        )?;
        Ok(Self {
            tower,
            preprocess: preprocess_config(vision, llm)?,
        })
    }

    pub fn out_hidden(&self) -> usize {
        self.tower.model.config().out_hidden
    }

    /// The vision embeddings of an RGB image (already at a multiple of patch × merge).
    pub fn encode(
        &self,
        index: usize,
        rgb: &[u8],
        width: usize,
        height: usize,
    ) -> Result<VisionEmbeds> {
        let p = &self.preprocess;
        let (th, tw) = p
            .target_size(height, width)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        if (tw, th) != (width, height) {
            // transformers would resize to (tw, th) and then disagree with the latent slots;
            // upstream feeds the reference as is, which the tower handles at any grid.
            log::warn!(
                "reference image {}: the vision preprocessor would resize {width}x{height} to \
                 {tw}x{th} (min/max pixels {}..{}); encoding it at {width}x{height} so its \
                 tokens match the latent",
                index + 1,
                p.min_pixels,
                p.max_pixels
            );
        }
        self.embed(rgb, width, height)
    }

    /// The image-processor settings (from the files, else Qwen3-VL's released values).
    pub fn preprocess(&self) -> &VisionPreprocessConfig {
        &self.preprocess
    }

    /// The vision embeddings of an RGB image (u8 interleaved) at its own size, which must be a
    /// multiple of patch × merge.
    pub fn embed(&self, rgb: &[u8], width: usize, height: usize) -> Result<VisionEmbeds> {
        self.embed_frames(&[rgb], width, height)
    }

    /// The vision embeddings of one temporal patch of frames (a video block: two frames fill
    /// the tower's two temporal slots; one frame is repeated), all at one size.
    pub fn embed_frames(
        &self,
        frames: &[&[u8]],
        width: usize,
        height: usize,
    ) -> Result<VisionEmbeds> {
        let p = &self.preprocess;
        let (patches, [_, gh, gw]) = p
            .patchify_frames(frames, width, height)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        let out = encode_vision(&self.tower.runner, &self.tower.model, &patches, gh, gw)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        let m = p.merge_size;
        Ok(VisionEmbeds {
            embeds: out.embeds,
            deepstack: out.deepstack,
            grid_h: gh / m,
            grid_w: gw / m,
        })
    }
}
