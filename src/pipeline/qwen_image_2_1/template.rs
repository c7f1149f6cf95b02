//! Qwen Image 2.1's prompt for its Qwen3-VL text encoder (diffusers `QwenImage21Pipeline`): the
//! chat template with a fixed system turn whose encoder rows are dropped, and for editing the
//! condition images' vision blocks opening the user turn; and the encoder runs over them.

use crate::models::te::qwen3::{self, Qwen3MmInput, Qwen3TextModel, VisionEmbeds};
use crate::pipeline::prompt::ChatTemplate;
use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;
use crate::tokenizers::BpeTokenizer;

/// The template: system turn "Comprehend and analyze the provided prompt.", an empty prompt
/// read as " " (REFERENCE-NOTES §14).
pub const TEMPLATE: ChatTemplate = ChatTemplate {
    system: Some("Comprehend and analyze the provided prompt."),
    empty_prompt: " ",
};

/// The image placeholder token the processor expands once per merged vision token.
pub const IMAGE_PAD: &str = "<|image_pad|>";

/// The vision blocks of the edit template: `<image1><|vision_start|>` + pads +
/// `<|vision_end|>` per image, separated by a space, each pad already expanded to its count
/// (merged grid h·w) as the processor does.
pub fn vision_blocks(pads_per_image: &[usize]) -> String {
    let mut vision = String::new();
    for (i, &pads) in pads_per_image.iter().enumerate() {
        if i > 0 {
            vision.push(' ');
        }
        vision.push_str(&format!("<image{}><|vision_start|>", i + 1));
        vision.push_str(&IMAGE_PAD.repeat(pads));
        vision.push_str("<|vision_end|>");
    }
    vision
}

/// Token ids of the text-to-image template around `prompt` and `drop_idx`, the number of
/// leading system-turn tokens whose hidden states are discarded (14 with the Qwen vocabulary).
/// No truncation, no BOS/EOS.
pub fn prompt_ids(tokenizer: &BpeTokenizer, prompt: &str) -> (Vec<u32>, usize) {
    edit_prompt_ids(tokenizer, prompt, &[])
}

/// Token ids of the editing template (one vision block per entry of `pads_per_image`) and
/// `drop_idx`.
pub fn edit_prompt_ids(
    tokenizer: &BpeTokenizer,
    prompt: &str,
    pads_per_image: &[usize],
) -> (Vec<u32>, usize) {
    let ids = tokenizer.encode(&TEMPLATE.render(prompt, &vision_blocks(pads_per_image)));
    let drop_idx = tokenizer.encode(&TEMPLATE.system_turn()).len();
    (ids, drop_idx)
}

/// The prompt embedding: the templated prompt through the encoder (the last layer's output
/// before the final norm), minus the system turn's rows: [hidden, n − drop_idx].
pub fn encode_prompt(
    runner: &Runner,
    model: &Qwen3TextModel,
    tokenizer: &BpeTokenizer,
    prompt: &str,
) -> Result<HostTensor, RunnerError> {
    let (ids, drop_idx) = prompt_ids(tokenizer, prompt);
    let full = qwen3::encode(runner, model, &ids_i32(ids))?;
    drop_rows(full, drop_idx)
}

/// The prompt embedding for editing (diffusers `QwenImage21Pipeline` with `image=[...]`): the
/// editing template with each image's vision embeddings at its image-pad tokens, 3-D mRoPE
/// positions and deepstack; the output before the final norm minus the system turn's rows,
/// [hidden, n − drop_idx], and the pipeline's `image_pad_mask` over those rows.
pub fn encode_edit_prompt(
    runner: &Runner,
    model: &Qwen3TextModel,
    tokenizer: &BpeTokenizer,
    prompt: &str,
    images: &[VisionEmbeds],
) -> Result<(HostTensor, Vec<bool>), RunnerError> {
    let pad_id = tokenizer
        .token_to_id(IMAGE_PAD)
        .and_then(|i| i32::try_from(i).ok())
        .ok_or_else(|| RunnerError::BadData {
            key: IMAGE_PAD.into(),
            origin: "the Qwen tokenizer".into(),
            reason: "the tokenizer has no image-pad token".into(),
        })?;
    let pads: Vec<usize> = images.iter().map(|v| v.grid_h * v.grid_w).collect();
    let (ids, drop_idx) = edit_prompt_ids(tokenizer, prompt, &pads);
    let ids = ids_i32(ids);
    let c = model.config();
    qwen3::check_ids(&ids, c.vocab)?;
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
