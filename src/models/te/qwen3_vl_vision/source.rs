//! A weight source serving the Qwen3-VL vision tower under transformers' names relative to
//! `visual.` (`patch_embed.proj.weight`, `blocks.N.attn.qkv.weight`, `merger.linear_fc1.weight`,
//! `deepstack_merger_list.J.norm.weight`, ...) whatever the file used:
//!
//! - transformers safetensors: `model.visual.*` (transformers 5 `Qwen3VLForConditionalGeneration`
//!   and the hub checkpoints), `visual.*`, or bare names;
//! - a llama.cpp mmproj GGUF (`v.blk.N.attn_qkv`, `v.patch_embd.weight` + `.weight.1`, `mm.0`,
//!   `v.post_ln`, `v.deepstack.L.fc1`, ...).
//!
//! The Conv3d patch embedding is served as one matrix `[3·T·P·P, hidden]` (ggml order): a row
//! is the flattened (channel, frame, y, x) patch vector the image processor makes. llama.cpp
//! splits the kernel into one 2-D kernel per frame; those are re-interleaved here. Split
//! `attn_q` / `attn_k` / `attn_v` tensors are concatenated into the fused `qkv`.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::dtype::DType;
use crate::runner::{SourceTensor, StoreSource, WeightSource};
use crate::weights::TensorStore;

/// Name prefixes under which safetensors files keep the vision tower, tried in order.
const LAYOUT_PREFIXES: [&str; 3] = ["model.visual.", "visual.", ""];

/// The input channels of the patch embedding (RGB).
pub const IN_CHANNELS: usize = 3;

/// The served name of the patch-embedding matrix.
pub const PATCH_WEIGHT: &str = "patch_embed.proj.weight";

