//! T5 v1.1 text encoder (transformers `T5EncoderModel`, as PixArt-α/Σ, FLUX and SD3 use with
//! t5-v1_1-xxl) and umT5 (`UMT5EncoderModel`, umt5-xxl: the text encoder of Wan 2.1/2.2).
//!
//! - [`T5Config`]: sizes detected from the weights ([`T5Config::detect`]).
//! - [`T5Encoder`]: weights declared under HF names and a pure `forward` over a graph;
//!   [`T5Encoder::is_umt5`] says whether the weights have a position table per block.
//! - [`T5Source`]: serves HF, diffusers `text_encoder/`, ComfyUI/sd.cpp (`text_encoders.t5xxl.
//!   transformer.` prefix, scaled fp8 included), llama.cpp GGUF (`enc.blk.N.*`) and original
//!   Wan (`blocks.N.*`, `models_t5_umt5-xxl-enc-bf16.pth`) files under HF names.
//! - [`encode`]: one call on a [`Runner`] → last hidden state after the final norm.
//! - [`check_tokenizer`]: rejects a tokenizer of the other family (T5's 32k vs umT5's 256k).
//!
//! Semantics follow transformers (see REFERENCE-NOTES §PixArt 2–3): no 1/√d attention scaling;
//! a bidirectional relative position bias (32 buckets, max distance 128), block 0's reused by
//! every block for T5, one per block for umT5; RMS norms (no mean subtraction, eps 1e-6)
//! including the final norm; gated GELU with the tanh approximation; padding keys masked,
//! padding rows computed but meaningless.

mod config;
mod encoder;
mod names;
mod source;
mod vocab;

pub use config::{relative_position_bucket, T5Config};
pub use encoder::T5Encoder;
pub use names::wan_t5_to_hf;
pub use source::{T5Layout, T5Source};
pub use vocab::{check_tokenizer, check_tokenizer_size};

use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;

/// Encodes one token sequence whose first `valid_len` tokens are real (the rest padding).
/// Returns the last hidden state after the final norm [d_model, n] (ggml order: one row of
/// `d_model` per token), for T5 and umT5 alike.
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
