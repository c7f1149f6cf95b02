//! The CLIP BPE tokenizer of the SD 1.x / 2.x / SDXL text encoders (and SD3's / FLUX's CLIP),
//! with its vocabulary built into the binary (users pass bare checkpoints; upstream sd-cli also
//! always uses its embedded vocabulary).
//!
//! One `encode`: clean the text (whitespace runs → one space, lowercase), cut out special tokens
//! (`<|startoftext|>`, `<|endoftext|>`, textual-inversion words), split the rest into pieces
//! with CLIP's pattern, map each piece's UTF-8 bytes to GPT-2 byte symbols, mark the last symbol
//! with `</w>`, and merge by rank. [`ClipTextRules`] says whose cleanup and character classes
//! apply: upstream's (the default, ASCII-only) or HF `CLIPTokenizer`'s (Unicode); they agree on
//! ASCII text (`tests/clip_tokenizer.rs` checks both against their references).
//!
//! The SD conditioner's weighted, 77-token chunking lives in `chunks.rs`.

mod chunks;
mod custom_words;
mod text;
mod vocab;

use std::collections::HashMap;

pub use chunks::{
    chunk_tokens, tokenize_weighted, weighted_tokens, BreakRule, PromptChunk, WeightedTokens,
    CLIP_CHUNK_LEN, CLIP_CHUNK_TOKENS,
};
pub use custom_words::{CustomWordIds, CustomWords};
pub use text::ClipTextRules;
pub use vocab::CLIP_MERGES;

use super::bpe::{byte_symbols, merge_by_rank};
use super::error::TokenizerError;
use text::HfPatterns;
use vocab::{ClipVocab, END_OF_TEXT, END_OF_WORD, START_OF_TEXT};

/// `<|startoftext|>` in OpenAI's CLIP vocabulary.
pub const CLIP_BOS: i32 = 49406;
/// `<|endoftext|>`: the end of a prompt, and the padding of CLIP-L (SD1, SDXL).
pub const CLIP_EOS: i32 = 49407;
/// Token ids in OpenAI's CLIP vocabulary; custom words start here.
pub const CLIP_VOCAB_SIZE: usize = 49408;

/// The text of the merges built into the binary (OpenAI CLIP's, with the `#version` line).
pub fn embedded_merges() -> Result<String, TokenizerError> {
    vocab::embedded_merges()
}

/// A CLIP BPE tokenizer.
pub struct ClipTokenizer {
    vocab: ClipVocab,
    rules: ClipTextRules,
    /// Compiled patterns, for [`ClipTextRules::HuggingFace`] only.
    hf: Option<HfPatterns>,
    custom: CustomWords,
}

impl std::fmt::Debug for ClipTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipTokenizer")
            .field("tokens", &self.vocab.tokens.len())
            .field("rules", &self.rules)
            .field("custom_rows", &self.custom.rows())
            .finish()
    }
}

