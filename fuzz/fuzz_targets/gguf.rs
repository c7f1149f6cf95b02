//! GGUF validator + reader; for accepted files, the loader invariants, and the T5 tokenizer
//! built from `tokenizer.ggml.*` metadata when the file has it.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sd_cli::tokenizers::from_gguf_vocab;
use sd_cli::weights::gguf::parse_gguf;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = parse_gguf(data, Path::new("fuzz.gguf")) else {
        return;
    };
    for t in &h.tensors {
        let end = t.offset.checked_add(t.len).expect("offset + len overflows");
        assert!(end <= data.len() as u64, "tensor '{}' past the end", t.name);
        assert!(!t.ne.is_empty() && t.ne.len() <= 4);
        assert_eq!(t.dtype.nbytes(&t.ne), Some(t.len));
    }
    let m = &h.metadata;
    if let Some(tokens) = m.get_arr_str("tokenizer.ggml.tokens") {
        let tokens = tokens.into_iter().map(str::to_string).collect();
        let scores = m.get_arr_f32("tokenizer.ggml.scores").unwrap_or_default();
        let types = m
            .get_arr_i32("tokenizer.ggml.token_type")
            .unwrap_or_default();
        if let Ok(tok) = from_gguf_vocab(tokens, scores, types, None) {
            let n = tok.model().len();
            for id in tok.encode("a photo of a cat </s> ab", 64, true).ids {
                assert!(id >= 0 && (id as usize) < n);
            }
        }
    }
});
