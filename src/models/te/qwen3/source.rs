//! A weight source that serves Qwen3 language-model weights under plain Qwen3 names
//! (`embed_tokens.weight`, `layers.N.self_attn.q_proj.weight`, `norm.weight`, ...) whatever
//! layout the file used, and the hyper-parameters that live outside the weights.

use std::collections::HashMap;

use serde_json::Value;

use crate::runner::{SourceTensor, StoreSource, WeightSource};
use crate::weights::TensorStore;

/// Name prefixes (inside the component) under which files keep the language model, tried in
/// order: transformers 5 `Qwen3VLForConditionalGeneration` (and Qwen3-VL hub checkpoints),
/// transformers 4 `Qwen3VLModel` exports, plain `Qwen3ForCausalLM`, a bare `Qwen3Model` /
/// `Qwen3VLTextModel`.
const LAYOUT_PREFIXES: [&str; 4] = [
    "model.language_model.",
    "language_model.model.",
    "model.",
    "",
];

/// Default rope theta of Qwen3-VL's language model (its released configs all say 5e6).
pub const DEFAULT_ROPE_THETA: f32 = 5_000_000.0;

/// llama.cpp GGUF name → plain Qwen3 name (`blk.3.attn_q.weight` → `layers.3.self_attn.q_proj.weight`).
/// llama.cpp's Qwen2/Qwen3/Qwen3-VL converters keep q/k rows in HF order (NeoX rope), so the
/// weights need no un-permuting.
pub fn qwen3_llamacpp_to_hf(name: &str) -> Option<String> {
    match name {
        "token_embd.weight" => return Some("embed_tokens.weight".into()),
        "output_norm.weight" => return Some("norm.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (i, tail) = rest.split_once('.')?;
    let i: usize = i.parse().ok()?;
    let (short, suffix) = tail.rsplit_once('.')?;
    let long = match short {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("layers.{i}.{long}.{suffix}"))
}

/// Qwen3 language-model weights from a [`TensorStore`] under `prefix` (e.g. the LLM component
/// prefix `text_encoders.llm.`), looked up by plain Qwen3 names.
pub struct Qwen3Source<'s> {
    inner: StoreSource<'s>,
    /// The layout prefix found in the file (one of [`LAYOUT_PREFIXES`]).
    layout: &'static str,
    /// Plain name → name in the store (without `prefix`), for llama.cpp GGUF names.
    renamed: HashMap<String, String>,
}

impl<'s> Qwen3Source<'s> {
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        let inner = StoreSource::new(store, prefix);
        let layout = LAYOUT_PREFIXES
            .iter()
            .copied()
            .find(|p| inner.contains(&format!("{p}embed_tokens.weight")))
            .unwrap_or("");
        let renamed = store
            .with_prefix(prefix)
            .filter_map(|t| {
                let local = &t.name[prefix.len()..];
                qwen3_llamacpp_to_hf(local).map(|hf| (hf, local.to_string()))
            })
            .collect();
        Self {
            inner,
            layout,
            renamed,
        }
    }

    /// Whether the weights use llama.cpp GGUF names.
    pub fn is_llamacpp(&self) -> bool {
        !self.renamed.is_empty()
    }

    fn resolve(&self, name: &str) -> String {
        let direct = format!("{}{name}", self.layout);
        if self.inner.contains(&direct) {
            return direct;
        }
        self.renamed.get(name).cloned().unwrap_or(direct)
    }
}

impl WeightSource for Qwen3Source<'_> {
    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        self.inner.tensor(&self.resolve(name))
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(&self.resolve(name))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Hyper-parameters not stored in the weights: (rope theta, RMS-norm eps), from GGUF metadata
/// (`<arch>.rope.freq_base`, `<arch>.attention.layer_norm_rms_epsilon`) or a `config.json`
/// (`text_config.rope_parameters.rope_theta`, `rope_theta`, `rms_norm_eps`, top level or in
/// `text_config`), else the Qwen3-VL defaults (5e6, 1e-6).
pub fn qwen3_hparams(store: &TensorStore) -> (f32, f32) {
    qwen3_hparams_or(store, DEFAULT_ROPE_THETA)
}

