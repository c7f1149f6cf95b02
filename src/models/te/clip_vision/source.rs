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
//! A fused in_proj [D, 3·D] (ggml order) stacks q, k and v by rows; rows are contiguous in every
//! file format (a quantized row is whole blocks), so each part is served as a byte sub-slice in
//! the file's type. OpenCLIP's `proj` is [width, proj] and used as `x @ P` (OpenCLIP,
//! transformers' conversion script); it is served transposed, as the `Linear` weight
//! transformers stores. GGUF files are read by the store like any other: the names decide.

use std::borrow::Cow;

use crate::dtype::DType;
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

/// How the file names the vision tower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClipVisionLayout {
    /// transformers names with the tower under this prefix (one of `vision_model.`,
    /// `clip_vision.vision_model.`, `cond_stage_model.transformer.vision_model.` or the same
    /// without `vision_model.`).
    Hf(&'static str),
    /// OpenCLIP names under this prefix (`visual.`, `model.visual.`, ... or none).
    OpenClip(&'static str),
}

impl ClipVisionLayout {
    pub fn is_openclip(self) -> bool {
        matches!(self, ClipVisionLayout::OpenClip(_))
    }
}

/// Orientation of a projection matrix as found in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Orientation {
    /// A `Linear` weight: ggml [hidden, proj].
    Linear,
    /// OpenCLIP's `x @ P` matrix: ggml [proj, hidden].
    OpenClip,
}

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
        let hf = HF_LAYOUTS
            .iter()
            .copied()
            .find(|p| inner.contains(&format!("{p}embeddings.patch_embedding.weight")))
            .map(ClipVisionLayout::Hf);
        let openclip = || {
            OPENCLIP_LAYOUTS
                .iter()
                .copied()
                .find(|p| inner.contains(&format!("{p}conv1.weight")))
                .map(ClipVisionLayout::OpenClip)
        };
        let layout = hf
            .or_else(openclip)
            .unwrap_or(ClipVisionLayout::Hf(HF_LAYOUTS[0]));
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
            return self.projection.as_ref().map(|(n, o)| match o {
                Orientation::Linear => Served::Direct(n.clone()),
                Orientation::OpenClip => Served::Transposed(n.clone()),
            });
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
                match qkv_part(inner) {
                    Some((layer, part, leaf)) => Some(Served::Part(
                        format!("{p}encoder.layers.{layer}.self_attn.in_proj.{leaf}"),
                        part,
                    )),
                    None => Some(Served::Direct(direct)),
                }
            }
            ClipVisionLayout::OpenClip(p) => {
                if let Some((layer, part, leaf)) = qkv_part(inner) {
                    let fused = format!("{p}transformer.resblocks.{layer}.attn.in_proj_{leaf}");
                    return Some(Served::Part(fused, part));
                }
                openclip_name(inner).map(|n| Served::Direct(format!("{p}{n}")))
            }
        }
    }

    fn file_name(&self, name: &str) -> Option<String> {
        self.resolve(name).map(|s| match s {
            Served::Direct(n) | Served::Part(n, _) | Served::Transposed(n) => n,
        })
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

/// How a served tensor comes out of the file.
enum Served {
    Direct(String),
    /// Rows `part·D..(part+1)·D` of a fused [D, 3·D] weight (or elements of a [3·D] bias).
    Part(String, usize),
    /// An OpenCLIP projection, transposed.
    Transposed(String),
}

/// `encoder.layers.N.self_attn.{q,k,v}_proj.{weight,bias}` → (N, 0/1/2, leaf).
fn qkv_part(inner: &str) -> Option<(usize, usize, &str)> {
    let rest = inner.strip_prefix("encoder.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    let (proj, leaf) = tail.strip_prefix("self_attn.")?.split_once('.')?;
    let part = match proj {
        "q_proj" => 0,
        "k_proj" => 1,
        "v_proj" => 2,
        _ => return None,
    };
    matches!(leaf, "weight" | "bias").then_some((layer, part, leaf))
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
    let rest = inner.strip_prefix("encoder.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (module, leaf) = tail.rsplit_once('.')?;
    let short = match module {
        "layer_norm1" => "ln_1",
        "layer_norm2" => "ln_2",
        "self_attn.out_proj" => "attn.out_proj",
        "mlp.fc1" => "mlp.c_fc",
        "mlp.fc2" => "mlp.c_proj",
        _ => return None,
    };
    Some(format!("transformer.resblocks.{layer}.{short}.{leaf}"))
}

/// Part `part` of 3 equal row blocks of `t`; served whole (for the declared shape check to
/// report) when it does not split.
fn third(t: SourceTensor<'_>, part: usize) -> SourceTensor<'_> {
    let [ne0, ne1, ne2, ne3] = t.ne;
    let (ne, rows) = if t.n_dims == 1 {
        ([ne0 / 3, 1, 1, 1], ne0)
    } else {
        ([ne0, ne1 / 3, ne2, ne3], ne1)
    };
    let len = t.bytes.len();
    if !rows.is_multiple_of(3) || ne2 != 1 || ne3 != 1 || !len.is_multiple_of(3) {
        return t;
    }
    let range = part * len / 3..(part + 1) * len / 3;
    let bytes = match t.bytes {
        Cow::Borrowed(b) => Cow::Borrowed(&b[range]),
        Cow::Owned(v) => Cow::Owned(v[range].to_vec()),
    };
    SourceTensor { ne, bytes, ..t }
}

/// `t` ([proj, hidden] in ggml order) transposed to [hidden, proj], as f32; `None` when its
/// bytes do not convert.
fn transposed(t: SourceTensor<'_>) -> Option<SourceTensor<'_>> {
    let [cols, rows, ne2, ne3] = t.ne;
    if ne2 != 1 || ne3 != 1 {
        return Some(t);
    }
    let values = (t.to_f32)(&t.bytes).ok()?;
    if values.len() != cols * rows {
        return Some(t);
    }
    let mut out = vec![0f32; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    Some(SourceTensor {
        ne: [rows, cols, 1, 1],
        n_dims: 2,
        ggml_type: Some(DType::F32),
        bytes: Cow::Owned(out.iter().flat_map(|v| v.to_le_bytes()).collect()),
        to_f32: Box::new(|b: &[u8]| {
            Ok(b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        }),
        origin: t.origin,
    })
}

impl WeightSource for ClipVisionSource<'_> {
    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        match self.resolve(name)? {
            Served::Direct(n) => self.inner.tensor(&n),
            Served::Part(n, part) => self.inner.tensor(&n).map(|t| third(t, part)),
            Served::Transposed(n) => self.inner.tensor(&n).and_then(transposed),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.file_name(name)
            .is_some_and(|n| self.inner.contains(&n))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_names_split() {
        assert_eq!(
            qkv_part("encoder.layers.31.self_attn.v_proj.weight"),
            Some((31, 2, "weight"))
        );
        assert_eq!(qkv_part("encoder.layers.1.self_attn.out_proj.bias"), None);
        assert_eq!(qkv_part("encoder.layers.x.self_attn.q_proj.weight"), None);
        assert_eq!(qkv_part("embeddings.class_embedding"), None);
    }

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
            (
                "encoder.layers.0.self_attn.out_proj.bias",
                "transformer.resblocks.0.attn.out_proj.bias",
            ),
            (
                "encoder.layers.2.layer_norm1.weight",
                "transformer.resblocks.2.ln_1.weight",
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
