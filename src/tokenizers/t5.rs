//! The T5 tokenizer pipeline: added-token split → normalizers → pre-tokenizers → unigram model →
//! post-processor, then PixArt-style truncation and padding.
//!
//! Each stage mirrors the HF `tokenizers` component that the tokenizer files describe, so the ids
//! match `Tokenizer.encode(text, add_special_tokens=True)`.

use super::grapheme::in_ranges;
use super::precompiled::Precompiled;
use super::unicode_tables::{CASED_RANGES, CASE_IGNORABLE_RANGES};
use super::unigram::Unigram;

/// When the Metaspace pre-tokenizer prepends the replacement character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrependScheme {
    /// To every chunk that does not already start with it.
    Always,
    /// Only to the chunk that starts the input.
    First,
    /// Never.
    Never,
}

/// A normalizer step (the subset of HF normalizers used by T5 tokenizers).
#[derive(Clone, Debug)]
pub enum Normalizer {
    /// SentencePiece precompiled charsmap.
    Precompiled(Precompiled),
    /// Regex ` {2,}` → replacement (runs of two or more ASCII spaces).
    CollapseSpaces(String),
    /// Regex `\A +| +\z` → "" (leading/trailing ASCII spaces removed).
    TrimSpaces,
    /// Literal string replacement.
    Replace { pattern: String, content: String },
    /// Strip Unicode whitespace on the given sides.
    Strip { left: bool, right: bool },
}

impl Normalizer {
    fn apply(&self, text: String) -> String {
        match self {
            Normalizer::Precompiled(p) => p.normalize(&text),
            Normalizer::CollapseSpaces(rep) => collapse_spaces(&text, rep),
            Normalizer::TrimSpaces => text.trim_matches(' ').to_string(),
            Normalizer::Replace { pattern, content } if !pattern.is_empty() => {
                text.replace(pattern.as_str(), content)
            }
            Normalizer::Replace { .. } => text,
            Normalizer::Strip { left, right } => match (left, right) {
                (true, true) => text.trim().to_string(),
                (true, false) => text.trim_start().to_string(),
                (false, true) => text.trim_end().to_string(),
                (false, false) => text,
            },
        }
    }
}

fn collapse_spaces(text: &str, rep: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(' ') {
        out.push_str(&rest[..i]);
        let run = rest[i..].bytes().take_while(|&b| b == b' ').count();
        if run >= 2 {
            out.push_str(rep);
        } else {
            out.push(' ');
        }
        rest = &rest[i + run..];
    }
    out.push_str(rest);
    out
}

/// A pre-tokenizer step.
#[derive(Clone, Debug)]
pub enum PreTokenizer {
    /// Split on Unicode whitespace, dropping it.
    WhitespaceSplit,
    /// Spaces → replacement, optional prefix, optional split before each replacement.
    Metaspace {
        replacement: char,
        prepend: PrependScheme,
        split: bool,
    },
}

/// A word on its way through the pre-tokenizers: text plus whether it starts the whole input
/// (for `PrependScheme::First`).
struct Word {
    text: String,
    at_start: bool,
}

