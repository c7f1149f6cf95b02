//! A weight source serving a CLIP text encoder under transformers' names whatever the file used.
//!
//! The model asks for `text_model.embeddings.token_embedding.weight`,
//! `text_model.encoder.layers.N.self_attn.q_proj.weight`, ..., `text_model.final_layer_norm.*`
//! and `text_projection.weight` (a `Linear` weight, [hidden, proj] in ggml order). Files say:
//!
//! - transformers / diffusers: `text_model.*` + `text_projection.weight` (transformers 4, and
//!   `CLIPTextModelWithProjection` in 5), bare `embeddings.*`, `encoder.*` (transformers 5
//!   `CLIPTextModel`), or `transformer.text_model.*` when the component prefix stops one level
//!   higher;
//! - OpenCLIP (SD2 `cond_stage_model.model.*`, SDXL `conditioner.embedders.1.model.*`):
//!   `token_embedding.weight`, `positional_embedding`, `transformer.resblocks.N.{ln_1, ln_2,
//!   attn.in_proj_weight, attn.in_proj_bias, attn.out_proj, mlp.c_fc, mlp.c_proj}`, `ln_final`,
//!   `text_projection` (with or without the `model.` level);
//! - GGUF files written by stable-diffusion.cpp's converter: its HF-style names
//!   (`name_conversion.cpp`), where an OpenCLIP origin keeps the fused
//!   `self_attn.in_proj.{weight,bias}` and the projection is `text_model.text_projection`.
//!
//! A fused in_proj is served split into q/k/v (`served.rs`): that keeps one model (separate q/k/v
//! linears under HF names, as LoRA files name them) for every layout.
//!
//! OpenCLIP's `text_projection` is [width, proj] and used as `x @ P`; it is served transposed,
//! as the `Linear` weight transformers stores.

use super::served::{openclip_layer_name, Orientation, Served};
use crate::runner::{SourceTensor, StoreSource, WeightSource};
use crate::weights::TensorStore;

/// The served name of the projection weight.
pub const PROJECTION: &str = "text_projection.weight";

/// The served prefix of every other weight.
const TEXT_MODEL: &str = "text_model.";

/// Where transformers-style files keep the text tower, tried in order.
const HF_LAYOUTS: [&str; 3] = ["text_model.", "transformer.text_model.", ""];

/// Where OpenCLIP files keep it.
const OPENCLIP_LAYOUTS: [&str; 2] = ["model.", ""];

