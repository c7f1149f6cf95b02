//! Editing with reference images: each `-r` image is resized once ([`super::refs`]), VAE-encoded
//! into latent tokens for the transformer's prefix, and read by the Qwen3-VL vision tower whose
//! embeddings fill the prompt's `<|image_pad|>` slots (diffusers `QwenImage21Pipeline` with
//! `image=`). Both conditions of CFG see the same references.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::image_io::Image;
use crate::models::dit::qwen_image_2_1::PrefixLayout;
use crate::models::te::qwen3::VisionEmbeds;
use crate::models::te::qwen3_vl_vision::{
    encode_image as encode_vision, qwen3_vl_vision_hparams, Qwen3VlVision, Qwen3VlVisionConfig,
    Qwen3VlVisionSource, VisionPreprocessConfig,
};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::components::{ComponentId, ComponentStore};
use crate::progress::Progress;
use crate::runner::{LoadOptions, Loaded, Runner};
use crate::tensor::HostTensor;

use super::refs::{prepare_reference, reference_size};
use super::template::encode_edit_prompt;
use super::{PromptCondition, QwenImage21Pipeline};

/// An edit prompt's encoder rows [hidden, L] and which rows are image slots.
pub(super) type EditEmbedding = (HostTensor, Vec<bool>);

/// The vision tower with its image-processor settings.
pub(super) struct Vision {
    tower: Loaded<Qwen3VlVision>,
    preprocess: VisionPreprocessConfig,
}

/// Everything the references contribute to a run, computed once for all its images.
pub struct EditInputs {
    /// Reference latents in transformer space, [w, h, C, 1] each.
    latents: Vec<HostTensor>,
    /// Vision-tower outputs per reference.
    vision: Vec<VisionEmbeds>,
    /// Fingerprint of the above (prompt embeddings are memoised per prompt and references).
    id: u64,
}

impl EditInputs {
    /// Number of reference images.
    pub fn len(&self) -> usize {
        self.latents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.latents.is_empty()
    }

    /// Reference `i`'s latent in transformer space, [w, h, C, 1].
    pub fn latent(&self, i: usize) -> &HostTensor {
        &self.latents[i]
    }

    /// Latent (h, w) of each reference.
    pub fn latent_sizes(&self) -> Vec<(usize, usize)> {
        self.latents.iter().map(|l| (l.ne[1], l.ne[0])).collect()
    }

    pub(super) fn id(&self) -> u64 {
        self.id
    }
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
    pub(super) fn load(
        vision: &ComponentStore,
        llm: &ComponentStore,
        opts: LoadOptions,
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
                        "Qwen Image 2.1 editing needs the Qwen3-VL vision weights (pass \
                     --llm_vision with the mmproj GGUF or the vision safetensors, or an LLM \
                     file that holds them): {e}"
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

    pub(super) fn out_hidden(&self) -> usize {
        self.tower.model.config().out_hidden
    }

    /// The vision embeddings of an RGB image (already at a multiple of patch × merge).
    fn encode(
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
        let (patches, [_, gh, gw]) = p
            .patchify(rgb, width, height)
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

impl QwenImage21Pipeline {
    /// Prepares reference images for editing: sizes from `target_area` (or their own with
    /// `auto_resize` off), Lanczos resize, VAE latents (tiled when asked) and vision
    /// embeddings.
    pub fn prepare_edit(
        &self,
        refs: &[Image],
        target_area: usize,
        auto_resize: bool,
        tiling: Option<&TileSettings>,
    ) -> Result<EditInputs> {
        let vision = self.vision.as_ref().ok_or_else(|| {
            Error::Unsupported(
                "reference images need the Qwen3-VL vision weights: load the pipeline with \
                 vision enabled"
                    .into(),
            )
        })?;
        let mut latents = Vec::with_capacity(refs.len());
        let mut embeds = Vec::with_capacity(refs.len());
        let mut bar = Progress::new("reference images", refs.len());
        for (i, img) in refs.iter().enumerate() {
            let (w, h) = reference_size(i, img, target_area, auto_resize)?;
            log::debug!(
                "reference image {}: {}x{} -> {w}x{h}",
                i + 1,
                img.width,
                img.height
            );
            let p = prepare_reference(img, w, h)?;
            let x = HostTensor::image(w, h, 4, p.vae_input)?;
            latents.push(self.encode_image(&x, tiling)?);
            embeds.push(vision.encode(i, &p.vision_rgb, w, h)?);
            bar.set(i + 1);
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for l in &latents {
            l.ne.hash(&mut hasher);
            l.data.iter().for_each(|v| v.to_bits().hash(&mut hasher));
        }
        for e in &embeds {
            e.embeds
                .data
                .iter()
                .for_each(|v| v.to_bits().hash(&mut hasher));
        }
        Ok(EditInputs {
            latents,
            vision: embeds,
            id: hasher.finish(),
        })
    }

    /// The transformer condition of `prompt` with the references: the edit template through
    /// the encoder with the vision embeddings in its slots, and the layout placing each
    /// reference's latent tokens there.
    pub(super) fn edit_condition(
        &self,
        prompt: &str,
        edit: &EditInputs,
    ) -> Result<PromptCondition> {
        let (text, pads) = self.edit_embedding(prompt, edit)?;
        let layout = PrefixLayout::from_pad_mask(&pads, &edit.latent_sizes())
            .map_err(|e| Error::Unsupported(e.to_string()))?;
        Ok(PromptCondition {
            text,
            refs: edit.latents.clone(),
            layout: Some(layout),
        })
    }

    /// The edit prompt embedding [hidden, L] (system rows dropped) and which of its rows are
    /// image slots.
    pub fn edit_embedding(
        &self,
        prompt: &str,
        edit: &EditInputs,
    ) -> Result<(HostTensor, Vec<bool>)> {
        let key = format!("{:016x}\u{0}{prompt}", edit.id());
        self.edit_embeds.get_or_try(&key, || {
            encode_edit_prompt(
                &self.te.runner,
                &self.te.model,
                &self.tokenizer,
                prompt,
                &edit.vision,
            )
            .map_err(Error::from)
        })
    }
}
