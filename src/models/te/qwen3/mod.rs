//! Qwen3-VL's language model as Qwen Image 2.1's text encoder (transformers
//! `Qwen3VLTextModel`, text path only).
//!
//! - [`Qwen3Config`]: sizes detected from the weights; rope theta / eps from [`qwen3_hparams`].
//! - [`Qwen3TextModel`]: weights under plain Qwen3 names and a pure `forward`.
//! - [`Qwen3Source`]: serves transformers (`model.language_model.*`, `model.*`, bare) and
//!   llama.cpp GGUF (`blk.N.attn_q.weight`, ...) files under plain names.
//! - [`encode`] / [`encode_qwen_image_21`]: one call on a [`Runner`].
//!
//! Semantics follow REFERENCE-NOTES §Qwen-Image-2.1 13–15: the output is the last decoder
//! layer's output *before* the final RMS norm; the prompt is wrapped in the pipeline's chat
//! template and the system turn's `drop_idx` rows are dropped; NeoX rope (θ 5e6 by default);
//! q/k RMS norm per head before rope; no BOS, no truncation, no mask at batch 1.

mod config;
mod model;
mod source;

pub use config::Qwen3Config;
pub use model::Qwen3TextModel;
pub use source::{qwen3_hparams, qwen3_llamacpp_to_hf, Qwen3Source, DEFAULT_ROPE_THETA};

use crate::runner::{HostTensor, Runner, RunnerError};
use crate::tokenizers::{qwen_image_21_prompt_ids, BpeTokenizer};

/// Runs the encoder on `ids` and returns the last layer's output before the final norm,
/// [hidden, n] (ggml order: one row of `hidden` per token).
pub fn encode(
    runner: &Runner,
    model: &Qwen3TextModel,
    ids: &[i32],
) -> Result<HostTensor, RunnerError> {
    super::check_token_ids(ids, model.config().vocab, "the Qwen3 token sequence")?;
    let n = ids.len();
    let mut out = runner.compute(|g| {
        let ids = g.input_i32("qwen3.input_ids", [n, 1, 1, 1], ids.to_vec());
        vec![model.forward(g, ids, None, false)]
    })?;
    out.pop()
        .ok_or_else(|| RunnerError::Internal("Qwen3 graph returned no output".into()))
}

/// Qwen Image 2.1's prompt embedding: the templated prompt through the encoder, minus the
/// system turn's rows: [hidden, n − drop_idx].
pub fn encode_qwen_image_21(
    runner: &Runner,
    model: &Qwen3TextModel,
    tokenizer: &BpeTokenizer,
    prompt: &str,
) -> Result<HostTensor, RunnerError> {
    let (ids, drop_idx) = qwen_image_21_prompt_ids(tokenizer, prompt);
    let ids: Vec<i32> = ids
        .into_iter()
        .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
        .collect();
    let full = encode(runner, model, &ids)?;
    let hidden = full.ne[0];
    let n = full.ne[1];
    if drop_idx >= n {
        return Err(RunnerError::Internal(format!(
            "template of {n} tokens has no tokens after the {drop_idx} system tokens"
        )));
    }
    HostTensor::new(
        [hidden, n - drop_idx, 1, 1],
        full.data[hidden * drop_idx..].to_vec(),
    )
    .ok_or_else(|| RunnerError::Internal("Qwen3 output has an inconsistent shape".into()))
}