/// How the file names the text tower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClipLayout {
    /// transformers names under this prefix (one of `text_model.`, `transformer.text_model.`,
    /// or none).
    Hf(&'static str),
    /// OpenCLIP names under this prefix (`model.` or none).
    OpenClip(&'static str),
}

impl ClipLayout {
    pub fn is_openclip(self) -> bool {
        matches!(self, ClipLayout::OpenClip(_))
    }

    /// The first transformers prefix under which `inner` has `{prefix}{probe}`, else the first
    /// such OpenCLIP prefix, else the first transformers one (so errors name the transformers
    /// key). Shared with the vision tower, which probes its own names.
    pub(crate) fn detect(
        inner: &StoreSource<'_>,
        (hf, hf_probe): (&[&'static str], &str),
        (openclip, openclip_probe): (&[&'static str], &str),
    ) -> Self {
        let under = |prefixes: &[&'static str], probe: &str| {
            prefixes
                .iter()
                .copied()
                .find(|p| inner.contains(&format!("{p}{probe}")))
        };
        under(hf, hf_probe)
            .map(ClipLayout::Hf)
            .or_else(|| under(openclip, openclip_probe).map(ClipLayout::OpenClip))
            .unwrap_or(ClipLayout::Hf(hf[0]))
    }
}

/// CLIP text weights from a [`TensorStore`] under `prefix`, looked up by transformers names.
pub struct ClipSource<'s> {
    inner: StoreSource<'s>,
    layout: ClipLayout,
    /// The file's projection and whether it is served transposed.
    projection: Option<(String, Orientation)>,
}

impl<'s> ClipSource<'s> {
    /// Detects the layout of the tensors under `prefix` (the component prefix, stripped; e.g.
    /// `cond_stage_model.transformer.` for SD1 single files). With nothing recognisable the
    /// layout defaults to `text_model.` names, so errors name the transformers key.
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        let inner = StoreSource::new(store, prefix);
        let layout = ClipLayout::detect(
            &inner,
            (&HF_LAYOUTS, "embeddings.token_embedding.weight"),
            (&OPENCLIP_LAYOUTS, "token_embedding.weight"),
        );
        let projection = find_projection(store, prefix, layout);
        Self {
            inner,
            layout,
            projection,
        }
    }

    /// The layout found in the file.
    pub fn layout(&self) -> ClipLayout {
        self.layout
    }

    /// The file's name of a served tensor, or a split / transposed form of one.
    fn resolve(&self, name: &str) -> Option<Served> {
        if name == PROJECTION {
            return Served::projection(self.projection.as_ref());
        }
        let inner = name.strip_prefix(TEXT_MODEL)?;
        match self.layout {
            ClipLayout::Hf(p) => {
                let direct = format!("{p}{inner}");
                if self.inner.contains(&direct) {
                    return Some(Served::Direct(direct));
                }
                Served::hf_fused(p, inner)
            }
            ClipLayout::OpenClip(p) => Served::openclip_fused(p, inner)
                .or_else(|| openclip_name(inner).map(|n| Served::Direct(format!("{p}{n}")))),
        }
    }
}

/// The projection under whichever name the file used (relative to `prefix`), and its
/// orientation.
fn find_projection(
    store: &TensorStore,
    prefix: &str,
    layout: ClipLayout,
) -> Option<(String, Orientation)> {
    let ne = |name: &str| store.get(&format!("{prefix}{name}")).map(|t| t.ne);
    let (table, candidates) = match layout {
        ClipLayout::OpenClip(p) => (
            format!("{p}token_embedding.weight"),
            vec![(format!("{p}text_projection"), Some(Orientation::OpenClip))],
        ),
        ClipLayout::Hf(p) => {
            let parent = p.strip_suffix(TEXT_MODEL).unwrap_or(p);
            (
                format!("{p}embeddings.token_embedding.weight"),
                vec![
                    (format!("{parent}{PROJECTION}"), Some(Orientation::Linear)),
                    // stable-diffusion.cpp's converter keeps the source's orientation.
                    (format!("{p}text_projection"), None),
                ],
            )
        }
    };
    let (name, known) = candidates.into_iter().find(|(n, _)| ne(n).is_some())?;
    let orientation = known.unwrap_or_else(|| {
        // From the shape when not square (a `Linear` weight is [hidden, proj]), else from the
        // origin: only an OpenCLIP source leaves a fused in_proj.
        let hidden = ne(&table).map(|t| t[0]);
        match (ne(&name), hidden) {
            (Some([a, b, ..]), Some(h)) if a != b && b == h => Orientation::OpenClip,
            (Some([a, b, ..]), Some(h)) if a != b && a == h => Orientation::Linear,
            _ if store
                .with_prefix(prefix)
                .any(|t| t.name.contains(".self_attn.in_proj.")) =>
            {
                Orientation::OpenClip
            }
            _ => Orientation::Linear,
        }
    });
    Some((name, orientation))
}

/// transformers name (inside `text_model.`) → OpenCLIP name, for the one-to-one renames.
/// Layer map as in stable-diffusion.cpp's `convert_open_clip_to_hf_clip_name`.
fn openclip_name(inner: &str) -> Option<String> {
    match inner {
        "embeddings.token_embedding.weight" => return Some("token_embedding.weight".into()),
        "embeddings.position_embedding.weight" => return Some("positional_embedding".into()),
        _ => {}
    }
    if let Some(leaf) = inner.strip_prefix("final_layer_norm.") {
        return Some(format!("ln_final.{leaf}"));
    }
    openclip_layer_name(inner)
}

impl WeightSource for ClipSource<'_> {
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
        assert_eq!(
            openclip_name("encoder.layers.3.mlp.fc2.weight").as_deref(),
            Some("transformer.resblocks.3.mlp.c_proj.weight")
        );
        assert_eq!(
            openclip_name("final_layer_norm.bias").as_deref(),
            Some("ln_final.bias")
        );
        assert_eq!(
            openclip_name("embeddings.position_embedding.weight").as_deref(),
            Some("positional_embedding")
        );
        assert_eq!(
            openclip_name("encoder.layers.3.self_attn.q_proj.weight"),
            None
        );
    }
}
