//! Qwen3-VL's language model as Qwen Image 2.1's text encoder (transformers
//! `Qwen3VLTextModel`), for text prompts and for prompts with condition images (editing).
//!
//! - [`Qwen3Config`]: sizes detected from the weights; rope theta / eps from [`qwen3_hparams`].
//! - [`Qwen3TextModel`]: weights under plain Qwen3 names and a pure `forward`.
//! - [`Qwen3Source`]: serves transformers (`model.language_model.*`, `model.*`, bare) and
//!   llama.cpp GGUF (`blk.N.attn_q.weight`, ...) files under plain names.
//! - [`encode`] / [`encode_qwen_image_21`]: one call on a [`Runner`].
//! - Images: [`VisionEmbeds`] (the vision tower's outputs per image), [`rope_positions`]
//!   (`get_rope_index`), [`Qwen3MmInput`] and [`Qwen3TextModel::forward_multimodal`];
//!   [`encode_qwen_image_21_edit`] runs the editing template.
//!
//! Semantics follow REFERENCE-NOTES §Qwen-Image-2.1 13–15: the output is the last decoder
//! layer's output *before* the final RMS norm; the prompt is wrapped in the pipeline's chat
//! template and the system turn's `drop_idx` rows are dropped; NeoX rope (θ 5e6 by default);
//! q/k RMS norm per head before rope; no BOS, no truncation, no mask at batch 1.

mod config;
mod mm;
mod model;
mod mrope;
mod source;

pub use config::Qwen3Config;
pub use mm::{Qwen3MmInput, VisionEmbeds};
pub use model::Qwen3TextModel;
pub use mrope::{rope_positions, DEFAULT_MROPE_SECTION};
pub use source::{
    qwen3_hparams, qwen3_llamacpp_to_hf, qwen3_mrope_section, Qwen3Source, DEFAULT_ROPE_THETA,
};

use crate::runner::{HostTensor, Runner, RunnerError};
use crate::tokenizers::{
    qwen_image_21_edit_prompt_ids, qwen_image_21_prompt_ids, BpeTokenizer, QWEN_IMAGE_PAD,
};

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
    let ids = ids_i32(ids);
    let full = encode(runner, model, &ids)?;
    drop_rows(full, drop_idx)
}

/// Drops the first `drop_idx` token rows of [hidden, n].
fn drop_rows(full: HostTensor, drop_idx: usize) -> Result<HostTensor, RunnerError> {
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

fn ids_i32(ids: Vec<u32>) -> Vec<i32> {
    ids.into_iter()
        .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
        .collect()
}

/// Qwen Image 2.1's prompt embedding for editing (diffusers `QwenImage21Pipeline` with
/// `image=[...]`): the editing template with one vision block per image, each image's vision
/// embeddings at its image-pad tokens, 3-D mRoPE positions and deepstack; the output before
/// the final norm minus the system turn's rows, [hidden, n − drop_idx], and the pipeline's
/// `image_pad_mask` over those rows.
pub fn encode_qwen_image_21_edit(
    runner: &Runner,
    model: &Qwen3TextModel,
    tokenizer: &BpeTokenizer,
    prompt: &str,
    images: &[VisionEmbeds],
) -> Result<(HostTensor, Vec<bool>), RunnerError> {
    let pad_id = tokenizer
        .token_to_id(QWEN_IMAGE_PAD)
        .and_then(|i| i32::try_from(i).ok())
        .ok_or_else(|| RunnerError::BadData {
            key: QWEN_IMAGE_PAD.into(),
            origin: "the Qwen tokenizer".into(),
            reason: "the tokenizer has no image-pad token".into(),
        })?;
    let pads: Vec<usize> = images.iter().map(|v| v.grid_h * v.grid_w).collect();
    let (ids, drop_idx) = qwen_image_21_edit_prompt_ids(tokenizer, prompt, &pads);
    let ids = ids_i32(ids);
    let c = model.config();
    super::check_token_ids(&ids, c.vocab, "the Qwen3 token sequence")?;
    let input = Qwen3MmInput::from_images(ids, pad_id, images, c.hidden)?;
    let mut mask = input.image_pad_mask();
    let mut out = runner.compute(|g| vec![model.forward_multimodal(g, &input, None, false)])?;
    let full = out
        .pop()
        .ok_or_else(|| RunnerError::Internal("Qwen3 graph returned no output".into()))?;
    let embeds = drop_rows(full, drop_idx)?;
    mask.drain(..drop_idx);
    Ok((embeds, mask))
}