impl PreTokenizer {
    fn apply(&self, words: Vec<Word>) -> Vec<Word> {
        let mut out = Vec::with_capacity(words.len());
        match self {
            PreTokenizer::WhitespaceSplit => {
                for w in words {
                    let starts_blank = w.text.starts_with(char::is_whitespace);
                    for (i, part) in w
                        .text
                        .split(char::is_whitespace)
                        .filter(|p| !p.is_empty())
                        .enumerate()
                    {
                        out.push(Word {
                            text: part.to_string(),
                            at_start: w.at_start && i == 0 && !starts_blank,
                        });
                    }
                }
            }
            PreTokenizer::Metaspace {
                replacement,
                prepend,
                split,
            } => {
                for w in words {
                    if w.text.is_empty() {
                        continue;
                    }
                    let mut text: String = w
                        .text
                        .chars()
                        .map(|c| if c == ' ' { *replacement } else { c })
                        .collect();
                    let want_prefix = match prepend {
                        PrependScheme::Always => true,
                        PrependScheme::First => w.at_start,
                        PrependScheme::Never => false,
                    };
                    if want_prefix && !text.starts_with(*replacement) {
                        text.insert(0, *replacement);
                    }
                    if !*split {
                        out.push(Word {
                            text,
                            at_start: w.at_start,
                        });
                        continue;
                    }
                    // Split so that every replacement char begins a new word.
                    let mut start = 0;
                    for (i, c) in text.char_indices() {
                        if c == *replacement && i > start {
                            out.push(Word {
                                text: text[start..i].to_string(),
                                at_start: w.at_start && start == 0,
                            });
                            start = i;
                        }
                    }
                    out.push(Word {
                        text: text[start..].to_string(),
                        at_start: w.at_start && start == 0,
                    });
                }
            }
        }
        out
    }
}

/// Ids and attention mask of one prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoding {
    /// Token ids (real tokens, `</s>`, then padding).
    pub ids: Vec<i32>,
    /// 1 for real tokens (including `</s>`), 0 for padding.
    pub mask: Vec<u8>,
}

/// A complete T5 (SentencePiece unigram) tokenizer.
#[derive(Clone, Debug)]
pub struct T5Tokenizer {
    pub(crate) model: Unigram,
    pub(crate) byte_fallback: bool,
    pub(crate) normalizers: Vec<Normalizer>,
    pub(crate) pre_tokenizers: Vec<PreTokenizer>,
    /// Special tokens matched verbatim in the raw text, longest first at each position.
    pub(crate) added: Vec<(String, u32)>,
    /// Ids the post-processor puts before / after the sequence.
    pub(crate) prefix_ids: Vec<u32>,
    pub(crate) suffix_ids: Vec<u32>,
    pub(crate) pad_id: u32,
}

impl T5Tokenizer {
    /// The unigram model (vocabulary).
    pub fn model(&self) -> &Unigram {
        &self.model
    }

    /// Id used for padding.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Id the post-processor appends (`</s>` for T5), if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.suffix_ids.last().copied()
    }

    /// Runs only the normalizers (for diagnostics and tests).
    pub fn normalize(&self, text: &str) -> String {
        self.normalizers
            .iter()
            .fold(text.to_string(), |acc, n| n.apply(acc))
    }

    /// Splits raw text around special tokens: `Ok(text)` chunks and `Err(id)` tokens.
    fn split_added<'a>(&self, text: &'a str) -> Vec<Result<&'a str, u32>> {
        let mut out = Vec::new();
        let mut chunk_start = 0;
        let mut pos = 0;
        while pos < text.len() {
            let rest = &text[pos..];
            let hit = self
                .added
                .iter()
                .filter(|(tok, _)| !tok.is_empty() && rest.starts_with(tok.as_str()))
                .max_by_key(|(tok, _)| tok.len());
            match hit {
                Some((tok, id)) => {
                    if chunk_start < pos {
                        out.push(Ok(&text[chunk_start..pos]));
                    }
                    out.push(Err(*id));
                    pos += tok.len();
                    chunk_start = pos;
                }
                None => pos += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
        if chunk_start < text.len() {
            out.push(Ok(&text[chunk_start..]));
        }
        out
    }

    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        for seg in self.model.segment(piece) {
            match self.model.token_to_id(seg) {
                Some(id) => out.push(id),
                None => {
                    let bytes: Option<Vec<u32>> = if self.byte_fallback {
                        seg.bytes()
                            .map(|b| self.model.token_to_id(&format!("<0x{b:02X}>")))
                            .collect()
                    } else {
                        None
                    };
                    match bytes {
                        Some(ids) => out.extend(ids),
                        None => out.push(self.model.unk_id()),
                    }
                }
            }
        }
    }

    /// Token ids of `text` without special tokens from the post-processor.
    pub fn encode_body(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        for part in self.split_added(text) {
            let chunk = match part {
                Err(id) => {
                    ids.push(id);
                    continue;
                }
                Ok(chunk) => chunk,
            };
            let at_start = std::ptr::eq(chunk.as_ptr(), text.as_ptr());
            let normalized = self.normalize(chunk);
            let mut words = vec![Word {
                text: normalized,
                at_start,
            }];
            for pre in &self.pre_tokenizers {
                words = pre.apply(words);
            }
            for w in words {
                self.encode_piece(&w.text, &mut ids);
            }
        }
        ids
    }

    /// HF `encode(text, add_special_tokens=True)`: body plus the post-processor's tokens, no
    /// truncation or padding.
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        let body = self.encode_body(text);
        let mut ids = self.prefix_ids.clone();
        ids.extend(body);
        ids.extend_from_slice(&self.suffix_ids);
        ids
    }

    /// PixArt pipeline encoding: the body is truncated so that it plus `</s>` fits `max_len`,
    /// then padded with the pad id to `max_len` when `pad`. An empty prompt gives `[</s>]`.
    pub fn encode(&self, text: &str, max_len: usize, pad: bool) -> Encoding {
        let mut body = self.encode_body(text);
        let specials = self.prefix_ids.len() + self.suffix_ids.len();
        body.truncate(max_len.saturating_sub(specials));
        let mut ids: Vec<u32> = self.prefix_ids.clone();
        ids.extend(body);
        ids.extend_from_slice(&self.suffix_ids);
        ids.truncate(max_len);
        let mut mask = vec![1u8; ids.len()];
        if pad && ids.len() < max_len {
            mask.resize(max_len, 0);
            ids.resize(max_len, self.pad_id);
        }
        Encoding {
            // Vocabularies are far below i32::MAX (checked when loading).
            ids: ids.into_iter().map(|i| i as i32).collect(),
            mask,
        }
    }
}

