//! Tokenizers that read the files users already have (tokenizer.json, spiece.model, vocab.json +
//! merges.txt, GGUF metadata).
//!
//! T5 v1.1 (PixArt's text encoder) uses a SentencePiece unigram model; the pipeline here
//! reproduces HF `tokenizers` id for id (see `tests/tokenizers.rs`). Qwen (Qwen Image 2.1's
//! Qwen3-VL text encoder) uses byte-level BPE ([`BpeTokenizer`], `tests/qwen_tokenizer.rs`).
//! CLIP (SD 1.x / 2.x / SDXL) uses BPE with `</w>` word ends and a vocabulary built into the
//! binary ([`ClipTokenizer`], with the SD conditioner's 77-token chunks); prompt emphasis
//! (`(word:1.5)`, `BREAK`) is parsed for every family by [`parse_emphasis`].

pub mod bpe;
mod bpe_load;
pub mod clip;
pub mod emphasis;
pub mod error;
mod grapheme;
pub mod load;
mod nfc;
mod nfc_tables;
pub mod precompiled;
pub mod sentencepiece_model;
pub mod t5;
pub mod tokenizer_json;
mod unicode_tables;
pub mod unigram;

pub use bpe::{BpeOptions, BpeTokenizer, QWEN_ADDED_TOKENS};
pub use bpe_load::{
    bpe_from_gguf_metadata, bpe_from_gguf_vocab, bpe_from_tokenizer_json, bpe_from_vocab_merges,
    find_qwen_tokenizer, load_qwen_tokenizer,
};
pub use clip::{ClipTextRules, ClipTokenizer, CustomWords, PromptChunk};
pub use emphasis::{parse_emphasis, EmphasisError, WeightedText};
pub use error::TokenizerError;
pub use load::{
    find_t5_tokenizer, find_umt5_tokenizer, load_t5_tokenizer, MAX_TOKENIZER_FILE_BYTES,
    T5_EXTRA_IDS,
};
pub use nfc::nfc;
pub use sentencepiece_model::{from_gguf_vocab, from_spiece_model};
pub use t5::{pixart_clean, Encoding, T5Tokenizer};
pub use tokenizer_json::from_tokenizer_json;
