//! Qwen3-VL's language model as Qwen Image 2.1's text encoder (transformers
//! `Qwen3VLTextModel`), for text prompts and for prompts with condition images (editing).
//!
//! - [`Qwen3Config`]: sizes detected from the weights; rope theta / eps from [`qwen3_hparams`].
//! - [`Qwen3TextModel`]: weights under plain Qwen3 names and a pure `forward`.
//! - [`Qwen3Source`]: serves transformers (`model.language_model.*`, `model.*`, bare) and
//!   llama.cpp GGUF (`blk.N.attn_q.weight`, ...) files under plain names.
//! - [`encode`]: one call on a [`Runner`] over token ids.
//! - Images: [`VisionEmbeds`] (the vision tower's outputs per image), [`rope_positions`]
//!   (`get_rope_index`), [`Qwen3MmInput`] and [`Qwen3TextModel::forward_multimodal`].
//!
//! Semantics follow REFERENCE-NOTES §Qwen-Image-2.1 13–15: the output is the last decoder
//! layer's output *before* the final RMS norm; NeoX rope (θ 5e6 by default); q/k RMS norm per
//! head before rope; no mask at batch 1. Prompt templates belong to the families that use the
//! encoder (`pipeline::qwen_image_2_1::template`).

mod config;
mod mm;
mod model;
mod mrope;
mod source;

pub use config::{Qwen3Config, QWEN2_HEAD_DIM};
pub use mm::{Qwen3MmInput, VisionEmbeds};
pub use model::Qwen3TextModel;
pub use mrope::{rope_positions, DEFAULT_MROPE_SECTION};
pub use source::{
    qwen3_heads, qwen3_hparams, qwen3_hparams_or, qwen3_llamacpp_to_hf, qwen3_mrope_section,
    Qwen3Source, DEFAULT_ROPE_THETA,
};

use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;

/// Runs the encoder on `ids` and returns the last layer's output before the final norm,
/// [hidden, n] (ggml order: one row of `hidden` per token).
pub fn encode(
    runner: &Runner,
    model: &Qwen3TextModel,
    ids: &[i32],
) -> Result<HostTensor, RunnerError> {
    encode_layers(runner, model, ids, None)
}

/// [`encode`] through the first `layers` decoder layers only (all when `None`): Z-Image reads
/// `hidden_states[-2]`, the output before the last layer.
pub fn encode_layers(
    runner: &Runner,
    model: &Qwen3TextModel,
    ids: &[i32],
    layers: Option<usize>,
) -> Result<HostTensor, RunnerError> {
    super::check_token_ids(ids, model.config().vocab, "the Qwen3 token sequence")?;
    let n = ids.len();
    let mut out = runner.compute(|g| {
        let ids = g.input_i32("qwen3.input_ids", [n, 1, 1, 1], ids.to_vec());
        vec![model.forward(g, ids, layers, false)]
    })?;
    out.pop()
        .ok_or_else(|| RunnerError::Internal("Qwen3 graph returned no output".into()))
}

/// Runs the encoder on `ids` through every layer and the final RMS norm (transformers'
/// `last_hidden_state`, what Qwen Image v1 reads), [hidden, n].
pub fn encode_normed(
    runner: &Runner,
    model: &Qwen3TextModel,
    ids: &[i32],
) -> Result<HostTensor, RunnerError> {
    super::check_token_ids(ids, model.config().vocab, "the Qwen2.5-VL token sequence")?;
    let n = ids.len();
    runner.compute_one(|g| {
        let ids = g.input_i32("qwen3.input_ids", [n, 1, 1, 1], ids.to_vec());
        Ok::<_, RunnerError>(model.forward(g, ids, None, true))
    })
}

/// Rejects an empty sequence or ids outside the vocabulary (before ggml's `get_rows`).
pub fn check_ids(ids: &[i32], vocab: usize) -> Result<(), RunnerError> {
    super::check_token_ids(ids, vocab, "the Qwen3 token sequence")
}

/// The multimodal forward ([`Qwen3TextModel::forward_multimodal`]) through the first `layers`
/// decoder layers (all when `None`), before the final norm: [hidden, n].
pub fn encode_multimodal_layers(
    runner: &Runner,
    model: &Qwen3TextModel,
    input: &Qwen3MmInput,
    layers: Option<usize>,
) -> Result<HostTensor, RunnerError> {
    check_ids(input.ids(), model.config().vocab)?;
    runner.compute_one(|g| Ok::<_, RunnerError>(model.forward_multimodal(g, input, layers, false)))
}
