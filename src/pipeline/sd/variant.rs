//! Which Stable Diffusion generation a UNet belongs to, from its tensors (LDM single-file or
//! diffusers names).
//!
//! Upstream tells SD1 from SD2 by the text encoder's width (768 / 1024), which says nothing
//! for models of other widths; the UNet itself says it as well: SD2's transformers project in
//! and out with linear layers (`use_linear_projection`), SD1's with 1×1 convolutions. SDXL has
//! the added (pooled text + size) embedding.

use crate::pipeline::components::{ComponentId, ComponentStore};

/// A Stable Diffusion generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdVersion {
    /// SD 1.x: CLIP ViT-L, conv projections in the transformers.
    Sd1,
    /// SD 2.x: OpenCLIP ViT-H, linear projections.
    Sd2,
    /// SDXL (base, and the refiner when it has no CLIP-L).
    Sdxl,
}

impl SdVersion {
    /// Upstream's default `--clip-skip`: the last layer for SD1, the penultimate for SD2/SDXL.
    pub fn default_clip_skip(self) -> u32 {
        match self {
            SdVersion::Sd1 => 1,
            SdVersion::Sd2 | SdVersion::Sdxl => 2,
        }
    }

    /// The VAE's latent scale (SDXL's VAE has its own).
    pub fn vae_scale(self) -> f32 {
        match self {
            SdVersion::Sd1 | SdVersion::Sd2 => 0.18215,
            SdVersion::Sdxl => 0.13025,
        }
    }
}

/// Whether the diffusion model is a conditional UNet, and which generation; `None` for
/// anything else (DiTs, and UNet families this build does not run: SVD's temporal mixers).
pub fn detect(diffusion: &ComponentStore) -> Option<SdVersion> {
    let root = diffusion.root(ComponentId::Diffusion);
    let store = &diffusion.store;
    let has = |n: &str| store.contains(&format!("{root}{n}"));
    let ldm = has("input_blocks.0.0.weight") && has("time_embed.0.weight");
    let diffusers = has("conv_in.weight")
        && has("time_embedding.linear_1.weight")
        && diffusion.has_prefix(&format!("{root}down_blocks."));
    if !(ldm || diffusers) || has("input_blocks.8.0.time_mixer.mix_factor") {
        return None;
    }
    if has("label_emb.0.0.weight") || has("add_embedding.linear_1.weight") {
        return Some(SdVersion::Sdxl);
    }
    // The first transformer's input projection: 2-D (linear) in SD2, 4-D (1×1 conv) in SD1.
    let linear = store
        .with_prefix(&root)
        .find(|t| t.name.ends_with(".proj_in.weight"))
        .is_some_and(|t| t.n_dims == 2);
    Some(if linear {
        SdVersion::Sd2
    } else {
        SdVersion::Sd1
    })
}
