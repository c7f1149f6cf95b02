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
//! A fused in_proj [D, 3·D] (ggml order) stacks q, k and v by rows; each row is contiguous in
//! every file format (a quantized row is whole blocks), so q/k/v are served as byte sub-slices
//! of it, in the file's own type. Serving them split keeps one model (separate q/k/v linears
//! under HF names, as LoRA files name them) for every layout, at no copy for mapped files.
//!
//! OpenCLIP's `text_projection` is [width, proj] and used as `x @ P`; it is served transposed,
//! as the `Linear` weight transformers stores.

use std::borrow::Cow;

use crate::dtype::DType;
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
}

/// Orientation of a projection matrix as found in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Orientation {
    /// A `Linear` weight: ggml [hidden, proj].
    Linear,
    /// OpenCLIP's `x @ P` matrix: ggml [proj, hidden].
    OpenClip,
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
        let hf = HF_LAYOUTS
            .iter()
            .copied()
            .find(|p| inner.contains(&format!("{p}embeddings.token_embedding.weight")))
            .map(ClipLayout::Hf);
        let openclip = || {
            OPENCLIP_LAYOUTS
                .iter()
                .copied()
                .find(|p| inner.contains(&format!("{p}token_embedding.weight")))
                .map(ClipLayout::OpenClip)
        };
        let layout = hf
            .or_else(openclip)
            .unwrap_or(ClipLayout::Hf(HF_LAYOUTS[0]));
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
            return self.projection.as_ref().map(|(n, o)| match o {
                Orientation::Linear => Served::Direct(n.clone()),
                Orientation::OpenClip => Served::Transposed(n.clone()),
            });
        }
        let inner = name.strip_prefix(TEXT_MODEL)?;
        match self.layout {
            ClipLayout::Hf(p) => {
                let direct = format!("{p}{inner}");
                if self.inner.contains(&direct) {
                    return Some(Served::Direct(direct));
                }
                let (layer, part, leaf) = qkv_part(inner)?;
                Some(Served::Part(
                    format!("{p}encoder.layers.{layer}.self_attn.in_proj.{leaf}"),
                    part,
                ))
            }
            ClipLayout::OpenClip(p) => {
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
    let tail = tail.strip_prefix("self_attn.")?;
    let (proj, leaf) = tail.split_once('.')?;
    let part = match proj {
        "q_proj" => 0,
        "k_proj" => 1,
        "v_proj" => 2,
        _ => return None,
    };
    matches!(leaf, "weight" | "bias").then_some((layer, part, leaf))
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

/// Part `part` of 3 equal row blocks of `t` (rows are contiguous in every format).
fn third(t: SourceTensor<'_>, part: usize) -> SourceTensor<'_> {
    let [ne0, ne1, ne2, ne3] = t.ne;
    let (ne, rows) = if t.n_dims == 1 {
        ([ne0 / 3, 1, 1, 1], ne0)
    } else {
        ([ne0, ne1 / 3, ne2, ne3], ne1)
    };
    let len = t.bytes.len();
    if !rows.is_multiple_of(3) || ne2 != 1 || ne3 != 1 || !len.is_multiple_of(3) {
        // Served whole: the declared shape check reports it.
        return t;
    }
    let range = part * len / 3..(part + 1) * len / 3;
    let bytes = match t.bytes {
        Cow::Borrowed(b) => Cow::Borrowed(&b[range]),
        Cow::Owned(v) => Cow::Owned(v[range].to_vec()),
    };
    SourceTensor { ne, bytes, ..t }
}

/// `t` ([proj, hidden] in ggml order) transposed to [hidden, proj], as f32.
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

impl WeightSource for ClipSource<'_> {
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
            qkv_part("encoder.layers.11.self_attn.k_proj.bias"),
            Some((11, 1, "bias"))
        );
        assert_eq!(qkv_part("encoder.layers.1.self_attn.out_proj.bias"), None);
        assert_eq!(qkv_part("encoder.layers.x.self_attn.q_proj.weight"), None);
    }

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
