//! Editing with reference images: each `-r` image is resized once ([`super::refs`]), VAE-encoded
//! into latent tokens for the transformer's prefix, and read by the Qwen3-VL vision tower whose
//! embeddings fill the prompt's `<|image_pad|>` slots (diffusers `QwenImage21Pipeline` with
//! `image=`). Both conditions of CFG see the same references.

use std::hash::{Hash, Hasher};

use crate::error::{Error, Result};
use crate::image_io::Image;
use crate::models::dit::qwen_image_2_1::PrefixLayout;
use crate::models::te::qwen3::VisionEmbeds;
use crate::models::vae::tiling::TileSettings;
pub(super) use crate::pipeline::qwen3_vision::Vision;
use crate::progress::Progress;
use crate::tensor::HostTensor;

use super::refs::{prepare_reference, reference_size};
use super::template::encode_edit_prompt;
use super::{PromptCondition, QwenImage21Pipeline};

/// An edit prompt's encoder rows [hidden, L] and which rows are image slots.
pub(super) type EditEmbedding = (HostTensor, Vec<bool>);

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
