//! The CLIP BPE vocabulary: the merges shipped in the binary and the token table built from them.
//!
//! `merges.txt.zlib` is OpenAI CLIP's `bpe_simple_vocab_16e6.txt` cut to the 48894 merges CLIP
//! uses (with its `#version: 0.2` header line), zlib-compressed: byte for byte the merges that
//! upstream sd-cli embeds (`src/tokenizers/vocab/clip_merges.hpp`) and that
//! `shared/tokenizers/clip.merges.txt` holds. The token ids follow OpenAI's `simple_tokenizer.py`
//! (and HF's `vocab.json` of openai/clip-vit-large-patch14): the 256 byte symbols in GPT-2
//! byte-to-unicode order, the same with `</w>`, one token per merge in merge order, then
//! `<|startoftext|>` and `<|endoftext|>`.

use std::collections::HashMap;

use crate::tokenizers::bpe::byte_symbols_in_vocab_order;
use crate::tokenizers::error::TokenizerError;

static EMBEDDED_MERGES: &[u8] = include_bytes!("merges.txt.zlib");
/// Where the embedded merges come from, for errors.
pub(super) const EMBEDDED_ORIGIN: &str = "the CLIP merges built into sd-cli";
/// Merges in OpenAI's CLIP vocabulary (49408 tokens = 2·256 + 48894 + 2).
pub const CLIP_MERGES: usize = 48894;
/// The decompressed merges are about 512 KiB; anything much larger is not ours.
const MAX_MERGES_BYTES: usize = 4 << 20;

pub(super) const END_OF_WORD: &str = "</w>";
pub(super) const START_OF_TEXT: &str = "<|startoftext|>";
pub(super) const END_OF_TEXT: &str = "<|endoftext|>";

/// Token table and merge ranks of a CLIP tokenizer.
pub(super) struct ClipVocab {
    /// Id → token (byte symbols, `</w>` marking a word's last symbol).
    pub tokens: Vec<String>,
    /// Byte → id of its symbol inside a word, and as a word's last symbol (`</w>`).
    pub byte_ids: [u32; 256],
    pub byte_end_ids: [u32; 256],
    /// (left id, right id) → (rank, merged id).
    pub merges: HashMap<(u32, u32), (u32, u32)>,
    pub bos: u32,
    pub eos: u32,
}

/// The embedded merges file as text.
pub(super) fn embedded_merges() -> Result<String, TokenizerError> {
    let err = |reason: String| TokenizerError::Vocab {
        origin: EMBEDDED_ORIGIN.to_string(),
        reason,
    };
    let bytes =
        miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(EMBEDDED_MERGES, MAX_MERGES_BYTES)
            .map_err(|e| err(format!("cannot decompress: {e:?}")))?;
    String::from_utf8(bytes).map_err(|e| err(format!("not UTF-8: {e}")))
}

/// Builds the vocabulary from a merges file (`#version` header optional, one `left right` pair
/// per line, each part a token that exists by then). `origin` names the source in errors.
pub(super) fn build(merges_text: &str, origin: &str) -> Result<ClipVocab, TokenizerError> {
    let err = |reason: String| TokenizerError::Vocab {
        origin: origin.to_string(),
        reason,
    };
    let symbols = byte_symbols_in_vocab_order();
    let mut tokens: Vec<String> = symbols.iter().map(|c| c.to_string()).collect();
    tokens.extend(symbols.iter().map(|c| format!("{c}{END_OF_WORD}")));
    let mut ids: HashMap<String, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();

    let mut merges = HashMap::with_capacity(CLIP_MERGES);
    let lines = merges_text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .enumerate()
        .filter(|(i, l)| !l.is_empty() && (*i != 0 || !l.starts_with("#version")));
    for (rank, (line_no, line)) in lines.enumerate() {
        let (a, b) = line
            .split_once(' ')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '))
            .ok_or_else(|| {
                err(format!(
                    "line {} {line:?} is not \"left right\"",
                    line_no + 1
                ))
            })?;
        let id_of = |s: &str| {
            ids.get(s).copied().ok_or_else(|| {
                err(format!(
                    "line {}: {s:?} is neither a byte symbol nor an earlier merge",
                    line_no + 1
                ))
            })
        };
        let (left, right) = (id_of(a)?, id_of(b)?);
        let id = u32::try_from(tokens.len()).map_err(|_| err("too many merges".into()))?;
        let merged = format!("{a}{b}");
        // A repeated result keeps the later id, as a Python dict built in order does.
        ids.insert(merged.clone(), id);
        tokens.push(merged);
        // A repeated pair keeps its first (lowest) rank.
        merges.entry((left, right)).or_insert((rank as u32, id));
    }
    // Merge results are looked up by string after all merges are read (the later id wins).
    for (pair, (_, merged)) in merges.iter_mut() {
        let text = format!("{}{}", tokens[pair.0 as usize], tokens[pair.1 as usize]);
        *merged = ids.get(&text).copied().unwrap_or(*merged);
    }
    let bos = tokens.len() as u32;
    tokens.push(START_OF_TEXT.to_string());
    tokens.push(END_OF_TEXT.to_string());

    let mut byte_ids = [0u32; 256];
    let mut byte_end_ids = [0u32; 256];
    let table = crate::tokenizers::bpe::byte_symbols();
    for (b, c) in table.iter().enumerate() {
        // b's slot in both halves of the table (no merge of OpenAI's re-spells a base token).
        let slot = symbols.iter().position(|s| s == c).unwrap_or(0) as u32;
        byte_ids[b] = slot;
        byte_end_ids[b] = 256 + slot;
    }
    Ok(ClipVocab {
        tokens,
        byte_ids,
        byte_end_ids,
        merges,
        bos,
        eos: bos + 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_vocabulary_has_clip_layout() {
        let text = embedded_merges().unwrap();
        assert!(text.starts_with("#version: 0.2\ni n\nt h\n"));
        let v = build(&text, EMBEDDED_ORIGIN).unwrap();
        assert_eq!(v.tokens.len(), 49408);
        assert_eq!((v.bos, v.eos), (49406, 49407));
        assert_eq!(v.merges.len(), CLIP_MERGES);
        assert_eq!(v.tokens[0], "!");
        assert_eq!(v.tokens[256], "!</w>");
        assert_eq!(v.tokens[512], "in");
        assert_eq!(v.byte_end_ids[b'a' as usize], 256 + 64);
    }

    #[test]
    fn malformed_merges_are_errors() {
        let e = build("#version: 0.2\nab\n", "x").err().unwrap();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = build("q zz\n", "x").err().unwrap();
        assert!(e.to_string().contains("\"zz\""), "{e}");
    }
}
