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
mod soundtrack;
mod still;
mod target;
mod webm;
mod webp_anim;
mod xmp;

pub use error::VideoError;
pub use target::{is_video_path, video_output_path, VideoFormat};

use std::path::{Path, PathBuf};

use super::audio::{write_wav, Audio};
use super::write::write_bytes_atomic;
use super::Image;
use soundtrack::Pcm;

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
    write_video_with_audio(path, frames, fps, metadata, first, None)
}

/// [`write_video`] with a soundtrack: muxed as 16-bit PCM into `.avi` and `.webm` files; an
/// animated WebP or an image sequence gets it as a `.wav` beside ([`soundtrack_path`]).
pub fn write_video_with_audio(
    path: &Path,
    frames: &[Image],
    fps: u32,
    metadata: Option<&str>,
    first: u64,
    audio: Option<&Audio>,
) -> Result<Vec<PathBuf>, VideoError> {
    let format = VideoFormat::of(path).ok_or_else(|| VideoError::UnknownFormat {
        path: path.to_path_buf(),
    })?;
    let size = frames::check(path, frames, fps)?;
    let pcm = audio.filter(|a| !a.is_empty()).map(Pcm::of);
    let (bytes, beside) = match format {
        VideoFormat::Avi => (
            avi::encode(path, frames, size, fps, metadata, pcm.as_ref())?,
            false,
        ),
        VideoFormat::WebM => (
            webm::encode(path, frames, size, fps, metadata, pcm.as_ref())?,
            false,
        ),
        VideoFormat::WebP => (webp_anim::encode(path, frames, size, fps, metadata)?, true),
        VideoFormat::Sequence => {
            let mut written = sequence::write(path, first, frames, metadata)?;
            if let Some(a) = audio.filter(|a| !a.is_empty()) {
                written.push(write_soundtrack(path, a)?);
            }
            return Ok(written);
        }
    };
    write_bytes_atomic(path, &bytes)?;
    let mut written = vec![path.to_path_buf()];
    if let (true, Some(a)) = (beside, audio.filter(|a| !a.is_empty())) {
        written.push(write_soundtrack(path, a)?);
    }
    Ok(written)
}

/// Where the soundtrack of a container without audio goes: the video's name with `.wav`
/// (a sequence pattern without its `%d` directive: `frames_%03d.png` → `frames.wav`).
pub fn soundtrack_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = match stem.find('%') {
        Some(at) => {
            let rest = &stem[at + 1..];
            let end = rest.find('d').map_or(rest.len(), |d| d + 1);
            format!("{}{}", &stem[..at], &rest[end..])
        }
        None => stem,
    };
    let stem = stem.trim_end_matches(['_', '-', '.', ' ']);
    let stem = if stem.is_empty() { "audio" } else { stem };
    path.with_file_name(format!("{stem}.wav"))
}

fn write_soundtrack(path: &Path, audio: &Audio) -> Result<PathBuf, VideoError> {
    let wav = soundtrack_path(path);
    write_wav(&wav, audio)?;
    Ok(wav)
}
