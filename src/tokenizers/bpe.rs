//! Byte-level BPE (GPT-2 / Qwen2 style), matching HF `tokenizers` id for id.
//!
//! Pipeline of one `encode`: the text is split on added tokens (`<|im_start|>`, ...; leftmost,
//! longest first, matched on the raw text); every other span is NFC-normalised (when the
//! tokenizer says so), cut into pieces by the pre-tokenizer regex (matches and the gaps between
//! them both become pieces, HF's `Isolated` split), each piece's UTF-8 bytes are mapped to the
//! GPT-2 byte symbols, and the symbols are merged by rank (lowest rank first, leftmost among
//! equal ranks) until no ranked pair is left.
//!
//! Loaders for the files that carry such a tokenizer live in `bpe_load.rs`.

use std::collections::HashMap;

use fancy_regex::Regex;

use super::error::TokenizerError;
use super::nfc::nfc;

/// Qwen2 / Qwen2.5 / Qwen3 pre-tokenization regex (HF `Split`, behaviour `Isolated`).
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-2 pre-tokenization regex (HF `ByteLevel` with `use_regex: true`).
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The Qwen2-family added tokens in id order (the first is `<|endoftext|>`, id 151643 in the real
/// vocabulary). The last six are not "special" (they survive decoding) but, like the others, are
/// matched before BPE.
pub const QWEN_ADDED_TOKENS: [&str; 26] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
];

/// GPT-2's reversible byte → printable-character table: printable Latin-1 bytes map to
/// themselves, the other 68 bytes to U+0100 onward in byte order.
pub fn byte_symbols() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let keep =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let code = if keep {
            b as u32
        } else {
            let c = next;
            next += 1;
            c
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    out
}

/// The byte symbols in GPT-2 vocabulary order (printable ones first): ids 0..256 of a
/// GPT-2 / Qwen2 vocabulary.
pub fn byte_symbols_in_vocab_order() -> Vec<char> {
    let table = byte_symbols();
    let kept = (0..256usize).filter(|&b| table[b] as u32 == b as u32);
    let moved = (0..256usize).filter(|&b| table[b] as u32 != b as u32);
    kept.chain(moved).map(|b| table[b]).collect()
}

/// Options of a byte-level BPE tokenizer besides its vocabulary.
#[derive(Clone, Debug)]
pub struct BpeOptions {
    /// Pre-tokenizer regexes, applied in order (each splits the pieces of the previous one).
    pub patterns: Vec<String>,
    /// Apply Unicode NFC to text outside added tokens (Qwen2's `normalizer: NFC`).
    pub nfc: bool,
    /// Take a whole piece as one token when the vocabulary has it (HF `ignore_merges`).
    pub ignore_merges: bool,
}

impl BpeOptions {
    /// Qwen2-family settings: NFC, the Qwen2 regex, merges always applied.
    pub fn qwen2() -> Self {
        Self {
            patterns: vec![QWEN2_PATTERN.to_string()],
            nfc: true,
            ignore_merges: false,
        }
    }
}

/// A byte-level BPE tokenizer.
pub struct BpeTokenizer {
    vocab: HashMap<String, u32>,
    id_to_token: HashMap<u32, String>,
    /// (left id, right id) → (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Added tokens, longest first (for leftmost-longest matching).
    added: Vec<(String, u32)>,
    /// Byte → symbol id in the vocabulary (None when the vocabulary lacks the symbol).
    byte_ids: [Option<u32>; 256],
    byte_of_symbol: HashMap<char, u8>,
    patterns: Vec<Regex>,
    nfc: bool,
    ignore_merges: bool,
}

impl std::fmt::Debug for BpeTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpeTokenizer")
            .field("vocab", &self.vocab.len())
            .field("merges", &self.merges.len())
            .field("added", &self.added.len())
            .finish()
    }
}

