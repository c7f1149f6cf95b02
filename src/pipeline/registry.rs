//! The families this build runs. Adding a family is its folder under `pipeline/` and one line
//! in [`FAMILIES`].

use super::components::ComponentStore;
use super::family::Family;
use super::flux::{ChromaFamily, FluxFamily};
use super::minimax_h3::MiniMaxH3Family;
use super::model_args::{ModelArg, ModelArgSpec};
use super::pixart::PixArtFamily;
use super::qwen_image::QwenImageFamily;
use super::qwen_image_2_1::QwenImage21Family;
use super::sd::{SD, SDXL};
use super::sd3::Sd3Family;
use super::wan::WanFamily;
use super::z_image::ZImageFamily;
use crate::weights::TensorStore;

/// Every family, in detection order.
pub static FAMILIES: &[&dyn Family] = &[
    &PixArtFamily,
    &QwenImage21Family,
    &FluxFamily,
    &ChromaFamily,
    &Sd3Family,
    &ZImageFamily,
    &QwenImageFamily,
    &WanFamily,
    &MiniMaxH3Family,
    &SD,
    &SDXL,
];

/// The family whose diffusion model `diffusion` is.
pub fn detect(diffusion: &ComponentStore) -> Option<&'static dyn Family> {
    FAMILIES.iter().copied().find(|f| f.detect(diffusion))
}

/// "PixArt-α/Σ, Qwen Image 2.1": the families, for messages.
pub fn supported_names() -> String {
    FAMILIES
        .iter()
        .map(|f| f.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keys upstream defines for families this build does not run yet: accepted and validated
/// so existing scripts keep working; each moves into its family's entry when it lands.
mod upcoming {
    use super::ModelArg;

    pub const QWEN_IMAGE_ZERO_COND_T: ModelArg<bool> = ModelArg::new(
        "qwen_image_zero_cond_t",
        false,
        "Qwen Image Edit 2511: condition on timestep zero",
    );
}

const UPCOMING: [&dyn ModelArgSpec; 1] = [&upcoming::QWEN_IMAGE_ZERO_COND_T];

/// Every `--model-args` key: the families' own, then the upcoming ones.
pub fn model_arg_specs() -> Vec<&'static dyn ModelArgSpec> {
    FAMILIES
        .iter()
        .flat_map(|f| f.model_args().iter().copied())
        .chain(UPCOMING)
        .collect()
}

/// What the tensors under `prefix` look like when they are no family's diffusion model (a
/// text encoder or VAE given in the diffusion model's place), from their names; for messages.
pub fn what_it_is(store: &TensorStore, prefix: &str) -> Option<&'static str> {
    let has = |n: &str| store.contains(&format!("{prefix}{n}"));
    let any = |p: &str| {
        let p = format!("{prefix}{p}");
        store.iter().any(|t| t.name.starts_with(&p))
    };
    if any("encoder.block.0.layer.0.SelfAttention.") || any("enc.blk.0.attn_q.") {
        Some("a T5 text encoder (pass it with --t5xxl)")
    } else if any("text_model.encoder.layers.")
        || any("encoder.layers.0.self_attn.")
        || any("transformer.resblocks.")
    {
        Some("a CLIP text encoder (pass it with --clip_l, or --clip_g for SDXL's second)")
    } else if has("decoder.conv_in.weight") || has("encoder.conv_in.weight") {
        Some("a VAE (pass it with --vae)")
    } else if any("model.language_model.") || any("blk.0.attn_q.") || has("embed_tokens.weight") {
        Some("a language model (pass it with --llm)")
    } else {
        None
    }
}
