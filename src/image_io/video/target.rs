//! Which kind of video an output path asks for, and upstream's fallback name.
//!
//! Upstream (`save_results` in examples/cli/main.cpp) checks for a `%d` pattern first, then
//! uses `.avi`, `.webp` or `.webm` as given; any other name gets `.avi` (after dropping a
//! `.png`/`.jpg`/`.jpeg`/`.jpe` extension): `out.png` → `out.avi`, `out.mp4` → `out.mp4.avi`.

use std::path::{Path, PathBuf};

use crate::app::output_path::has_index_specifier;
use crate::image_io::OutputFormat;

/// How [`super::write_video`] writes a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VideoFormat {
    /// `.avi`: Motion-JPEG in a RIFF AVI container.
    Avi,
    /// `.webp`: animated WebP, lossless frames.
    WebP,
    /// `.webm`: VP8 key frames in a WebM container.
    WebM,
    /// A `%d` / `%0Nd` pattern: one image per frame.
    Sequence,
}

impl VideoFormat {
    /// The format `path` names: a `%d`-style pattern first (as upstream), then the
    /// extension (any case); `None` for anything else.
    pub fn of(path: &Path) -> Option<VideoFormat> {
        if path.to_str().is_some_and(has_index_specifier) {
            return Some(VideoFormat::Sequence);
        }
        match lower_ext(path)?.as_str() {
            "avi" => Some(VideoFormat::Avi),
            "webp" => Some(VideoFormat::WebP),
            "webm" => Some(VideoFormat::WebM),
            _ => None,
        }
    }
}

fn lower_ext(path: &Path) -> Option<String> {
    path.extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
}

/// True for the single-file video extensions upstream recognises: `.avi`, `.webp`, `.webm`
/// (any case). A `.webp` is a still image too: callers decide by the frame count.
pub fn is_video_path(path: &Path) -> bool {
    matches!(
        VideoFormat::of(path),
        Some(VideoFormat::Avi | VideoFormat::WebP | VideoFormat::WebM)
    )
}

/// Where upstream writes a multi-frame `-M vid_gen` result for `-o output`: patterns and
/// `.avi`/`.webp`/`.webm` names as given, any other name as `.avi` (see the module docs).
pub fn video_output_path(output: &Path) -> PathBuf {
    if VideoFormat::of(output).is_some() {
        return output.to_path_buf();
    }
    let base = if OutputFormat::from_extension(output).is_some() {
        output.with_extension("")
    } else {
        output.to_path_buf()
    };
    let mut name = base.into_os_string();
    name.push(".avi");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_by_pattern_then_extension() {
        for (p, f) in [
            ("a.avi", Some(VideoFormat::Avi)),
            ("a.AVI", Some(VideoFormat::Avi)),
            ("a.WebP", Some(VideoFormat::WebP)),
            ("a.webm", Some(VideoFormat::WebM)),
            ("f_%03d.png", Some(VideoFormat::Sequence)),
            ("f_%d.avi", Some(VideoFormat::Sequence)),
            ("f_%%d.avi", Some(VideoFormat::Avi)),
            ("a.png", None),
            ("a", None),
        ] {
            assert_eq!(VideoFormat::of(Path::new(p)), f, "{p}");
        }
    }

    #[test]
    fn fallback_names_as_upstream() {
        for (o, want) in [
            ("out.png", "out.avi"),
            ("dir.v2/out.JPG", "dir.v2/out.avi"),
            ("out", "out.avi"),
            ("out.mp4", "out.mp4.avi"),
            ("out.webm", "out.webm"),
            ("out.WEBP", "out.WEBP"),
            ("f_%03d.jpg", "f_%03d.jpg"),
        ] {
            assert_eq!(video_output_path(Path::new(o)), PathBuf::from(want), "{o}");
        }
    }
}