impl BpeTokenizer {
    /// Builds a tokenizer from a vocabulary (symbol string → id), merges in rank order
    /// (`(left, right)` symbol strings) and added tokens (`(content, id)`). `origin` names the
    /// source in errors. Every merge's parts and result must be in the vocabulary.
    pub fn new(
        vocab: HashMap<String, u32>,
        merges: &[(String, String)],
        added: Vec<(String, u32)>,
        options: BpeOptions,
        origin: &str,
    ) -> Result<Self, TokenizerError> {
        let verr = |reason: String| TokenizerError::Vocab {
            origin: origin.to_string(),
            reason,
        };
        if vocab.is_empty() {
            return Err(verr("empty vocabulary".into()));
        }
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, (a, b)) in merges.iter().enumerate() {
            let id = |s: &str| {
                vocab.get(s).copied().ok_or_else(|| {
                    verr(format!(
                        "merge {rank} ({a:?} {b:?}): {s:?} is not in the vocabulary"
                    ))
                })
            };
            let (ia, ib) = (id(a)?, id(b)?);
            let merged = id(&format!("{a}{b}"))?;
            let rank = u32::try_from(rank).map_err(|_| verr("too many merges".into()))?;
            // The first occurrence of a pair keeps its rank (as HF does).
            merge_map.entry((ia, ib)).or_insert((rank, merged));
        }
        let mut id_to_token: HashMap<u32, String> =
            vocab.iter().map(|(s, &i)| (i, s.clone())).collect();
        let mut added = added;
        for (content, id) in &added {
            if content.is_empty() {
                return Err(verr(format!("empty added token (id {id})")));
            }
            id_to_token.insert(*id, content.clone());
        }
        added.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let table = byte_symbols();
        let mut byte_ids = [None; 256];
        let mut byte_of_symbol = HashMap::with_capacity(256);
        for (b, &c) in table.iter().enumerate() {
            byte_ids[b] = vocab.get(c.encode_utf8(&mut [0; 4]) as &str).copied();
            byte_of_symbol.insert(c, b as u8);
        }
        let patterns = options
            .patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| TokenizerError::Unsupported {
                    path: origin.to_string(),
                    feature: format!("pre-tokenizer regex {p:?}: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            vocab,
            id_to_token,
            merges: merge_map,
            added,
            byte_ids,
            byte_of_symbol,
            patterns,
            nfc: options.nfc,
            ignore_merges: options.ignore_merges,
        })
    }

    /// Number of ids (vocabulary plus added tokens, i.e. one past the largest id).
    pub fn vocab_size(&self) -> usize {
        self.id_to_token.keys().max().map_or(0, |&m| m as usize + 1)
    }

    /// The id of a vocabulary symbol string or added token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added
            .iter()
            .find(|(t, _)| t == token)
            .map(|&(_, id)| id)
            .or_else(|| self.vocab.get(token).copied())
    }

    /// Token ids of `text` (no BOS/EOS: Qwen adds none).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match self.find_added(rest) {
                Some((start, len, id)) => {
                    self.encode_plain(&rest[..start], &mut ids);
                    ids.push(id);
                    rest = &rest[start + len..];
                }
                None => {
                    self.encode_plain(rest, &mut ids);
                    break;
                }
            }
        }
        ids
    }

    /// Text of `ids` (byte symbols mapped back to bytes; invalid UTF-8 replaced). Added tokens
    /// are kept as their content.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for id in ids {
            let Some(tok) = self.id_to_token.get(id) else {
                continue;
            };
            if self.added.iter().any(|(_, a)| a == id) {
                bytes.extend_from_slice(tok.as_bytes());
                continue;
            }
            for c in tok.chars() {
                match self.byte_of_symbol.get(&c) {
                    Some(&b) => bytes.push(b),
                    None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The leftmost added token in `text` (longest at that position): (byte start, byte len, id).
    fn find_added(&self, text: &str) -> Option<(usize, usize, u32)> {
        if self.added.is_empty() {
            return None;
        }
        for (i, _) in text.char_indices() {
            let tail = &text[i..];
            if let Some((t, id)) = self
                .added
                .iter()
                .find(|(t, _)| tail.starts_with(t.as_str()))
            {
                return Some((i, t.len(), *id));
            }
        }
        None
    }

    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let normalized;
        let text = if self.nfc {
            normalized = nfc(text);
            normalized.as_str()
        } else {
            text
        };
        let mut pieces = vec![text];
        for re in &self.patterns {
            pieces = pieces
                .into_iter()
                .flat_map(|p| split_isolated(re, p))
                .collect();
        }
        for piece in pieces {
            self.encode_piece(piece, ids);
        }
    }

    fn encode_piece(&self, piece: &str, ids: &mut Vec<u32>) {
        if self.ignore_merges {
            let symbols: String = piece
                .bytes()
                .map(|b| byte_symbols_table()[b as usize])
                .collect();
            if let Some(&id) = self.vocab.get(&symbols) {
                ids.push(id);
                return;
            }
        }
        // Bytes without a symbol in the vocabulary are dropped (HF BPE without an unk token).
        let mut syms: Vec<u32> = piece
            .bytes()
            .filter_map(|b| self.byte_ids[b as usize])
            .collect();
        merge_by_rank(&mut syms, &self.merges);
        ids.extend(syms);
    }
}

/// Applies BPE merges to a word's symbol ids: the lowest-ranked adjacent pair first, the
/// leftmost among equals, until no pair has a merge. `merges`: (left, right) → (rank, merged).
pub(super) fn merge_by_rank(syms: &mut Vec<u32>, merges: &HashMap<(u32, u32), (u32, u32)>) {
    while syms.len() > 1 {
        let best = syms
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| merges.get(&(w[0], w[1])).map(|&(r, m)| (r, i, m)))
            .min_by_key(|&(r, i, _)| (r, i));
        let Some((_, i, merged)) = best else {
            break;
        };
        syms[i] = merged;
        syms.remove(i + 1);
    }
}

fn byte_symbols_table() -> &'static [char; 256] {
    static TABLE: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(byte_symbols)
}

/// HF `Split` with behaviour `Isolated`: every match is a piece, and so is every non-empty gap.
/// A regex that fails at run time (backtracking limit) leaves the rest as one piece.
fn split_isolated<'t>(re: &Regex, text: &'t str) -> Vec<&'t str> {
    let mut out = Vec::new();
    let mut last = 0;
    for m in re.find_iter(text) {
        let Ok(m) = m else {
            break;
        };
        if m.start() > last {
            out.push(&text[last..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        last = m.end();
    }
    if last < text.len() {
        out.push(&text[last..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_gpt2() {
        let t = byte_symbols();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0], 'Ā');
        let order = byte_symbols_in_vocab_order();
        assert_eq!(order.len(), 256);
        assert_eq!(order[0], '!');
        assert_eq!(order[220], 'Ġ');
    }

    #[test]
    fn split_keeps_everything() {
        let re = Regex::new(QWEN2_PATTERN).unwrap();
        let text = "Hello  world's 123\n\n  x";
        let pieces = split_isolated(&re, text);
        assert_eq!(pieces.concat(), text);
        assert_eq!(
            pieces,
            ["Hello", " ", " world", "'s", " ", "1", "2", "3", "\n\n", " ", " x"]
        );
    }
}
