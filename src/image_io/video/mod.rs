//! Video output of `-M vid_gen`, as upstream sd-cli writes it (examples/cli/main.cpp
//! `save_results`, examples/common/media_io.cpp):
//!
//! - `.avi`: Motion-JPEG (quality 90) in a RIFF AVI with an `idx1` index; the parameters text
//!   in `LIST INFO` `ICMT`. See `avi.rs`.
//! - `.webp`: animated WebP, looping, frame duration `round(1000 / fps)` ms, lossless VP8L
//!   frames (upstream: lossy, quality 90); the text in `EXIF` and `XMP `. See `webp_anim.rs`.
//! - A printf-style `%d` / `%0Nd` pattern (`frames_%03d.png`): one PNG, JPEG or WebP per
//!   frame, numbered from `first` (`--output-begin-idx`, default 0). Checked before the
//!   extension, as upstream does.
//! - `.webm`: one VP8 track of key frames (quality 90, as upstream's libwebm + libwebp writer),
//!   the text in a `COMMENT` tag. See `webm.rs`.
//!
//! Every file is written atomically (temporary file, fsync, rename), so a reader never sees a
//! partial video. [`video_output_path`] gives upstream's name for other `-o` values
//! (`out.png` → `out.avi`).

mod avi;
mod ebml;
mod error;
mod frames;
mod jpeg;
mod riff;
mod sequence;
mod still;
mod target;
mod webm;
mod webp_anim;
mod xmp;

pub use error::VideoError;
pub use target::{is_video_path, video_output_path, VideoFormat};

use std::path::{Path, PathBuf};

use super::write::write_bytes_atomic;
use super::Image;

/// Writes `frames` at `fps` frames per second to `path`, in the format [`VideoFormat::of`]
/// finds, with `metadata` (the A1111 parameters text) unless `None`
/// (`--disable-image-metadata`). Frames must share one size; RGB, or RGBA whose alpha only
/// WebP keeps. `first` numbers an image sequence (`--output-begin-idx`); single files ignore
/// it. Returns the files written: `path`, or each image of a sequence.
pub fn write_video(
    path: &Path,
    frames: &[Image],
    fps: u32,
    metadata: Option<&str>,
    first: u64,
) -> Result<Vec<PathBuf>, VideoError> {
    let format = VideoFormat::of(path).ok_or_else(|| VideoError::UnknownFormat {
        path: path.to_path_buf(),
    })?;
    let encode = match format {
        VideoFormat::Avi => avi::encode,
        VideoFormat::WebP => webp_anim::encode,
        VideoFormat::WebM => webm::encode,
        VideoFormat::Sequence => {
            frames::check(path, frames, fps)?;
            return sequence::write(path, first, frames, metadata);
        }
    };
    let size = frames::check(path, frames, fps)?;
    let bytes = encode(path, frames, size, fps, metadata)?;
    write_bytes_atomic(path, &bytes)?;
    Ok(vec![path.to_path_buf()])
}
