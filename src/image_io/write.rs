//! Atomic file writing, and PNG encoding with text chunks.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::params::{GenerationParams, JSON_KEYWORD, PARAMETERS_KEYWORD};
use super::{Channels, Image, ImageIoError};

/// Removes the temporary file unless the write was committed.
struct TempGuard {
    path: PathBuf,
    committed: bool,
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn temp_path_for(target: &Path) -> PathBuf {
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    dir.join(format!(".{name}.{}-{nanos}.tmp", std::process::id()))
}

fn is_latin1(s: &str) -> bool {
    s.chars().all(|c| (c as u32) < 256)
}

/// Writes `image` as PNG to `path` with `text` chunks (keyword, text) before the image
/// data. Text representable in Latin-1 goes in tEXt, other text in uncompressed iTXt
/// (UTF-8), as PIL/A1111 do. The file appears at `path` only when complete (see
/// [`write_bytes_atomic`]); on error an existing `path` is left untouched.
pub fn write_png_atomic(
    path: &Path,
    image: &Image,
    text: &[(String, String)],
) -> Result<(), ImageIoError> {
    let bytes = encode_png(path, image, text)?;
    write_bytes_atomic(path, &bytes)
}

/// The PNG file of `image` with `text` chunks, in memory (`path` names it in errors).
pub(super) fn encode_png(
    path: &Path,
    image: &Image,
    text: &[(String, String)],
) -> Result<Vec<u8>, ImageIoError> {
    // Re-check the buffer: the fields are public, so `Image::new`'s check may be bypassed.
    let expected = image.width as usize * image.height as usize * image.channels.count();
    if image.width == 0 || image.height == 0 || image.data.len() != expected {
        return Err(ImageIoError::BadBuffer {
            width: image.width,
            height: image.height,
            channels: image.channels.count(),
            len: image.data.len(),
        });
    }
    for (k, _) in text {
        if k.is_empty() || k.len() > 79 || !k.chars().all(|c| (' '..='~').contains(&c)) {
            return Err(ImageIoError::Encode {
                path: path.to_path_buf(),
                message: format!("text keyword '{k}' must be 1-79 printable ASCII characters"),
            });
        }
    }
    let encode_err = |e: png::EncodingError| ImageIoError::Encode {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, image.width, image.height);
        enc.set_color(match image.channels {
            Channels::Rgb => png::ColorType::Rgb,
            Channels::Rgba => png::ColorType::Rgba,
        });
        enc.set_depth(png::BitDepth::Eight);
        for (k, v) in text {
            if is_latin1(v) {
                enc.add_text_chunk(k.clone(), v.clone())
                    .map_err(encode_err)?;
            } else {
                enc.add_itxt_chunk(k.clone(), v.clone())
                    .map_err(encode_err)?;
            }
        }
        let mut writer = enc.write_header().map_err(encode_err)?;
        writer.write_image_data(&image.data).map_err(encode_err)?;
        writer.finish().map_err(encode_err)?;
    }
    Ok(out)
}

/// Writes `bytes` to `path` so that the file appears only when complete: to a temporary file
/// in the same directory, fsynced, then renamed over `path`; on error the temporary file is
/// removed and an existing `path` is left untouched.
pub(super) fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<(), ImageIoError> {
    let tmp = temp_path_for(path);
    let write_err = |source: std::io::Error| ImageIoError::Write {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(write_err)?;
    let mut guard = TempGuard {
        path: tmp.clone(),
        committed: false,
    };
    let mut out = BufWriter::new(file);
    out.write_all(bytes).map_err(write_err)?;
    let file: File = out.into_inner().map_err(|e| write_err(e.into_error()))?;
    file.sync_all().map_err(write_err)?;
    drop(file);
    fs::rename(&tmp, path).map_err(write_err)?;
    guard.committed = true;
    // Persist the rename itself; not all platforms can open directories, so best effort.
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Writes a generated image with its metadata (`parameters` A1111 text and `sd-cli-json`),
/// or with no text chunks when `params` is `None` (`--disable-image-metadata`).
pub fn write_generation_png(
    path: &Path,
    image: &Image,
    params: Option<&GenerationParams>,
) -> Result<(), ImageIoError> {
    let text = match params {
        Some(p) => vec![
            (PARAMETERS_KEYWORD.to_string(), p.to_a1111()),
            (JSON_KEYWORD.to_string(), p.to_json()),
        ],
        None => Vec::new(),
    };
    write_png_atomic(path, image, &text)
}