/// Python's `text.lower().strip()`: Unicode lowercase, then trim Unicode whitespace. This is the
/// PixArt pipeline's caption cleaning when `bs4`/`ftfy` are absent (REFERENCE-NOTES §PixArt 1).
pub fn pixart_clean(text: &str) -> String {
    let mut lower = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c == 'Σ' {
            // Python applies the final-sigma rule: ς at the end of a word, σ elsewhere.
            lower.push(if is_final_sigma(&chars, i) {
                'ς'
            } else {
                'σ'
            });
        } else {
            lower.extend(c.to_lowercase());
        }
    }
    lower.trim_matches(is_py_whitespace).to_string()
}

/// Final_Sigma (Unicode 3.13, as CPython applies it): preceded by a cased character and not
/// followed by one, skipping case-ignorable characters on both sides.
fn is_final_sigma(chars: &[char], i: usize) -> bool {
    let cased = |c: char| in_ranges(CASED_RANGES, c);
    let ignorable = |c: char| in_ranges(CASE_IGNORABLE_RANGES, c);
    let before = chars[..i]
        .iter()
        .rev()
        .find(|&&c| !ignorable(c))
        .is_some_and(|&c| cased(c));
    let after = chars[i + 1..]
        .iter()
        .find(|&&c| !ignorable(c))
        .is_some_and(|&c| cased(c));
    before && !after
}

/// Python's `str.isspace()` set used by `strip()`: Unicode White_Space plus the ASCII
/// separators U+001C..U+001F.
fn is_py_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1C}'..='\u{1F}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::{collapse_spaces, pixart_clean};

    #[test]
    fn collapse() {
        assert_eq!(collapse_spaces("a  b   c d ", " "), "a b c d ");
        assert_eq!(collapse_spaces("  ", "▁"), "▁");
    }

    #[test]
    fn clean_like_python() {
        assert_eq!(pixart_clean("  A Cat\t\n"), "a cat");
        assert_eq!(pixart_clean("ΟΔΟΣ"), "οδος");
        assert_eq!(pixart_clean("\u{1F}İx\u{3000}"), "i\u{307}x");
    }
}
