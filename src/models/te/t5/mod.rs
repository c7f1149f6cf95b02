//! T5 v1.1 text encoder (transformers `T5EncoderModel`, as PixArt-α/Σ use with t5-v1_1-xxl).
//!
//! - [`T5Config`]: sizes detected from the weights ([`T5Config::detect`]).
//! - [`T5Encoder`]: weights declared under HF names and a pure `forward` over a graph.
//! - [`T5Source`]: serves HF, diffusers `text_encoder/`, ComfyUI/sd.cpp (`text_encoders.t5xxl.
//!   transformer.` prefix) and llama.cpp GGUF (`enc.blk.N.*`) files under HF names.
//! - [`encode`]: one call on a [`Runner`] → last hidden state.
//!
//! Semantics follow transformers (see REFERENCE-NOTES §PixArt 2–3): no 1/√d attention scaling;
//! block 0's bidirectional relative position bias (32 buckets, max distance 128) reused by every
//! block; RMS norms (no mean subtraction, eps 1e-6) including the final norm; gated GELU with the
//! tanh approximation; padding keys masked, padding rows computed but meaningless.

mod config;
mod encoder;
mod source;

pub use config::{relative_position_bucket, T5Config};
pub use encoder::T5Encoder;
pub use source::T5Source;

use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;

/// Encodes one token sequence whose first `valid_len` tokens are real (the rest padding).
/// Returns the last hidden state [d_model, n] (ggml order: one row of `d_model` per token).
pub fn encode(
    runner: &Runner,
    model: &T5Encoder,
    ids: &[i32],
    valid_len: usize,
) -> Result<HostTensor, RunnerError> {
    super::check_token_ids(ids, model.config().vocab, "the T5 token sequence")?;
    let n = ids.len();
    let mut out = runner.compute(|g| {
        let ids = g.input_i32("t5.input_ids", [n, 1, 1, 1], ids.to_vec());
        vec![model.forward(g, ids, valid_len)]
    })?;
    out.pop()
        .ok_or_else(|| RunnerError::Internal("T5 graph returned no output".into()))
}
