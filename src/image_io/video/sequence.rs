//! Image sequences: `-o frames_%03d.png` writes one image per frame, named as upstream's
//! `save_results` names them (see `crate::app::output_path`, shared with still-image batches):
//! the pattern formatted with `first + i`; `.png`, `.jpg`/`.jpeg`/`.jpe` or `.webp` by its
//! extension, PNG (with `.png` appended) for any other.

use std::path::{Path, PathBuf};

use super::{still, VideoError};
use crate::app::output_path::output_path_for;
use crate::image_io::Image;

/// Writes `frames` to the names `pattern` gives for indices `first`, `first + 1`, ...;
/// returns those paths. Stops at the first failure: files already written stay.
pub(super) fn write(
    pattern: &Path,
    first: u64,
    frames: &[Image],
    text: Option<&str>,
) -> Result<Vec<PathBuf>, VideoError> {
    // `VideoFormat::of` only finds patterns in UTF-8 names.
    let pattern_text = pattern.to_str().ok_or_else(|| VideoError::UnknownFormat {
        path: pattern.to_path_buf(),
    })?;
    let total = frames.len() as u64;
    if first.checked_add(total).is_none() {
        return Err(VideoError::TooLarge {
            path: pattern.to_path_buf(),
            reason: format!("frame numbers from {first} overflow"),
        });
    }
    let mut written = Vec::with_capacity(frames.len());
    for (i, frame) in frames.iter().enumerate() {
        let path = output_path_for(pattern_text, first, i as u64, total);
        still::write(&path, frame, text)?;
        written.push(path);
    }
    Ok(written)
}
