//! Textual-inversion words (`--embd-dir`): names that the tokenizer turns into rows appended to
//! the text encoder's token table.
//!
//! Upstream's rule (conditioner.hpp, `FrozenCLIPEmbedderWithCustomWords`): every embedding file
//! stem, ASCII-lowercased, becomes an extra special token. Special tokens are matched as
//! substrings of the cleaned (lowercased, whitespace-collapsed) prompt, with no regard to word
//! boundaries: the earliest occurrence wins, and on a tie the one listed first
//! (`<|startoftext|>`, `<|endoftext|>`, then the names in byte order of the file stems). A
//! matched name becomes its embedding's rows as consecutive ids past the vocabulary.
//!
//! Differences from upstream, none visible in the conditioning:
//! - Upstream numbers rows lazily, in order of first use; here every word gets its ids up front,
//!   consecutive from the base in byte order of the names, so the caller builds the custom
//!   token table from [`CustomWords::iter`].
//! - Upstream's SDXL path emits a word's ids twice on its first use when the file has both a
//!   CLIP-L and a bigG tensor, and writes both into one shared buffer; the caller decides the
//!   rows here (normally the CLIP-L and bigG tensors have the same row count and share ids).
//! - A name whose file fails to load becomes id 0 upstream; here the caller leaves such a name
//!   out.

use std::ops::Range;

use crate::tokenizers::error::TokenizerError;

/// One custom word and its ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomWordIds<'a> {
    /// The name as given (an embedding file's stem).
    pub name: &'a str,
    /// Its ids, consecutive, one per embedding row.
    pub ids: Range<i32>,
}

#[derive(Clone, Debug)]
struct CustomWord {
    name: String,
    key: String,
    rows: usize,
}

/// The custom words of a tokenizer, with ids from `base` on (normally the text encoder's
/// vocabulary size, 49408).
#[derive(Clone, Debug)]
pub struct CustomWords {
    base: i32,
    /// Sorted by name bytes (upstream iterates a `std::map` of file stems).
    words: Vec<CustomWord>,
}

impl CustomWords {
    /// No custom words; ids of later ones start at `base`.
    pub fn new(base: i32) -> Self {
        Self {
            base,
            words: Vec::new(),
        }
    }

    /// Adds a word spelling `rows` embedding rows. Names equal after ASCII lowercasing keep the
    /// one later in byte order (upstream's map of stems overwrites in that order). Ids of all
    /// words are final once every word is added.
    pub fn add(&mut self, name: &str, rows: usize) -> Result<(), TokenizerError> {
        let err = |reason: String| TokenizerError::Vocab {
            origin: format!("custom word {name:?}"),
            reason,
        };
        if name.is_empty() {
            return Err(err("empty name".into()));
        }
        if rows == 0 {
            return Err(err("an embedding with no rows".into()));
        }
        let key = name.to_ascii_lowercase();
        let replaced = self.words.iter().position(|w| w.key == key);
        if let Some(i) = replaced {
            if self.words[i].name.as_bytes() > name.as_bytes() {
                return Ok(());
            }
        }
        let total = (self.rows() - replaced.map_or(0, |i| self.words[i].rows)).saturating_add(rows);
        let fits = i32::try_from(total)
            .ok()
            .and_then(|t| self.base.checked_add(t))
            .is_some();
        if !fits {
            return Err(err(format!(
                "{total} custom rows past id {} overflow the token ids",
                self.base
            )));
        }
        if let Some(i) = replaced {
            self.words.remove(i);
        }
        let at = self
            .words
            .partition_point(|w| w.name.as_bytes() < name.as_bytes());
        self.words.insert(
            at,
            CustomWord {
                name: name.to_string(),
                key,
                rows,
            },
        );
        Ok(())
    }

    /// The first custom id.
    pub fn base(&self) -> i32 {
        self.base
    }

    /// Total rows (the custom token table's length).
    pub fn rows(&self) -> usize {
        self.words.iter().map(|w| w.rows).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Every word with its ids, in id order.
    pub fn iter(&self) -> impl Iterator<Item = CustomWordIds<'_>> {
        let mut next = self.base;
        self.words.iter().map(move |w| {
            let start = next;
            next += w.rows as i32;
            CustomWordIds {
                name: &w.name,
                ids: start..next,
            }
        })
    }

    /// The ids of the word whose lowercased name is `key`.
    pub(super) fn ids_of_key(&self, key: &str) -> Option<Range<i32>> {
        self.words
            .iter()
            .position(|w| w.key == key)
            .and_then(|i| self.iter().nth(i))
            .map(|w| w.ids)
    }

    /// Lowercased names in matching order.
    pub(super) fn keys(&self) -> impl Iterator<Item = &str> {
        self.words.iter().map(|w| w.key.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_name_order() {
        let mut w = CustomWords::new(49408);
        w.add("emb", 1).unwrap();
        w.add("MyEmb", 3).unwrap();
        w.add("EMB", 2).unwrap(); // same key as "emb", earlier in byte order: loses
        let got: Vec<_> = w.iter().map(|c| (c.name.to_string(), c.ids)).collect();
        assert_eq!(
            got,
            [
                ("MyEmb".to_string(), 49408..49411),
                ("emb".to_string(), 49411..49412)
            ]
        );
        assert_eq!(w.ids_of_key("myemb"), Some(49408..49411));
        assert_eq!(w.rows(), 4);
        assert!(w.add("", 1).is_err());
        assert!(w.add("x", 0).is_err());
        assert!(CustomWords::new(i32::MAX).add("x", 2).is_err());
    }
}
