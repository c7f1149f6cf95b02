//! Text cleanup and the pre-tokenizer of the CLIP tokenizer, under upstream sd-cli's rules or
//! HF `CLIPTokenizer`'s. Both split with the same pattern
//! `'s|'t|'re|'ve|'m|'ll|'d|<letters>+|<digit>|[^<space><letter><digit>]+` on lowercased text
//! with whitespace runs collapsed; they differ in what counts as a letter, digit or space.

use fancy_regex::Regex;

use crate::tokenizers::bpe::GPT2_PATTERN;
use crate::tokenizers::nfc::nfc;

/// Whose text rules the tokenizer follows. They agree on ASCII text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClipTextRules {
    /// Upstream sd-cli (`clip_tokenizer.cpp`), the CLI's behaviour: its `std::regex` runs on
    /// UTF-8 bytes in the C locale, so only ASCII is whitespace (` \t\n\v\f\r`), letter or digit;
    /// lowercasing is ASCII-only; every non-ASCII byte is "punctuation" (`café` is `caf` + `é`,
    /// a no-break space is not a space). No Unicode normalisation. Special tokens
    /// (`<|startoftext|>`, `<|endoftext|>`, custom words) are matched after cleanup.
    #[default]
    SdCpp,
    /// HF `CLIPTokenizer` (transformers 5, the `tokenizers` backend): `<|startoftext|>` and
    /// `<|endoftext|>` are matched on the raw text, then NFC, Unicode whitespace runs → one
    /// space, per-character Unicode lowercase; letters are `\p{L}`, digits `\p{N}`; each piece
    /// is split again by the GPT-2 byte-level pattern (which only splits a lowercased
    /// `<|endoftext|>` spelt in other case). Custom words are matched after cleanup, as upstream.
    HuggingFace,
}

/// The CLIP split pattern as HF writes it.
const HF_CLIP_PATTERN: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

/// The compiled patterns of [`ClipTextRules::HuggingFace`].
pub(super) struct HfPatterns {
    clip: Regex,
    gpt2: Regex,
}

impl HfPatterns {
    pub(super) fn new() -> Result<Self, String> {
        let compile = |p: &str| Regex::new(p).map_err(|e| format!("pattern {p:?}: {e}"));
        Ok(Self {
            clip: compile(HF_CLIP_PATTERN)?,
            gpt2: compile(GPT2_PATTERN)?,
        })
    }
}

/// `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Upstream's `normalize`: ASCII whitespace runs → one space, trimmed, ASCII lowercase.
pub(super) fn sdcpp_clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text
        .trim_matches(|c: char| c.is_ascii() && is_c_space(c as u8))
        .chars()
    {
        if c.is_ascii() && is_c_space(c as u8) {
            if !in_space {
                out.push(' ');
            }
            in_space = true;
        } else {
            out.push(c.to_ascii_lowercase());
            in_space = false;
        }
    }
    out
}

/// HF's normalizer: NFC, whitespace runs → one space (not trimmed), per-character lowercase
/// (`char::to_lowercase`, so no final-sigma rule).
pub(super) fn hf_clean(text: &str) -> String {
    let text = nfc(text);
    let mut out = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            if !in_space {
                out.push(' ');
            }
            in_space = true;
        } else {
            out.extend(c.to_lowercase());
            in_space = false;
        }
    }
    out
}

/// The length of a contraction (`'s 't 're 've 'm 'll 'd`, any case) at the start of `b`.
fn contraction_len(b: &[u8]) -> Option<usize> {
    let lower = |i: usize| b.get(i).map(u8::to_ascii_lowercase);
    match (lower(1), lower(2)) {
        (Some(b's' | b't' | b'm' | b'd'), _) => Some(2),
        (Some(b'r'), Some(b'e')) | (Some(b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => Some(3),
        _ => None,
    }
}

/// Upstream's `token_split` on cleaned text: the pattern's matches, spaces dropped.
pub(super) fn sdcpp_pieces(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut pieces = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match sdcpp_piece_len(&b[i..]) {
            Some(len) => {
                pieces.push(&text[i..i + len]);
                i += len;
            }
            None => i += 1,
        }
    }
    pieces
}

/// The length of the piece at the start of `b` (the pattern's alternatives in order), or None
/// on a space.
fn sdcpp_piece_len(b: &[u8]) -> Option<usize> {
    let c = b[0];
    if c == b'\'' {
        if let Some(len) = contraction_len(b) {
            return Some(len);
        }
    }
    if is_c_space(c) {
        None
    } else if c.is_ascii_alphabetic() {
        Some(b.iter().take_while(|x| x.is_ascii_alphabetic()).count())
    } else if c.is_ascii_digit() {
        Some(1)
    } else {
        // Non-ASCII bytes are never space, letter or digit: runs end on ASCII bytes only, so
        // every piece is whole UTF-8 characters.
        Some(
            b.iter()
                .take_while(|&&x| !(is_c_space(x) || x.is_ascii_alphanumeric()))
                .count(),
        )
    }
}

/// HF's pre-tokenizer on cleaned text: the CLIP pattern's matches (the rest dropped), each split
/// again by the GPT-2 pattern (matches and gaps kept).
pub(super) fn hf_pieces<'t>(patterns: &HfPatterns, text: &'t str) -> Vec<&'t str> {
    let mut pieces = Vec::new();
    for m in patterns.clip.find_iter(text) {
        let Ok(m) = m else {
            break;
        };
        let piece = m.as_str();
        let mut last = 0;
        for g in patterns.gpt2.find_iter(piece) {
            let Ok(g) = g else {
                break;
            };
            if g.start() > last {
                pieces.push(&piece[last..g.start()]);
            }
            if g.end() > g.start() {
                pieces.push(g.as_str());
            }
            last = g.end();
        }
        if last < piece.len() {
            pieces.push(&piece[last..]);
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdcpp_rules_are_ascii_only() {
        assert_eq!(sdcpp_clean("  A\t\tB\u{a0}C ÉÉ \n"), "a b\u{a0}c ÉÉ");
        // A non-ASCII run swallows the apostrophe, as "!'s" does.
        assert_eq!(
            sdcpp_pieces("café's 12 x'y!'s"),
            ["caf", "é'", "s", "1", "2", "x", "'", "y", "!'", "s"]
        );
    }

    #[test]
    fn hf_rules_are_unicode() {
        let p = HfPatterns::new().unwrap();
        assert_eq!(hf_clean("ÉCOLE\u{a0}\u{3000}ΟΔΟΣ"), "école οδοσ");
        assert_eq!(
            hf_pieces(&p, "café's <|endoftext|>"),
            ["café", "'s", "<|", "endoftext", "|>"]
        );
    }
}
