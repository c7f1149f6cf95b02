//! A folder of images read as video frames (`--control-video`), as upstream's
//! `load_images_from_dir`: the regular files whose extension is .jpg, .jpeg, .png, .bmp or
//! .webp (any case), in byte order of their file names, at most `max` of them.

use std::path::{Path, PathBuf};

use super::{read_image, Image, ImageIoError};

/// Extensions upstream reads as frames.
const FRAME_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "bmp", "webp"];

/// The frame files of `dir` in order, at most `max` (0: no limit).
pub fn frame_files(dir: &Path, max: usize) -> Result<Vec<PathBuf>, ImageIoError> {
    let read_err = |source| ImageIoError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        if !entry.file_type().map_err(read_err)?.is_file() {
            continue;
        }
        let path = entry.path();
        let is_frame = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| FRAME_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()));
        if is_frame {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    if max > 0 {
        files.truncate(max);
    }
    Ok(files)
}

/// Decodes the frames of `dir` (see [`frame_files`]); a file that does not decode is an error
/// naming it.
pub fn read_frames_dir(dir: &Path, max: usize) -> Result<Vec<Image>, ImageIoError> {
    frame_files(dir, max)?
        .iter()
        .map(|p| read_image(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_image_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "b.PNG",
            "a.jpg",
            "c.txt",
            "a0.webp",
            "frame_10.bmp",
            "frame_09.jpeg",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        std::fs::create_dir(dir.path().join("d.png")).unwrap();
        let names = |max| -> Vec<String> {
            frame_files(dir.path(), max)
                .unwrap()
                .iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            names(0),
            ["a.jpg", "a0.webp", "b.PNG", "frame_09.jpeg", "frame_10.bmp"]
        );
        assert_eq!(names(2), ["a.jpg", "a0.webp"]);
        // A file that is not an image is an error naming it.
        let e = read_frames_dir(dir.path(), 1).unwrap_err().to_string();
        assert!(e.contains("a.jpg"), "{e}");
    }
}
