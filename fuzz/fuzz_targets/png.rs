//! PNG decoder (`--init-img`, `-r`) and the text-chunk reader of `-M metadata`.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sd_cli::image_io::{read_png_from_bytes, read_png_text_chunks};

fn scratch() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| std::env::temp_dir().join(format!("sd-cli-fuzz-{}.png", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(img) = read_png_from_bytes(data, Path::new("fuzz.png")) {
        assert_eq!(
            img.data.len(),
            img.width as usize * img.height as usize * img.channels.count()
        );
    }
    if std::fs::write(scratch(), data).is_ok() {
        let _ = read_png_text_chunks(scratch());
    }
});
