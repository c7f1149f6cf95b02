//! SentencePiece `spiece.model` (protobuf) loader and the resulting tokenizer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sd_cli::tokenizers::from_spiece_model;

fuzz_target!(|data: &[u8]| {
    let Ok(tok) = from_spiece_model(data, 100, "fuzz.spiece.model") else {
        return;
    };
    let n = tok.model().len();
    let tail: String = String::from_utf8_lossy(&data[data.len().saturating_sub(64)..]).into_owned();
    for p in [
        tail.as_str(),
        "a photo of ＡＢＣ é\u{301} </s> <extra_id_0>",
        "",
    ] {
        for id in tok.encode(p, 128, true).ids {
            assert!(id >= 0 && (id as usize) < n, "id {id} outside vocab {n}");
        }
    }
});
