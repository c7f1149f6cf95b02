//! PyTorch checkpoint reader (ZIP directory, legacy layout, the restricted unpickler) and, for
//! accepted files, the invariant the store relies on: every tensor's bytes lie inside the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sd_cli::weights::pickle::unpickle;
use sd_cli::weights::torch::parse_torch;

fuzz_target!(|data: &[u8]| {
    let path = Path::new("fuzz.ckpt");
    if let Ok(c) = parse_torch(data, path) {
        for t in &c.tensors {
            let end = t.offset.checked_add(t.len).expect("offset + len overflows");
            assert!(end <= data.len() as u64, "tensor '{}' past the end", t.name);
        }
    }
    // The machine alone on the raw bytes: most inputs never get past the ZIP checks.
    let _ = unpickle(data);
});
