//! safetensors header parser, index parser, and (for accepted files) the invariants the
//! loader relies on: every tensor's bytes lie inside the file and match dtype × shape.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sd_cli::weights::safetensors::{parse_index, parse_safetensors};

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.safetensors");
    if let Ok(h) = parse_safetensors(data, path) {
        for t in &h.tensors {
            let end = t.offset.checked_add(t.len).expect("offset + len overflows");
            assert!(end <= data.len() as u64, "tensor '{}' past the end", t.name);
            assert!(t.offset >= h.data_start);
        }
    }
    let _ = parse_index(data, Path::new("fuzz.safetensors.index.json"));
});
