//! A weight source serving a CLIP vision tower under transformers' names whatever the file used.
//!
//! The model asks for `vision_model.embeddings.{patch_embedding.weight, class_embedding,
//! position_embedding.weight}`, `vision_model.pre_layrnorm.*`,
//! `vision_model.encoder.layers.N.{layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2,
//! mlp.fc1, mlp.fc2}.*`, `vision_model.post_layernorm.*` and `visual_projection.weight` (a
//! `Linear` weight, [hidden, proj] in ggml order). Files say:
//!
//! - transformers (`CLIPVisionModel(WithProjection)`, ComfyUI's `clip_vision_h.safetensors`):
//!   `vision_model.*` + `visual_projection.weight`, or bare `embeddings.*`, `encoder.*`,
//!   `pre_layrnorm.*`; under no outer prefix, `clip_vision.` (stable-diffusion.cpp's load
//!   prefix, which it keeps when a name already has it) or `cond_stage_model.transformer.`
//!   (what it maps `clip_vision.` to); `pre_layernorm` (stable-diffusion.cpp's spelling) is
//!   read too, and so is `vision_model.visual_projection.weight` (its converter's alias).
//!   A fused `self_attn.in_proj.{weight,bias}` (an OpenCLIP origin converted by
//!   stable-diffusion.cpp) is split as below.
//! - OpenCLIP (`visual.*`, `model.visual.*`, or bare): `conv1.weight`, `class_embedding`,
//!   `positional_embedding`, `ln_pre`, `transformer.resblocks.N.{ln_1, attn.in_proj_weight,
//!   attn.in_proj_bias, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}`, `ln_post`, `proj`.
//!
//! A fused in_proj is served split into q/k/v, as for the text tower (`clip/served.rs`).
//! OpenCLIP's `proj` is [width, proj] and used as `x @ P` (OpenCLIP, transformers' conversion
//! script); it is served transposed, as the `Linear` weight transformers stores. GGUF files are
//! read by the store like any other: the names decide.

use crate::models::te::clip::served::{openclip_layer_name, Orientation, Served};
use crate::models::te::clip::ClipLayout;
use crate::runner::{SourceTensor, StoreSource, WeightSource};
use crate::weights::TensorStore;

/// The served prefix of every tower weight.
pub const TOWER: &str = "vision_model.";

/// The served name of the projection weight.
pub const PROJECTION: &str = "visual_projection.weight";

/// Where transformers-style files keep the tower, tried in order.
const HF_LAYOUTS: [&str; 6] = [
    "vision_model.",
    "clip_vision.vision_model.",
    "cond_stage_model.transformer.vision_model.",
    "",
    "clip_vision.",
    "cond_stage_model.transformer.",
];

/// Where OpenCLIP files keep it, tried in order.
const OPENCLIP_LAYOUTS: [&str; 5] = [
    "visual.",
    "model.visual.",
    "clip_vision.visual.",
    "clip_vision.model.visual.",
    "",
];

/// How the file names the vision tower: transformers names with the tower under `Hf`'s prefix
/// (one of `vision_model.`, `clip_vision.vision_model.`,
/// `cond_stage_model.transformer.vision_model.` or the same without `vision_model.`), or
/// OpenCLIP names under `OpenClip`'s (`visual.`, `model.visual.`, ... or none). The text
/// tower's enum, as the two differ only in prefixes.
pub type ClipVisionLayout = ClipLayout;

/// CLIP vision weights from a [`TensorStore`] under `prefix`, looked up by transformers names.
pub struct ClipVisionSource<'s> {
    inner: StoreSource<'s>,
    layout: ClipVisionLayout,
    /// The file's projection and how it is served.
    projection: Option<(String, Orientation)>,
}

