//! How the CLIP text and vision sources serve a transformers name from a file that spells it
//! otherwise: under another name, as a third of a fused in_proj, or transposed. Both towers
//! share transformers' encoder names and OpenCLIP's `transformer.resblocks.N.*`, so the layer
//! renames live here too.
//!
//! A fused in_proj [D, 3·D] (ggml order) stacks q, k and v by rows; rows are contiguous in every
//! file format (a quantized row is whole blocks), so each part is served as a byte sub-slice in
//! the file's type, at no copy for mapped files.

use std::borrow::Cow;

use crate::dtype::DType;
use crate::runner::{SourceTensor, StoreSource, WeightSource};

/// Orientation of a projection matrix as found in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Orientation {
    /// A `Linear` weight: ggml [hidden, proj].
    Linear,
    /// OpenCLIP's `x @ P` matrix: ggml [proj, hidden].
    OpenClip,
}

/// How a served tensor comes out of the file.
pub(crate) enum Served {
    Direct(String),
    /// Rows `part·D..(part+1)·D` of a fused [D, 3·D] weight (or elements of a [3·D] bias).
    Part(String, usize),
    /// An OpenCLIP projection, transposed.
    Transposed(String),
}

impl Served {
    /// The projection as the file holds it: a `Linear` weight as is, OpenCLIP's transposed.
    pub(crate) fn projection(found: Option<&(String, Orientation)>) -> Option<Self> {
        found.map(|(n, o)| match o {
            Orientation::Linear => Served::Direct(n.clone()),
            Orientation::OpenClip => Served::Transposed(n.clone()),
        })
    }

    /// A q/k/v name (`encoder.layers.N.self_attn.{q,k,v}_proj.*`) as its part of the fused
    /// `self_attn.in_proj.*` that stable-diffusion.cpp's converter keeps, under `prefix`.
    pub(crate) fn hf_fused(prefix: &str, inner: &str) -> Option<Self> {
        let (layer, part, leaf) = qkv_part(inner)?;
        let fused = format!("{prefix}encoder.layers.{layer}.self_attn.in_proj.{leaf}");
        Some(Served::Part(fused, part))
    }

    /// A q/k/v name as its part of OpenCLIP's `attn.in_proj_*`, under `prefix`.
    pub(crate) fn openclip_fused(prefix: &str, inner: &str) -> Option<Self> {
        let (layer, part, leaf) = qkv_part(inner)?;
        let fused = format!("{prefix}transformer.resblocks.{layer}.attn.in_proj_{leaf}");
        Some(Served::Part(fused, part))
    }

    /// The file's name of the tensor served.
    pub(crate) fn file_name(&self) -> &str {
        match self {
            Served::Direct(n) | Served::Part(n, _) | Served::Transposed(n) => n,
        }
    }

    /// The tensor from `inner`, split or transposed as said.
    pub(crate) fn tensor<'a>(&self, inner: &'a StoreSource<'_>) -> Option<SourceTensor<'a>> {
        match self {
            Served::Direct(n) => inner.tensor(n),
            Served::Part(n, part) => inner.tensor(n).map(|t| third(t, *part)),
            Served::Transposed(n) => inner.tensor(n).and_then(transposed),
        }
    }
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

/// transformers encoder-layer name → OpenCLIP name, for the one-to-one renames (q/k/v are
/// fused in OpenCLIP: [`Served::openclip_fused`]). Layer map as in stable-diffusion.cpp's
/// `convert_open_clip_to_hf_clip_name`.
pub(crate) fn openclip_layer_name(inner: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qkv_names_split() {
        assert_eq!(
            qkv_part("encoder.layers.11.self_attn.k_proj.bias"),
            Some((11, 1, "bias"))
        );
        assert_eq!(
            qkv_part("encoder.layers.31.self_attn.v_proj.weight"),
            Some((31, 2, "weight"))
        );
        assert_eq!(qkv_part("encoder.layers.1.self_attn.out_proj.bias"), None);
        assert_eq!(qkv_part("encoder.layers.x.self_attn.q_proj.weight"), None);
        assert_eq!(qkv_part("embeddings.class_embedding"), None);
    }

    #[test]
    fn openclip_layer_renames() {
        let cases = [
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
            assert_eq!(openclip_layer_name(hf).as_deref(), Some(oc), "{hf}");
        }
        assert_eq!(
            openclip_layer_name("encoder.layers.3.self_attn.q_proj.weight"),
            None
        );
    }
}
