//! Qwen Image 2.1's prompt template for its Qwen3-VL text encoder (diffusers
//! `QwenImage21Pipeline`): a fixed system turn, the prompt as the user turn, and
//! an open assistant turn; image editing puts the condition images' vision blocks first in the
//! user turn. The encoder's hidden states of the system turn are dropped.

use super::bpe::BpeTokenizer;

/// The system message of Qwen Image 2.1's template.
pub const QWEN_IMAGE_21_SYSTEM: &str = "Comprehend and analyze the provided prompt.";

/// The system turn whose tokens are dropped from the encoder output.
pub fn qwen_image_21_system_turn() -> String {
    format!("<|im_start|>system\n{QWEN_IMAGE_21_SYSTEM}<|im_end|>\n")
}

/// The full text-to-image template around `prompt` (an empty prompt becomes `" "`: Qwen has
/// no BOS token, so the encoder would otherwise read nothing of the user's).
pub fn qwen_image_21_template(prompt: &str) -> String {
    let prompt = if prompt.is_empty() { " " } else { prompt };
    format!(
        "{}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
        qwen_image_21_system_turn()
    )
}

/// Token ids of the templated prompt and `drop_idx`, the number of leading (system turn)
/// tokens whose hidden states the pipeline discards (14 with the Qwen vocabulary). No
/// truncation, no BOS/EOS.
pub fn qwen_image_21_prompt_ids(tokenizer: &BpeTokenizer, prompt: &str) -> (Vec<u32>, usize) {
    let ids = tokenizer.encode(&qwen_image_21_template(prompt));
    let drop_idx = tokenizer.encode(&qwen_image_21_system_turn()).len();
    (ids, drop_idx)
}

/// The image placeholder token the processor expands once per merged vision token.
pub const QWEN_IMAGE_PAD: &str = "<|image_pad|>";

/// The image-editing template around `prompt` with one vision block per entry of
/// `pads_per_image` (`<image1><|vision_start|>` + pads + `<|vision_end|>`, further images
/// after a space as `<image2>...`), each `<|image_pad|>` already expanded to its count (merged
/// grid h·w), as the processor does. An empty prompt becomes `" "`.
pub fn qwen_image_21_edit_template(prompt: &str, pads_per_image: &[usize]) -> String {
    let prompt = if prompt.is_empty() { " " } else { prompt };
    let mut vision = String::new();
    for (i, &pads) in pads_per_image.iter().enumerate() {
        if i > 0 {
            vision.push(' ');
        }
        vision.push_str(&format!("<image{}><|vision_start|>", i + 1));
        vision.push_str(&QWEN_IMAGE_PAD.repeat(pads));
        vision.push_str("<|vision_end|>");
    }
    format!(
        "{}<|im_start|>user\n{vision}{prompt}<|im_end|>\n<|im_start|>assistant\n",
        qwen_image_21_system_turn()
    )
}

/// Token ids of the image-editing template (see [`qwen_image_21_edit_template`]) and
/// `drop_idx`, the number of leading system-turn tokens whose hidden states are discarded.
pub fn qwen_image_21_edit_prompt_ids(
    tokenizer: &BpeTokenizer,
    prompt: &str,
    pads_per_image: &[usize],
) -> (Vec<u32>, usize) {
    let ids = tokenizer.encode(&qwen_image_21_edit_template(prompt, pads_per_image));
    let drop_idx = tokenizer.encode(&qwen_image_21_system_turn()).len();
    (ids, drop_idx)
}