impl<'s> ClipVisionSource<'s> {
    /// Detects the layout of the tensors under `prefix` (stripped; `""` for a file opened on
    /// its own). With nothing recognisable the layout defaults to `vision_model.` names, so
    /// errors name the transformers key.
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        let inner = StoreSource::new(store, prefix);
        let layout = ClipLayout::detect(
            &inner,
            (&HF_LAYOUTS, "embeddings.patch_embedding.weight"),
            (&OPENCLIP_LAYOUTS, "conv1.weight"),
        );
        let projection = find_projection(store, prefix, layout);
        Self {
            inner,
            layout,
            projection,
        }
    }

    /// The layout found in the file.
    pub fn layout(&self) -> ClipVisionLayout {
        self.layout
    }

    /// The file's name of a served tensor, or a split / transposed form of one.
    fn resolve(&self, name: &str) -> Option<Served> {
        if name == PROJECTION {
            return Served::projection(self.projection.as_ref());
        }
        let inner = name.strip_prefix(TOWER)?;
        match self.layout {
            ClipVisionLayout::Hf(p) => {
                let direct = format!("{p}{inner}");
                if self.inner.contains(&direct) {
                    return Some(Served::Direct(direct));
                }
                if let Some(leaf) = inner.strip_prefix("pre_layrnorm.") {
                    return Some(Served::Direct(format!("{p}pre_layernorm.{leaf}")));
                }
                Some(Served::hf_fused(p, inner).unwrap_or(Served::Direct(direct)))
            }
            ClipVisionLayout::OpenClip(p) => Served::openclip_fused(p, inner)
                .or_else(|| openclip_name(inner).map(|n| Served::Direct(format!("{p}{n}")))),
        }
    }
}

/// The projection under whichever name the file used, and its orientation: by the shape when
/// it is not square (a `Linear` weight is [hidden, proj]), else by the name's origin.
fn find_projection(
    store: &TensorStore,
    prefix: &str,
    layout: ClipVisionLayout,
) -> Option<(String, Orientation)> {
    let ne = |name: &str| store.get(&format!("{prefix}{name}")).map(|t| t.ne);
    let (class, candidates) = match layout {
        ClipVisionLayout::OpenClip(p) => (
            format!("{p}class_embedding"),
            vec![(format!("{p}proj"), Orientation::OpenClip)],
        ),
        ClipVisionLayout::Hf(p) => {
            let parent = p.strip_suffix(TOWER).unwrap_or(p);
            (
                format!("{p}embeddings.class_embedding"),
                vec![
                    (format!("{parent}{PROJECTION}"), Orientation::Linear),
                    (format!("{p}{PROJECTION}"), Orientation::Linear),
                ],
            )
        }
    };
    let (name, by_origin) = candidates.into_iter().find(|(n, _)| ne(n).is_some())?;
    let hidden = ne(&class).map(|t| t[0]);
    let orientation = match (ne(&name), hidden) {
        (Some([a, b, ..]), Some(h)) if a != b && b == h => Orientation::OpenClip,
        (Some([a, b, ..]), Some(h)) if a != b && a == h => Orientation::Linear,
        _ => by_origin,
    };
    Some((name, orientation))
}

/// transformers name (inside `vision_model.`) → OpenCLIP name, for the one-to-one renames
/// (as stable-diffusion.cpp's `convert_open_clip_to_hf_clip_name` maps them back).
fn openclip_name(inner: &str) -> Option<String> {
    let fixed = match inner {
        "embeddings.patch_embedding.weight" => Some("conv1.weight"),
        "embeddings.class_embedding" => Some("class_embedding"),
        "embeddings.position_embedding.weight" => Some("positional_embedding"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.into());
    }
    if let Some(leaf) = inner.strip_prefix("pre_layrnorm.") {
        return Some(format!("ln_pre.{leaf}"));
    }
    if let Some(leaf) = inner.strip_prefix("post_layernorm.") {
        return Some(format!("ln_post.{leaf}"));
    }
    openclip_layer_name(inner)
}

impl WeightSource for ClipVisionSource<'_> {
    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        self.resolve(name)?.tensor(&self.inner)
    }

    fn contains(&self, name: &str) -> bool {
        self.resolve(name)
            .is_some_and(|s| self.inner.contains(s.file_name()))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openclip_renames() {
        let cases = [
            ("embeddings.patch_embedding.weight", "conv1.weight"),
            ("embeddings.class_embedding", "class_embedding"),
            (
                "embeddings.position_embedding.weight",
                "positional_embedding",
            ),
            ("pre_layrnorm.bias", "ln_pre.bias"),
            ("post_layernorm.weight", "ln_post.weight"),
            (
                "encoder.layers.3.mlp.fc2.weight",
                "transformer.resblocks.3.mlp.c_proj.weight",
            ),
        ];
        for (hf, oc) in cases {
            assert_eq!(openclip_name(hf).as_deref(), Some(oc), "{hf}");
        }
        assert_eq!(
            openclip_name("encoder.layers.3.self_attn.q_proj.weight"),
            None
        );
    }
}
