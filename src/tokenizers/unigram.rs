//! SentencePiece unigram model: Viterbi segmentation of one pre-tokenized word over a scored
//! vocabulary, matching HF `tokenizers`' `Unigram` (models/unigram/model.rs, optimized path).
//!
//! - Every vocabulary entry (control and sentinel pieces included, as HF does) can match.
//! - A character that no single-character piece covers gets an `<unk>` candidate scored
//!   `min_score - 10`; consecutive `<unk>` pieces of the best path are fused into one token
//!   (byte_fallback = false: no `<0xNN>` pieces).
//! - Ties keep the earlier candidate (strict `>`), candidates visited by start position and then
//!   by increasing length, sums in f64, exactly like the reference.

use std::collections::HashMap;

use super::error::TokenizerError;

/// Penalty below the lowest piece score given to an unknown character (sentencepiece's kUnkPenalty).
const UNK_PENALTY: f64 = 10.0;

/// A unigram vocabulary ready for encoding.
#[derive(Clone, Debug)]
pub struct Unigram {
    pieces: Vec<(String, f64)>,
    ids: HashMap<String, u32>,
    max_piece_len: usize,
    min_score: f64,
    unk_id: u32,
}

#[derive(Clone, Copy)]
struct Best {
    score: f64,
    start: usize,
    id: u32,
    set: bool,
}

impl Unigram {
    /// Builds the model. `origin` names the source in errors. Duplicate pieces keep the last id
    /// for lookups (as HF's hash map does) while all stay in the id space.
    pub fn new(
        pieces: Vec<(String, f64)>,
        unk_id: u32,
        origin: &str,
    ) -> Result<Self, TokenizerError> {
        let err = |reason: String| TokenizerError::Vocab {
            origin: origin.to_string(),
            reason,
        };
        if pieces.is_empty() {
            return Err(err("the vocabulary is empty".into()));
        }
        if unk_id as usize >= pieces.len() {
            return Err(err(format!(
                "unk id {unk_id} is outside the vocabulary of {} pieces",
                pieces.len()
            )));
        }
        if pieces.len() > u32::MAX as usize {
            return Err(err("more pieces than fit a u32 id".into()));
        }
        let mut ids = HashMap::with_capacity(pieces.len());
        let mut max_piece_len = 0;
        let mut min_score = f64::INFINITY;
        for (i, (piece, score)) in pieces.iter().enumerate() {
            if !score.is_finite() {
                return Err(err(format!(
                    "piece {i} ({piece:?}) has a non-finite score {score}"
                )));
            }
            ids.insert(piece.clone(), i as u32);
            max_piece_len = max_piece_len.max(piece.len());
            min_score = min_score.min(*score);
        }
        Ok(Self {
            pieces,
            ids,
            max_piece_len,
            min_score,
            unk_id,
        })
    }

    /// Number of pieces (the id space).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Always false: construction rejects empty vocabularies.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Id of the unknown piece.
    pub fn unk_id(&self) -> u32 {
        self.unk_id
    }

    /// Id of a piece, if present.
    pub fn token_to_id(&self, piece: &str) -> Option<u32> {
        self.ids.get(piece).copied()
    }

    /// Piece text of an id.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(|(p, _)| p.as_str())
    }

    /// Best segmentation of `word` into piece strings (unknown runs fused).
    pub fn segment<'a>(&self, word: &'a str) -> Vec<&'a str> {
        let n = word.len();
        if n == 0 {
            return Vec::new();
        }
        let unk_score = self.min_score - UNK_PENALTY;
        let mut best = vec![
            Best {
                score: 0.0,
                start: 0,
                id: 0,
                set: false,
            };
            n + 1
        ];
        let bytes = word.as_bytes();
        for (start, c) in word.char_indices() {
            let here = best[start].score;
            let char_len = c.len_utf8();
            let mut has_single = false;
            let longest = self.max_piece_len.min(n - start);
            for len in 1..=longest {
                let end = start + len;
                // Pieces are valid UTF-8, so only char-boundary ends can match.
                if !word.is_char_boundary(end) {
                    continue;
                }
                let Some(&id) = std::str::from_utf8(&bytes[start..end])
                    .ok()
                    .and_then(|s| self.ids.get(s))
                else {
                    continue;
                };
                let cand = self.pieces[id as usize].1 + here;
                let node = &mut best[end];
                if !node.set || cand > node.score {
                    *node = Best {
                        score: cand,
                        start,
                        id,
                        set: true,
                    };
                }
                if len == char_len {
                    has_single = true;
                }
            }
            if !has_single {
                let cand = unk_score + here;
                let node = &mut best[start + char_len];
                if !node.set || cand > node.score {
                    *node = Best {
                        score: cand,
                        start,
                        id: self.unk_id,
                        set: true,
                    };
                }
            }
        }
        // Walk back, fusing runs of <unk> nodes into one piece.
        let mut out = Vec::new();
        let mut end = n;
        let mut unk_run_end: Option<usize> = None;
        while end > 0 {
            let node = best[end];
            if node.id == self.unk_id {
                unk_run_end.get_or_insert(end);
            } else {
                if let Some(e) = unk_run_end.take() {
                    out.push(&word[end..e]);
                }
                out.push(&word[node.start..end]);
            }
            end = node.start;
        }
        if let Some(e) = unk_run_end {
            out.push(&word[..e]);
        }
        out.reverse();
        out
    }

    /// Ids of the best segmentation of `word`, appended to `out`.
    pub fn encode_word(&self, word: &str, out: &mut Vec<u32>) {
        for piece in self.segment(word) {
            out.push(self.ids.get(piece).copied().unwrap_or(self.unk_id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Unigram;

    fn model() -> Unigram {
        let pieces = [
            ("<unk>", 0.0),
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("d", 0.0),
            ("cd", 1.0),
            ("ab", 2.0),
            ("abc", 5.0),
            ("abcd", 10.0),
        ];
        let pieces = pieces.iter().map(|(p, s)| (p.to_string(), *s)).collect();
        Unigram::new(pieces, 0, "test").expect("model")
    }

    #[test]
    fn best_path_and_fused_unknowns() {
        let m = model();
        assert_eq!(m.segment("abcdacdxx"), vec!["abcd", "a", "cd", "xx"]);
        assert_eq!(m.segment("xéyab"), vec!["xéy", "ab"]);
        let mut ids = Vec::new();
        m.encode_word("xxab", &mut ids);
        assert_eq!(ids, vec![0, 6]);
        assert!(m.segment("").is_empty());
    }

    #[test]
    fn rejects_bad_vocab() {
        assert!(Unigram::new(vec![], 0, "t").is_err());
        assert!(Unigram::new(vec![("a".into(), 0.0)], 1, "t").is_err());
        assert!(Unigram::new(vec![("a".into(), f64::NAN)], 0, "t").is_err());
    }
}