/// [`qwen3_hparams`] with another default rope theta (Qwen3-4B: 1e6).
pub fn qwen3_hparams_or(store: &TensorStore, default_theta: f32) -> (f32, f32) {
    let mut theta = None;
    let mut eps = None;
    for f in store.files() {
        if let Some(arch) = f.gguf.get_str("general.architecture") {
            theta = theta.or_else(|| f.gguf.get_f32(&format!("{arch}.rope.freq_base")));
            eps = eps.or_else(|| {
                f.gguf
                    .get_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"))
            });
        }
        if let Some(cfg) = &f.config {
            let text = cfg.get("text_config").unwrap_or(cfg);
            let num = |v: Option<&Value>| v.and_then(Value::as_f64).map(|x| x as f32);
            theta = theta
                .or_else(|| num(text.pointer("/rope_parameters/rope_theta")))
                .or_else(|| num(text.get("rope_theta")))
                .or_else(|| num(cfg.get("rope_theta")));
            eps = eps
                .or_else(|| num(text.get("rms_norm_eps")))
                .or_else(|| num(cfg.get("rms_norm_eps")));
        }
    }
    (theta.unwrap_or(default_theta), eps.unwrap_or(1e-6))
}

/// Interleaved mRoPE sections (t, h, w) from a `config.json`
/// (`text_config.rope_parameters.mrope_section`, also `rope_scaling` and top level) or GGUF
/// metadata (`<arch>.rope.dimension_sections`); `None` when no file says.
pub fn qwen3_mrope_section(store: &TensorStore) -> Option<[usize; 3]> {
    let three = |v: &[Value]| -> Option<[usize; 3]> {
        let n: Vec<usize> = v
            .iter()
            .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
            .collect::<Option<_>>()?;
        (n.len() >= 3).then(|| [n[0], n[1], n[2]])
    };
    for f in store.files() {
        if let Some(arch) = f.gguf.get_str("general.architecture") {
            if let Some(s) = f
                .gguf
                .get_arr_i32(&format!("{arch}.rope.dimension_sections"))
                .and_then(|v| {
                    let n: Vec<usize> = v
                        .iter()
                        .map(|&x| usize::try_from(x).ok())
                        .collect::<Option<_>>()?;
                    (n.len() >= 3).then(|| [n[0], n[1], n[2]])
                })
            {
                return Some(s);
            }
        }
        if let Some(cfg) = &f.config {
            let text = cfg.get("text_config").unwrap_or(cfg);
            for path in [
                "/rope_parameters/mrope_section",
                "/rope_scaling/mrope_section",
            ] {
                if let Some(s) = text
                    .pointer(path)
                    .or_else(|| cfg.pointer(path))
                    .and_then(Value::as_array)
                    .and_then(|v| three(v))
                {
                    return Some(s);
                }
            }
        }
    }
    None
}

/// The attention head count from GGUF metadata (`<arch>.attention.head_count`) or a
/// `config.json` (`num_attention_heads`, top level or in `text_config`); `None` when no file
/// says. Qwen2 / Qwen2.5-VL need it for the head width (they have no q/k norms to read it from).
pub fn qwen3_heads(store: &TensorStore) -> Option<usize> {
    for f in store.files() {
        if let Some(arch) = f.gguf.get_str("general.architecture") {
            let key = format!("{arch}.attention.head_count");
            if let Some(h) = f.gguf.get_u32(&key).map(|h| h as usize) {
                return Some(h);
            }
        }
        if let Some(cfg) = &f.config {
            let text = cfg.get("text_config").unwrap_or(cfg);
            let heads = text
                .get("num_attention_heads")
                .or_else(|| cfg.get("num_attention_heads"))
                .and_then(Value::as_u64);
            if let Some(h) = heads {
                return usize::try_from(h).ok();
            }
        }
    }
    None
}
