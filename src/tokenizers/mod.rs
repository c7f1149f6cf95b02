//! Tokenizers that read the files users already have (tokenizer.json, spiece.model, GGUF metadata).

pub mod unigram;
