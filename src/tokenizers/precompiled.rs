//! SentencePiece's `precompiled_charsmap` normalizer (NFKC-like rewrite rules), HF-compatible.
//!
//! The blob is `[u32 LE trie_size_in_bytes][trie: trie_size/4 u32 LE units][normalized strings]`.
//! The trie is a Darts-clone double array over UTF-8 bytes; a leaf's value is a byte offset into
//! the normalized-strings area, where the replacement runs up to the next NUL byte.
//!
//! HF `tokenizers` (normalizers/precompiled.rs) applies it per extended grapheme cluster: a cluster
//! shorter than 6 bytes whose bytes start with *any* key is replaced as a whole by the replacement
//! of the *shortest* matching key (so e.g. "Ａ" + U+0301 becomes just "A"); otherwise each character
//! is looked up on its own. We reproduce that, quirks included, because the reference ids come from
//! HF.

use super::error::TokenizerError;
use super::grapheme::graphemes;

/// A parsed precompiled charsmap.
#[derive(Clone, Debug)]
pub struct Precompiled {
    units: Vec<u32>,
    normalized: Vec<u8>,
}

impl Precompiled {
    /// Parses the binary charsmap (as stored in `spiece.model` or base64-decoded from
    /// `tokenizer.json`). `origin` names the file in error messages.
    pub fn from_bytes(blob: &[u8], origin: &str) -> Result<Self, TokenizerError> {
        let bad = |why: &str| TokenizerError::Format {
            path: origin.to_string(),
            reason: format!("precompiled_charsmap: {why}"),
        };
        if blob.len() < 4 {
            return Err(bad("shorter than its 4-byte header"));
        }
        let trie_bytes = u32::from_le_bytes([blob[0], blob[1], blob[2], blob[3]]) as usize;
        let rest = &blob[4..];
        if trie_bytes > rest.len() || !trie_bytes.is_multiple_of(4) || trie_bytes == 0 {
            return Err(bad(&format!(
                "trie size {trie_bytes} does not fit the {} bytes that follow",
                rest.len()
            )));
        }
        let units = rest[..trie_bytes]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let normalized = rest[trie_bytes..].to_vec();
        if std::str::from_utf8(&normalized).is_err() {
            return Err(bad("normalized strings are not valid UTF-8"));
        }
        Ok(Self { units, normalized })
    }

    fn unit(&self, pos: usize) -> Option<u32> {
        self.units.get(pos).copied()
    }

    /// Replacement of the shortest key that is a prefix of `key` (Darts common-prefix search,
    /// first hit). Keys never contain NUL: the search stops there.
    fn shortest_prefix_replacement(&self, key: &[u8]) -> Option<&str> {
        let has_leaf = |u: u32| (u >> 8) & 1 == 1;
        let value = |u: u32| (u & 0x7FFF_FFFF) as usize;
        let label = |u: u32| u & (0x8000_0000 | 0xFF);
        let offset = |u: u32| ((u >> 10) << ((u & (1 << 9)) >> 6)) as usize;

        let mut node = offset(self.unit(0)?);
        for &c in key {
            if c == 0 {
                break;
            }
            node ^= c as usize;
            let unit = self.unit(node)?;
            if label(unit) != c as u32 {
                return None;
            }
            node ^= offset(unit);
            if has_leaf(unit) {
                return self.replacement_at(value(self.unit(node)?));
            }
        }
        None
    }

    fn replacement_at(&self, start: usize) -> Option<&str> {
        let tail = self.normalized.get(start..)?;
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        std::str::from_utf8(&tail[..end]).ok()
    }

    /// Normalizes `text` the way HF's `Precompiled` normalizer does.
    pub fn normalize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for cluster in graphemes(text) {
            if cluster.len() < 6 {
                if let Some(rep) = self.shortest_prefix_replacement(cluster.as_bytes()) {
                    out.push_str(rep);
                    continue;
                }
            }
            for (i, c) in cluster.char_indices() {
                let one = &cluster[i..i + c.len_utf8()];
                match self.shortest_prefix_replacement(one.as_bytes()) {
                    Some(rep) => out.push_str(rep),
                    None => out.push(c),
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Precompiled;

    #[test]
    fn rejects_truncated_blobs() {
        assert!(Precompiled::from_bytes(&[], "x").is_err());
        assert!(Precompiled::from_bytes(&[8, 0, 0, 0, 1, 2], "x").is_err());
    }

    #[test]
    fn empty_trie_leaves_text_alone() {
        // One unit whose label never matches: nothing is rewritten.
        let blob = [4u8, 0, 0, 0, 0, 0, 0, 0];
        let p = Precompiled::from_bytes(&blob, "x").expect("parse");
        assert_eq!(p.normalize("abc"), "abc");
    }
}
