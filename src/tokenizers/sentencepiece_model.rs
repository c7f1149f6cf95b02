//! Minimal reader of SentencePiece `*.model` files (protobuf `ModelProto`) and the shared
//! constructor that turns a piece list into a T5 tokenizer.
//!
//! Fields read (sentencepiece_model.proto): `ModelProto.pieces` (1) with `piece` (1), `score` (2),
//! `type` (3); `ModelProto.trainer_spec` (2) with `byte_fallback` (35), `unk_id` (40),
//! `eos_id` (42), `pad_id` (43); `ModelProto.normalizer_spec` (3) with `precompiled_charsmap` (2).
//! Everything else is skipped by wire type.
//!
//! The resulting pipeline is what transformers 5's `T5Tokenizer` builds from a `spiece.model`:
//! Precompiled normalizer, WhitespaceSplit + Metaspace(▁, always, split), `</s>` appended, and
//! `<extra_id_N>` sentinels (N = extra_ids-1 … 0) appended to the vocabulary with score 0.

use super::error::TokenizerError;
use super::precompiled::Precompiled;
use super::t5::{Normalizer, PreTokenizer, PrependScheme, T5Tokenizer};
use super::unigram::Unigram;

/// SentencePiece piece types (also the GGUF `tokenizer.ggml.token_type` codes).
pub mod piece_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The parts of a `ModelProto` we use.
#[derive(Clone, Debug, Default)]
pub struct SpmModel {
    /// (piece, score, type)
    pub pieces: Vec<(String, f32, i32)>,
    pub precompiled_charsmap: Vec<u8>,
    pub byte_fallback: bool,
    pub unk_id: i32,
    pub eos_id: i32,
    pub pad_id: i32,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    origin: &'a str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], origin: &'a str) -> Self {
        Self {
            buf,
            pos: 0,
            origin,
        }
    }

    fn err(&self, reason: &str) -> TokenizerError {
        TokenizerError::Format {
            path: self.origin.to_string(),
            reason: format!("protobuf at byte {}: {reason}", self.pos),
        }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, TokenizerError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| self.err("truncated varint"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TokenizerError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| self.err("field runs past the end"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn bytes(&mut self) -> Result<&'a [u8], TokenizerError> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| self.err("length too large"))?;
        self.take(n)
    }

    /// Next (field number, wire type).
    fn key(&mut self) -> Result<(u64, u8), TokenizerError> {
        let k = self.varint()?;
        Ok((k >> 3, (k & 7) as u8))
    }

    fn skip(&mut self, wire: u8) -> Result<(), TokenizerError> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.take(8).map(|_| ()),
            2 => self.bytes().map(|_| ()),
            5 => self.take(4).map(|_| ()),
            _ => Err(self.err(&format!("unsupported wire type {wire}"))),
        }
    }

    fn f32(&mut self) -> Result<f32, TokenizerError> {
        let b = self.take(4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

impl SpmModel {
    /// Parses a serialized `ModelProto`.
    pub fn parse(buf: &[u8], origin: &str) -> Result<Self, TokenizerError> {
        let mut m = SpmModel {
            unk_id: 0,
            eos_id: 2,
            pad_id: -1,
            ..Default::default()
        };
        let mut r = Reader::new(buf, origin);
        while !r.done() {
            match r.key()? {
                (1, 2) => {
                    let body = r.bytes()?;
                    m.pieces.push(parse_piece(body, origin)?);
                }
                (2, 2) => {
                    let body = r.bytes()?;
                    let mut t = Reader::new(body, origin);
                    while !t.done() {
                        match t.key()? {
                            (35, 0) => m.byte_fallback = t.varint()? != 0,
                            // int32 fields are sign-extended varints.
                            (40, 0) => m.unk_id = t.varint()? as i64 as i32,
                            (42, 0) => m.eos_id = t.varint()? as i64 as i32,
                            (43, 0) => m.pad_id = t.varint()? as i64 as i32,
                            (_, w) => t.skip(w)?,
                        }
                    }
                }
                (3, 2) => {
                    let body = r.bytes()?;
                    let mut n = Reader::new(body, origin);
                    while !n.done() {
                        match n.key()? {
                            (2, 2) => m.precompiled_charsmap = n.bytes()?.to_vec(),
                            (_, w) => n.skip(w)?,
                        }
                    }
                }
                (_, w) => r.skip(w)?,
            }
        }
        if m.pieces.is_empty() {
            return Err(TokenizerError::Format {
                path: origin.to_string(),
                reason: "no pieces: not a SentencePiece model".into(),
            });
        }
        Ok(m)
    }
}

fn parse_piece(body: &[u8], origin: &str) -> Result<(String, f32, i32), TokenizerError> {
    let mut r = Reader::new(body, origin);
    let (mut piece, mut score, mut kind) = (None, 0.0f32, piece_type::NORMAL);
    while !r.done() {
        match r.key()? {
            (1, 2) => {
                let b = r.bytes()?;
                piece =
                    Some(String::from_utf8(b.to_vec()).map_err(|_| r.err("piece is not UTF-8"))?);
            }
            (2, 5) => score = r.f32()?,
            (3, 0) => kind = r.varint()? as i32,
            (_, w) => r.skip(w)?,
        }
    }
    let piece = piece.ok_or_else(|| r.err("piece without text"))?;
    Ok((piece, score, kind))
}

/// Builds the T5 tokenizer from a piece list (shared by `spiece.model` and GGUF metadata).
///
/// Pieces of type UNKNOWN, CONTROL and USER_DEFINED are matched verbatim in the input as special
/// tokens. `unk_hint` is used only when no piece has type UNKNOWN.
pub fn tokenizer_from_pieces(
    pieces: Vec<(String, f64, i32)>,
    charsmap: &[u8],
    extra_ids: usize,
    unk_hint: Option<u32>,
    byte_fallback: bool,
    origin: &str,
) -> Result<T5Tokenizer, TokenizerError> {
    let vocab_err = |reason: String| TokenizerError::Vocab {
        origin: origin.to_string(),
        reason,
    };
    let mut added = Vec::new();
    let mut unk = None;
    let mut vocab = Vec::with_capacity(pieces.len() + extra_ids);
    for (i, (piece, score, kind)) in pieces.into_iter().enumerate() {
        let id = u32::try_from(i).map_err(|_| vocab_err("too many pieces".into()))?;
        match kind {
            piece_type::UNKNOWN => {
                unk.get_or_insert(id);
                added.push((piece.clone(), id));
            }
            piece_type::CONTROL | piece_type::USER_DEFINED => added.push((piece.clone(), id)),
            _ => {}
        }
        vocab.push((piece, score));
    }
    for n in (0..extra_ids).rev() {
        let piece = format!("<extra_id_{n}>");
        added.push((piece.clone(), vocab.len() as u32));
        vocab.push((piece, 0.0));
    }
    if vocab.len() >= i32::MAX as usize {
        return Err(vocab_err("vocabulary too large for i32 ids".into()));
    }
    let by_name = vocab
        .iter()
        .position(|(p, _)| p == "<unk>")
        .map(|i| i as u32);
    let unk_id = unk
        .or(unk_hint)
        .or(by_name)
        .ok_or_else(|| vocab_err("no piece of type UNKNOWN (<unk>)".into()))?;
    let model = Unigram::new(vocab, unk_id, origin)?;
    let eos = model
        .token_to_id("</s>")
        .ok_or_else(|| vocab_err("no </s> piece (T5 appends it to every prompt)".into()))?;
    let pad_id = model.token_to_id("<pad>").unwrap_or(0);
    let mut normalizers = Vec::new();
    if !charsmap.is_empty() {
        normalizers.push(Normalizer::Precompiled(Precompiled::from_bytes(
            charsmap, origin,
        )?));
    }
    Ok(T5Tokenizer {
        model,
        byte_fallback,
        normalizers,
        pre_tokenizers: vec![
            PreTokenizer::WhitespaceSplit,
            PreTokenizer::Metaspace {
                replacement: '▁',
                prepend: PrependScheme::Always,
                split: true,
            },
        ],
        added,
        prefix_ids: Vec::new(),
        suffix_ids: vec![eos],
        pad_id,
    })
}

/// Builds a T5 tokenizer from the bytes of a `spiece.model`, adding `extra_ids` sentinels
/// (100 for T5).
pub fn from_spiece_model(
    buf: &[u8],
    extra_ids: usize,
    origin: &str,
) -> Result<T5Tokenizer, TokenizerError> {
    let m = SpmModel::parse(buf, origin)?;
    let unk_hint = u32::try_from(m.unk_id).ok();
    let pieces = m
        .pieces
        .into_iter()
        .map(|(p, s, t)| (p, f64::from(s), t))
        .collect();
    tokenizer_from_pieces(
        pieces,
        &m.precompiled_charsmap,
        extra_ids,
        unk_hint,
        m.byte_fallback,
        origin,
    )
}

/// Builds a T5 tokenizer from GGUF-style metadata (`tokenizer.ggml.tokens`, `.scores`,
/// `.token_type`, and `.precompiled_charsmap` when the file has it). No sentinels are added.
/// Without a charsmap the NFKC-style normalization is skipped (ids can differ for non-ASCII text).
pub fn from_gguf_vocab(
    tokens: Vec<String>,
    scores: Vec<f32>,
    token_types: Vec<i32>,
    precompiled_charsmap: Option<&[u8]>,
) -> Result<T5Tokenizer, TokenizerError> {
    let origin = "GGUF tokenizer metadata";
    if scores.len() != tokens.len() || token_types.len() != tokens.len() {
        return Err(TokenizerError::Vocab {
            origin: origin.into(),
            reason: format!(
                "{} tokens but {} scores and {} token types",
                tokens.len(),
                scores.len(),
                token_types.len()
            ),
        });
    }
    let pieces = tokens
        .into_iter()
        .zip(scores)
        .zip(token_types)
        .map(|((p, s), t)| (p, f64::from(s), t))
        .collect();
    tokenizer_from_pieces(
        pieces,
        precompiled_charsmap.unwrap_or(&[]),
        0,
        None,
        false,
        origin,
    )
}