/// A piece of text between special tokens, or a special token.
enum Segment<'t> {
    Text(&'t str),
    Special(&'t str),
}

impl ClipTokenizer {
    /// The embedded vocabulary under upstream sd-cli's text rules (what the CLI uses).
    pub fn new() -> Result<Self, TokenizerError> {
        Self::with_rules(ClipTextRules::SdCpp)
    }

    /// The embedded vocabulary under the given text rules.
    pub fn with_rules(rules: ClipTextRules) -> Result<Self, TokenizerError> {
        Self::from_merges(&vocab::embedded_merges()?, vocab::EMBEDDED_ORIGIN, rules)
    }

    /// A tokenizer from the text of a CLIP `merges.txt` (ids laid out as OpenAI's: byte
    /// symbols, the same with `</w>`, merges, `<|startoftext|>`, `<|endoftext|>`). `origin`
    /// names the source in errors.
    pub fn from_merges(
        merges_text: &str,
        origin: &str,
        rules: ClipTextRules,
    ) -> Result<Self, TokenizerError> {
        let vocab = vocab::build(merges_text, origin)?;
        let hf = match rules {
            ClipTextRules::SdCpp => None,
            ClipTextRules::HuggingFace => {
                Some(HfPatterns::new().map_err(|e| TokenizerError::Unsupported {
                    path: origin.to_string(),
                    feature: format!("CLIP pre-tokenizer {e}"),
                })?)
            }
        };
        let custom = CustomWords::new(vocab.tokens.len() as i32);
        Ok(Self {
            vocab,
            rules,
            hf,
            custom,
        })
    }

    pub fn rules(&self) -> ClipTextRules {
        self.rules
    }

    /// `<|startoftext|>`.
    pub fn bos(&self) -> i32 {
        self.vocab.bos as i32
    }

    /// `<|endoftext|>`.
    pub fn eos(&self) -> i32 {
        self.vocab.eos as i32
    }

    /// Ids of the vocabulary (custom words come after).
    pub fn vocab_size(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// Makes `encode` turn these words into their ids (textual inversion).
    pub fn set_custom_words(&mut self, words: CustomWords) {
        self.custom = words;
    }

    pub fn custom_words(&self) -> &CustomWords {
        &self.custom
    }

    /// Token ids of `text`, without BOS / EOS. Special tokens spelt in the text become their
    /// ids, custom words their id ranges.
    pub fn encode(&self, text: &str) -> Vec<i32> {
        let mut ids = Vec::new();
        match &self.hf {
            None => self.encode_clean(&text::sdcpp_clean(text), true, &mut ids),
            Some(_) => {
                // HF matches its added tokens on the raw text, then cleans what lies between.
                for segment in split_special(text, [START_OF_TEXT, END_OF_TEXT].into_iter()) {
                    match segment {
                        Segment::Special(t) => ids.push(self.special_id(t)),
                        Segment::Text(t) => {
                            self.encode_clean(&text::hf_clean(t), false, &mut ids);
                        }
                    }
                }
            }
        }
        ids
    }

    /// Text of `ids` for logs: BOS / EOS and custom ids skipped, `</w>` read as a space.
    pub fn decode(&self, ids: &[i32]) -> String {
        let symbols = byte_symbols();
        let byte_of: HashMap<char, u8> = (0..=255u8).map(|b| (symbols[b as usize], b)).collect();
        let mut bytes = Vec::new();
        for &id in ids {
            if id == self.bos() || id == self.eos() {
                continue;
            }
            let Some(token) = usize::try_from(id)
                .ok()
                .and_then(|i| self.vocab.tokens.get(i))
            else {
                continue;
            };
            let (body, end) = match token.strip_suffix(END_OF_WORD) {
                Some(body) => (body, true),
                None => (token.as_str(), false),
            };
            bytes.extend(body.chars().filter_map(|c| byte_of.get(&c)));
            if end {
                bytes.push(b' ');
            }
        }
        String::from_utf8_lossy(&bytes).trim().to_string()
    }

    /// Ids of cleaned text: special tokens (the two text ones when `text_specials`) and custom
    /// words cut out as upstream does, the rest split into pieces and merged.
    fn encode_clean(&self, clean: &str, text_specials: bool, ids: &mut Vec<i32>) {
        let texts = [START_OF_TEXT, END_OF_TEXT]
            .into_iter()
            .filter(|_| text_specials);
        for segment in split_special(clean, texts.chain(self.custom.keys())) {
            match segment {
                Segment::Special(t) => match self.custom.ids_of_key(t) {
                    Some(range) => ids.extend(range),
                    None => ids.push(self.special_id(t)),
                },
                Segment::Text(t) => {
                    let pieces = match &self.hf {
                        None => text::sdcpp_pieces(t),
                        Some(p) => text::hf_pieces(p, t),
                    };
                    for piece in pieces {
                        self.encode_piece(piece, ids);
                    }
                }
            }
        }
    }

    fn special_id(&self, token: &str) -> i32 {
        if token == START_OF_TEXT {
            self.bos()
        } else {
            self.eos()
        }
    }

    fn encode_piece(&self, piece: &str, ids: &mut Vec<i32>) {
        let Some((&last, init)) = piece.as_bytes().split_last() else {
            return;
        };
        let mut syms: Vec<u32> = init
            .iter()
            .map(|&b| self.vocab.byte_ids[b as usize])
            .collect();
        syms.push(self.vocab.byte_end_ids[last as usize]);
        merge_by_rank(&mut syms, &self.vocab.merges);
        ids.extend(syms.into_iter().map(|s| s as i32));
    }
}

/// Upstream's `split_with_special_tokens`: repeatedly the earliest occurrence of any token, the
/// one listed first on a tie (not the longest).
fn split_special<'t, 'k>(text: &'t str, tokens: impl Iterator<Item = &'k str>) -> Vec<Segment<'t>> {
    let tokens: Vec<&str> = tokens.filter(|t| !t.is_empty()).collect();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let found = tokens
            .iter()
            .filter_map(|t| text[pos..].find(t).map(|at| (pos + at, t.len())))
            .min_by_key(|&(at, _)| at);
        let Some((at, len)) = found else {
            out.push(Segment::Text(&text[pos..]));
            break;
        };
        if at > pos {
            out.push(Segment::Text(&text[pos..at]));
        }
        out.push(Segment::Special(&text[at..at + len]));
        pos = at + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_decodes_ascii() {
        let tok = ClipTokenizer::new().unwrap();
        assert_eq!(
            (tok.bos(), tok.eos(), tok.vocab_size()),
            (49406, 49407, 49408)
        );
        // Ids from upstream's tokenizer.
        let ids = tok.encode("a photo of a cat");
        assert_eq!(ids, [320, 1125, 539, 320, 2368]);
        assert_eq!(tok.decode(&ids), "a photo of a cat");
        assert_eq!(tok.encode("  "), Vec::<i32>::new());
        assert_eq!(tok.encode("a<|endoftext|>b"), [320, 49407, 321]);
    }

    #[test]
    fn custom_words_are_substrings_of_the_cleaned_prompt() {
        let mut tok = ClipTokenizer::new().unwrap();
        let mut words = CustomWords::new(tok.vocab_size() as i32);
        words.add("Style", 2).unwrap();
        tok.set_custom_words(words);
        // Case-insensitive and inside a word, as upstream.
        assert_eq!(tok.encode("a STYLE"), [320, 49408, 49409]);
        let ids = tok.encode("restyled");
        assert_eq!(ids[1..3], [49408, 49409]);
    }
}
