//! A weight source serving the Qwen2.5-VL vision tower under transformers' names relative to
//! `visual.` (`patch_embed.proj.weight`, `blocks.N.attn.qkv.weight`, `blocks.N.mlp.gate_proj.weight`,
//! `merger.ln_q.weight`, `merger.mlp.0.weight`, ...) whatever the file used:
//!
//! - transformers safetensors: `model.visual.*` (transformers 5), `visual.*` (the hub
//!   checkpoints and ComfyUI's single-file `qwen_2.5_vl_7b.safetensors`), or bare names;
//! - a llama.cpp mmproj GGUF (`v.blk.N.attn_q/k/v`, `v.blk.N.ffn_gate`, `v.post_ln`, `mm.0`,
//!   `v.patch_embd.weight` + `.weight.1`, ...).
//!
//! The Conv3d folding, llama.cpp's per-frame patch kernels and split q/k/v are the same as
//! Qwen3-VL's, so those are served by [`Qwen3VlVisionSource`]; this source only finds the
//! layout and renames the Qwen2.5-specific tensors (gated MLP, RMSNorm merger).

use crate::models::te::qwen3_vl_vision::Qwen3VlVisionSource;
use crate::runner::{SourceTensor, StoreSource, WeightSource};
use crate::weights::TensorStore;

/// Name prefixes under which safetensors files keep the vision tower, tried in order.
const LAYOUT_PREFIXES: [&str; 3] = ["model.visual.", "visual.", ""];

/// The served name of the patch-embedding matrix [3·T·P·P, hidden].
pub const PATCH_WEIGHT: &str = "patch_embed.proj.weight";

/// transformers name (relative to `visual.`) → llama.cpp mmproj name, for the tensors the
/// Qwen3-VL source does not already map. Names it does map (norms, attention, the patch
/// kernel) come back unchanged.
pub fn qwen25_vl_vision_hf_to_llamacpp(name: &str) -> Option<String> {
    let fixed = match name {
        "merger.ln_q.weight" => Some("v.post_ln.weight"),
        "merger.mlp.0.weight" => Some("mm.0.weight"),
        "merger.mlp.0.bias" => Some("mm.0.bias"),
        "merger.mlp.2.weight" => Some("mm.2.weight"),
        "merger.mlp.2.bias" => Some("mm.2.bias"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix("blocks.")?;
    let (i, tail) = rest.split_once('.')?;
    let (module, leaf) = tail.rsplit_once('.')?;
    let short = match module {
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("v.blk.{i}.{short}.{leaf}"))
}

/// Serves a Qwen2.5-VL vision tower's weights under transformers names (see the module docs).
pub struct Qwen25VlVisionSource<'s> {
    inner: Qwen3VlVisionSource<'s>,
    llamacpp: bool,
}

impl<'s> Qwen25VlVisionSource<'s> {
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        let plain = StoreSource::new(store, prefix);
        let llamacpp = plain.contains("v.patch_embd.weight");
        // The Qwen3-VL source finds its layout by a tensor Qwen2.5 lacks (`pos_embed`), so
        // it gets the layout folded into its prefix and sees bare names.
        let inner_prefix = if llamacpp {
            prefix.to_string()
        } else {
            let layout = LAYOUT_PREFIXES
                .iter()
                .find(|p| {
                    plain.contains(&format!("{p}{PATCH_WEIGHT}"))
                        || plain.contains(&format!("{p}blocks.0.attn.qkv.weight"))
                })
                .copied()
                .unwrap_or("");
            format!("{prefix}{layout}")
        };
        Self {
            inner: Qwen3VlVisionSource::new(store, &inner_prefix),
            llamacpp,
        }
    }

    /// Whether the weights use llama.cpp mmproj names.
    pub fn is_llamacpp(&self) -> bool {
        self.llamacpp
    }

    fn resolve(&self, name: &str) -> String {
        if self.llamacpp {
            if let Some(n) = qwen25_vl_vision_hf_to_llamacpp(name) {
                return n;
            }
        }
        name.to_string()
    }
}

impl WeightSource for Qwen25VlVisionSource<'_> {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        self.inner.tensor(&self.resolve(name))
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(&self.resolve(name))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }
}
