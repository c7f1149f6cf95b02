//! tokenizer.json loader; accepted tokenizers must encode without panicking and emit only ids
//! inside their vocabulary. The input's first line (up to 256 bytes) doubles as a prompt.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sd_cli::tokenizers::from_tokenizer_json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(tok) = from_tokenizer_json(text, "fuzz.tokenizer.json") else {
        return;
    };
    let prompt: String = text
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(256)
        .collect();
    let n = tok.model().len();
    for p in [prompt.as_str(), "a photo of ＡＢＣ é\u{301} </s>", ""] {
        for id in tok.encode(p, 128, true).ids {
            assert!(id >= 0 && (id as usize) < n, "id {id} outside vocab {n}");
        }
    }
});
