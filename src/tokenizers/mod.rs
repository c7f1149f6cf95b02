//! Tokenizers that read the files users already have (tokenizer.json, spiece.model, GGUF metadata).
//!
//! T5 v1.1 (PixArt's text encoder) uses a SentencePiece unigram model; the pipeline here
//! reproduces HF `tokenizers` id for id (see `tests/tokenizers.rs`).

pub mod error;
mod grapheme;
pub mod load;
pub mod precompiled;
pub mod sentencepiece_model;
pub mod t5;
pub mod tokenizer_json;
mod unicode_tables;
pub mod unigram;

pub use error::TokenizerError;
pub use load::{find_t5_tokenizer, load_t5_tokenizer, MAX_TOKENIZER_FILE_BYTES, T5_EXTRA_IDS};
pub use sentencepiece_model::{from_gguf_vocab, from_spiece_model};
pub use t5::{pixart_clean, Encoding, T5Tokenizer};
pub use tokenizer_json::from_tokenizer_json;
