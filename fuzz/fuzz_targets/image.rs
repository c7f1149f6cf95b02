//! Every input image format (`--init-img`, `-r`): PNG, JPEG, WebP, BMP, and the metadata
//! reader of `-M metadata` on the same bytes.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sd_cli::image_io::{read_image_from_bytes, read_text_metadata};

fn scratch() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| std::env::temp_dir().join(format!("sd-cli-fuzz-{}.img", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(img) = read_image_from_bytes(data, Path::new("fuzz.img")) {
        assert_eq!(
            img.data.len(),
            img.width as usize * img.height as usize * img.channels.count()
        );
    }
    if std::fs::write(scratch(), data).is_ok() {
        let _ = read_text_metadata(scratch());
    }
});
