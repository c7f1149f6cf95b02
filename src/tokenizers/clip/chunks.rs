//! The SD conditioner's prompt tokenization: emphasis weights per token, `BREAK`, and 77-token
//! chunks, as upstream's `FrozenCLIPEmbedderWithCustomWords::tokenize` with
//! `Tokenizer::pad_tokens(min = max = 77, allow_overflow_expand)` (conditioner.hpp,
//! tokenizer.cpp).
//!
//! - Each emphasis part ([`parse_emphasis`]) is encoded on its own (so a part boundary is also
//!   a word boundary); its tokens carry its weight.
//! - A `BREAK` part pads the tokens so far with EOS (weight 1) up to a multiple of 75: the next
//!   part starts a new chunk. A leading `BREAK`, or one right after another, adds nothing.
//!   Upstream pads a break with EOS even where the chunk padding is 0 (SD2).
//! - The tokens are cut hard every 75 (no search for a comma as in A1111); each chunk is BOS +
//!   up to 75 tokens + EOS, then `pad` to 77, all with weight 1. The empty prompt is one chunk.
//! - SDXL's bigG sees the same ids with everything after the first EOS set to 0
//!   ([`PromptChunk::ids_zeroed_after_first_eos`]); its pooled output is read at
//!   [`PromptChunk::first_eos`].
//!
//! SD3 and FLUX encode the emphasis parts the same way but never handle `BREAK` (it is encoded
//! as the text "break" with weight -1): [`BreakRule::AsText`].

use super::ClipTokenizer;
use crate::tokenizers::emphasis::{parse_emphasis, WeightedText};
use crate::tokenizers::error::TokenizerError;

/// Ids one CLIP text encoder call reads: BOS + 75 + EOS.
pub const CLIP_CHUNK_LEN: usize = 77;
/// Prompt tokens per chunk.
pub const CLIP_CHUNK_TOKENS: usize = CLIP_CHUNK_LEN - 2;

/// What a `BREAK` part does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakRule {
    /// Ends the chunk (SD 1.x / 2.x / SDXL).
    NewChunk,
    /// Nothing special: encoded as the text it is (SD3, FLUX).
    AsText,
}

/// A prompt's token ids and per-token weights, before chunking.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WeightedTokens {
    pub ids: Vec<i32>,
    pub weights: Vec<f32>,
}

/// One text encoder call's input: [`CLIP_CHUNK_LEN`] ids and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptChunk {
    pub ids: Vec<i32>,
    pub weights: Vec<f32>,
}

impl PromptChunk {
    /// Index of the first `eos` (the pooled-output position), the last index if there is none.
    pub fn first_eos(&self, eos: i32) -> usize {
        self.ids
            .iter()
            .position(|&id| id == eos)
            .unwrap_or(self.ids.len())
            .min(self.ids.len().saturating_sub(1))
    }

    /// The ids with everything after the first `eos` set to 0: SDXL's OpenCLIP bigG input.
    pub fn ids_zeroed_after_first_eos(&self, eos: i32) -> Vec<i32> {
        let mut ids = self.ids.clone();
        if let Some(at) = ids.iter().position(|&id| id == eos) {
            ids[at + 1..].fill(0);
        }
        ids
    }
}

/// Tokens of emphasis parts, each part's tokens with its weight.
pub fn weighted_tokens(
    tokenizer: &ClipTokenizer,
    parts: &[WeightedText],
    breaks: BreakRule,
) -> WeightedTokens {
    let mut out = WeightedTokens::default();
    for part in parts {
        if breaks == BreakRule::NewChunk && part.is_break() {
            let pad = (CLIP_CHUNK_TOKENS - out.ids.len() % CLIP_CHUNK_TOKENS) % CLIP_CHUNK_TOKENS;
            out.ids.extend(std::iter::repeat_n(tokenizer.eos(), pad));
            out.weights.extend(std::iter::repeat_n(1.0, pad));
            continue;
        }
        let ids = tokenizer.encode(&part.text);
        out.weights
            .extend(std::iter::repeat_n(part.weight, ids.len()));
        out.ids.extend(ids);
    }
    out
}

/// Cuts tokens into chunks of BOS + up to 75 + EOS, padded with `pad` to 77 (at least one
/// chunk).
pub fn chunk_tokens(
    tokenizer: &ClipTokenizer,
    tokens: &WeightedTokens,
    pad: i32,
) -> Vec<PromptChunk> {
    let mut chunks = Vec::new();
    let mut start = 0;
    loop {
        let end = (start + CLIP_CHUNK_TOKENS).min(tokens.ids.len());
        let mut ids = Vec::with_capacity(CLIP_CHUNK_LEN);
        let mut weights = Vec::with_capacity(CLIP_CHUNK_LEN);
        ids.push(tokenizer.bos());
        weights.push(1.0);
        ids.extend_from_slice(&tokens.ids[start..end]);
        weights.extend_from_slice(&tokens.weights[start..end]);
        ids.push(tokenizer.eos());
        weights.push(1.0);
        ids.resize(CLIP_CHUNK_LEN, pad);
        weights.resize(CLIP_CHUNK_LEN, 1.0);
        chunks.push(PromptChunk { ids, weights });
        start = end;
        if start >= tokens.ids.len() {
            return chunks;
        }
    }
}

/// A prompt as the SD 1.x / 2.x / SDXL conditioner tokenizes it: emphasis, `BREAK`, chunks
/// padded with `pad` (EOS for CLIP-L and SD1 / SDXL, 0 for SD2's OpenCLIP-H).
pub fn tokenize_weighted(
    tokenizer: &ClipTokenizer,
    prompt: &str,
    pad: i32,
) -> Result<Vec<PromptChunk>, TokenizerError> {
    let parts = parse_emphasis(prompt)?;
    let tokens = weighted_tokens(tokenizer, &parts, BreakRule::NewChunk);
    Ok(chunk_tokens(tokenizer, &tokens, pad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_prompt_is_one_padded_chunk() {
        let tok = ClipTokenizer::new().unwrap();
        let chunks = tokenize_weighted(&tok, "", 0).unwrap();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].ids[..3], [49406, 49407, 0]);
        assert_eq!(chunks[0].ids.len(), CLIP_CHUNK_LEN);
        assert!(chunks[0].weights.iter().all(|&w| w == 1.0));
        assert_eq!(chunks[0].first_eos(49407), 1);
    }

    #[test]
    fn break_pads_with_eos_and_bigg_zeroes_after_first_eos() {
        let tok = ClipTokenizer::new().unwrap();
        let chunks = tokenize_weighted(&tok, "a BREAK (b)", 49407).unwrap();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].ids[..3], [49406, 320, 49407]);
        assert!(chunks[0].ids[2..].iter().all(|&id| id == 49407));
        assert_eq!(chunks[1].ids[..3], [49406, 321, 49407]);
        assert_eq!(chunks[1].weights[1], 1.1);
        let g = chunks[0].ids_zeroed_after_first_eos(49407);
        assert_eq!(g[..4], [49406, 320, 49407, 0]);
        assert_eq!(chunks[0].first_eos(49407), 2);
    }
}