/// llama.cpp mmproj name → transformers name (relative to `visual.`), for the names that map
/// one to one; `deepstack` lists the absolute layer index of each deepstack merger in order
/// (llama.cpp names them by layer, transformers by position in the list).
pub fn qwen3_vl_vision_llamacpp_to_hf(name: &str, deepstack: &[usize]) -> Option<String> {
    let fixed = match name {
        "v.position_embd.weight" => Some("pos_embed.weight"),
        "v.patch_embd.bias" => Some("patch_embed.proj.bias"),
        "v.post_ln.weight" => Some("merger.norm.weight"),
        "v.post_ln.bias" => Some("merger.norm.bias"),
        "mm.0.weight" => Some("merger.linear_fc1.weight"),
        "mm.0.bias" => Some("merger.linear_fc1.bias"),
        "mm.2.weight" => Some("merger.linear_fc2.weight"),
        "mm.2.bias" => Some("merger.linear_fc2.bias"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let (module, leaf) = name.rsplit_once('.')?;
    if leaf != "weight" && leaf != "bias" {
        return None;
    }
    if let Some(rest) = module.strip_prefix("v.blk.") {
        let (i, short) = rest.split_once('.')?;
        let i: usize = i.parse().ok()?;
        let long = match short {
            "ln1" => "norm1",
            "ln2" => "norm2",
            "attn_qkv" => "attn.qkv",
            "attn_out" => "attn.proj",
            "ffn_up" => "mlp.linear_fc1",
            "ffn_down" => "mlp.linear_fc2",
            _ => return None,
        };
        return Some(format!("blocks.{i}.{long}.{leaf}"));
    }
    if let Some(rest) = module.strip_prefix("v.deepstack.") {
        let (layer, short) = rest.split_once('.')?;
        let layer: usize = layer.parse().ok()?;
        let j = deepstack.iter().position(|&l| l == layer)?;
        let long = match short {
            "norm" => "norm",
            "fc1" => "linear_fc1",
            "fc2" => "linear_fc2",
            _ => return None,
        };
        return Some(format!("deepstack_merger_list.{j}.{long}.{leaf}"));
    }
    None
}

/// The absolute layer indices of the `v.deepstack.L.*` tensors under `prefix`, ascending.
pub fn llamacpp_deepstack_layers(store: &TensorStore, prefix: &str) -> Vec<usize> {
    let mut layers: Vec<usize> = store
        .with_prefix(prefix)
        .filter_map(|t| {
            let rest = t.name[prefix.len()..].strip_prefix("v.deepstack.")?;
            rest.split_once('.')?.0.parse().ok()
        })
        .collect();
    layers.sort_unstable();
    layers.dedup();
    layers
}

/// Serves a Qwen3-VL vision tower's weights under transformers names (see the module docs).
pub struct Qwen3VlVisionSource<'s> {
    inner: StoreSource<'s>,
    /// The safetensors layout prefix found (one of [`LAYOUT_PREFIXES`]).
    layout: &'static str,
    /// transformers name → llama.cpp name, for one-to-one renames.
    renamed: HashMap<String, String>,
    llamacpp: bool,
    deepstack_layers: Vec<usize>,
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32_from_le(bytes: &[u8]) -> Result<Vec<f32>, String> {
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

impl<'s> Qwen3VlVisionSource<'s> {
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        let inner = StoreSource::new(store, prefix);
        let llamacpp =
            inner.contains("v.position_embd.weight") || inner.contains("v.patch_embd.weight");
        let layout = LAYOUT_PREFIXES
            .iter()
            .copied()
            .find(|p| inner.contains(&format!("{p}pos_embed.weight")))
            .unwrap_or("");
        let deepstack_layers = if llamacpp {
            llamacpp_deepstack_layers(store, prefix)
        } else {
            Vec::new()
        };
        let renamed = if llamacpp {
            store
                .with_prefix(prefix)
                .filter_map(|t| {
                    let local = &t.name[prefix.len()..];
                    qwen3_vl_vision_llamacpp_to_hf(local, &deepstack_layers)
                        .map(|hf| (hf, local.to_string()))
                })
                .collect()
        } else {
            HashMap::new()
        };
        Self {
            inner,
            layout,
            renamed,
            llamacpp,
            deepstack_layers,
        }
    }

    /// Whether the weights use llama.cpp mmproj names.
    pub fn is_llamacpp(&self) -> bool {
        self.llamacpp
    }

    /// For llama.cpp files: the absolute block index of each deepstack merger, in order.
    pub fn llamacpp_deepstack_layers(&self) -> &[usize] {
        &self.deepstack_layers
    }

    fn resolve(&self, name: &str) -> String {
        if self.llamacpp {
            if let Some(n) = self.renamed.get(name) {
                return n.clone();
            }
        }
        format!("{}{name}", self.layout)
    }

    /// The patch-embedding matrix [3·T·P·P, hidden].
    fn patch_weight(&self) -> Option<SourceTensor<'_>> {
        if !self.llamacpp {
            // A Conv3d [O, 3, T, P, P] arrives folded as ggml [P, P, T, 3·O]; the memory is
            // already the [O, 3·T·P·P] matrix.
            let mut t = self.inner.tensor(&self.resolve(PATCH_WEIGHT))?;
            let [p0, p1, frames, oi] = t.ne;
            if t.n_dims == 2 {
                return Some(t);
            }
            if !oi.is_multiple_of(IN_CHANNELS) {
                return Some(t); // the declared shape check reports it
            }
            t.ne = [p0 * p1 * frames * IN_CHANNELS, oi / IN_CHANNELS, 1, 1];
            t.n_dims = 2;
            return Some(t);
        }
        let first = self.inner.tensor("v.patch_embd.weight")?;
        let Some(second) = self.inner.tensor("v.patch_embd.weight.1") else {
            // A single kernel: one frame only, or already the full matrix.
            return Some(first);
        };
        // Two 2-D kernels [P, P, 3, O] (frame 0, frame 1) → rows (c, t, y, x).
        let [px, py, ch, out] = first.ne;
        if second.ne != first.ne {
            return Some(first); // shape check reports the mismatch
        }
        let origin = first.origin.clone();
        let a = (first.to_f32)(&first.bytes);
        let b = (second.to_f32)(&second.bytes);
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) if a.len() == px * py * ch * out && b.len() == a.len() => (a, b),
            _ => return Some(first),
        };
        let plane = px * py;
        let mut rows = Vec::with_capacity(2 * a.len());
        for oc in 0..out * ch {
            let at = oc * plane;
            rows.extend_from_slice(&a[at..at + plane]);
            rows.extend_from_slice(&b[at..at + plane]);
        }
        Some(SourceTensor {
            ne: [2 * plane * ch, out, 1, 1],
            n_dims: 2,
            ggml_type: Some(DType::F32),
            bytes: Cow::Owned(f32_bytes(&rows)),
            to_f32: Box::new(f32_from_le),
            origin,
        })
    }

    /// A fused qkv weight/bias from llama.cpp's split `attn_q/k/v` tensors.
    fn split_qkv(&self, block: usize, leaf: &str) -> Option<SourceTensor<'_>> {
        let parts: Vec<SourceTensor<'_>> = ["attn_q", "attn_k", "attn_v"]
            .iter()
            .map(|p| self.inner.tensor(&format!("v.blk.{block}.{p}.{leaf}")))
            .collect::<Option<_>>()?;
        let ne = parts[0].ne;
        if parts.iter().any(|p| p.ne != ne) || ne[2] != 1 || ne[3] != 1 {
            return None;
        }
        let mut values = Vec::new();
        for p in &parts {
            values.extend((p.to_f32)(&p.bytes).ok()?);
        }
        Some(SourceTensor {
            ne: [ne[0], ne[1] * 3, 1, 1].map(|d| d.max(1)),
            n_dims: parts[0].n_dims,
            ggml_type: Some(DType::F32),
            bytes: Cow::Owned(f32_bytes(&values)),
            to_f32: Box::new(f32_from_le),
            origin: parts[0].origin.clone(),
        })
        .map(|mut t| {
            if t.n_dims == 1 {
                // a bias: [3·dim]
                t.ne = [ne[0] * 3, 1, 1, 1];
            }
            t
        })
    }

    fn qkv_block(name: &str) -> Option<(usize, &str)> {
        let rest = name.strip_prefix("blocks.")?;
        let (i, tail) = rest.split_once('.')?;
        let leaf = tail.strip_prefix("attn.qkv.")?;
        Some((i.parse().ok()?, leaf))
    }
}

impl WeightSource for Qwen3VlVisionSource<'_> {
    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        if name == PATCH_WEIGHT {
            return self.patch_weight();
        }
        let found = self.inner.tensor(&self.resolve(name));
        if found.is_none() && self.llamacpp {
            if let Some((block, leaf)) = Self::qkv_block(name) {
                return self.split_qkv(block, leaf);
            }
        }
        found
    }

    fn contains(&self, name: &str) -> bool {
        if name == PATCH_WEIGHT {
            let key = if self.llamacpp {
                "v.patch_embd.weight".to_string()
            } else {
                self.resolve(name)
            };
            return self.inner.contains(&key);
        }
        if self.inner.contains(&self.resolve(name)) {
            return true;
        }
        self.llamacpp
            && Self::qkv_block(name)
                .is_some_and(|(b, leaf)| self.inner.contains(&format!("v.blk.{b}.attn_q.{leaf}")))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
