//! Prompt templates: what a family wraps around the user's prompt before its tokenizer.

/// How a family's text encoder sees the prompt.
#[derive(Clone, Copy)]
pub enum PromptTemplate {
    /// As given (CLIP, T5 families that pass prompts through).
    Raw,
    /// Rewritten by the family's caption preprocessing (PixArt: Python `lower().strip()`).
    Cleaned(fn(&str) -> String),
    /// Inside a chat template (LLM text encoders).
    Chat(ChatTemplate),
}

impl PromptTemplate {
    /// The text the tokenizer reads for a plain text prompt.
    pub fn apply(&self, prompt: &str) -> String {
        match self {
            PromptTemplate::Raw => prompt.to_string(),
            PromptTemplate::Cleaned(clean) => clean(prompt),
            PromptTemplate::Chat(chat) => chat.render(prompt, ""),
        }
    }
}

impl std::fmt::Debug for PromptTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromptTemplate::Raw => f.write_str("Raw"),
            PromptTemplate::Cleaned(_) => f.write_str("Cleaned"),
            PromptTemplate::Chat(c) => f.debug_tuple("Chat").field(c).finish(),
        }
    }
}

/// A ChatML template (`<|im_start|>role\n...<|im_end|>\n`) with an optional system turn whose
/// tokens the encoder output drops, the prompt as the user turn, and an open assistant turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The system message, if the template has a system turn.
    pub system: Option<&'static str>,
    /// What an empty prompt becomes (Qwen has no BOS token: the encoder would otherwise read
    /// nothing of the user's).
    pub empty_prompt: &'static str,
}

impl ChatTemplate {
    /// The system turn (empty without one); its token count is the rows the pipeline drops.
    pub fn system_turn(&self) -> String {
        self.system
            .map(|s| format!("<|im_start|>system\n{s}<|im_end|>\n"))
            .unwrap_or_default()
    }

    /// The whole template with `before_prompt` (e.g. vision blocks) opening the user turn.
    pub fn render(&self, prompt: &str, before_prompt: &str) -> String {
        let prompt = if prompt.is_empty() {
            self.empty_prompt
        } else {
            prompt
        };
        format!(
            "{}<|im_start|>user\n{before_prompt}{prompt}<|im_end|>\n<|im_start|>assistant\n",
            self.system_turn()
        )
    }
}
