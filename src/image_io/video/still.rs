//! One image of a sequence, with the parameters text as upstream's `write_image_to_file`
//! stores it: PNG `parameters` text chunk; JPEG (quality 90) COM segment and EXIF
//! `UserComment`; WebP (lossless, as our still WebPs) `EXIF` and `XMP ` chunks.

use std::path::Path;

use super::{jpeg, xmp, VideoError};
use crate::image_io::exif::user_comment_block;
use crate::image_io::write::write_bytes_atomic;
use crate::image_io::{write_png_atomic, Channels, Image, OutputFormat, PARAMETERS_KEYWORD};

/// Writes `frame` to `path` atomically, in the format its extension names (PNG for others).
pub(super) fn write(path: &Path, frame: &Image, text: Option<&str>) -> Result<(), VideoError> {
    let encode_err = |message: String| VideoError::Encode {
        path: path.to_path_buf(),
        message,
    };
    let bytes = match OutputFormat::of(path) {
        OutputFormat::Png => {
            let chunks: Vec<(String, String)> = text
                .map(|t| vec![(PARAMETERS_KEYWORD.to_string(), t.to_string())])
                .unwrap_or_default();
            return Ok(write_png_atomic(path, frame, &chunks)?);
        }
        OutputFormat::Jpeg => {
            let plain = jpeg::encode(frame).map_err(encode_err)?;
            match text {
                Some(t) => jpeg::with_text(plain, t).map_err(encode_err)?,
                None => plain,
            }
        }
        OutputFormat::WebP => webp(frame, text).map_err(encode_err)?,
    };
    Ok(write_bytes_atomic(path, &bytes)?)
}

/// Lossless WebP with `EXIF` and `XMP ` chunks when there is text.
fn webp(frame: &Image, text: Option<&str>) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut enc = image_webp::WebPEncoder::new(&mut out);
    if let Some(t) = text {
        enc.set_exif_metadata(user_comment_block(t));
        enc.set_xmp_metadata(xmp::packet(t).into_bytes());
    }
    let color = match frame.channels {
        Channels::Rgb => image_webp::ColorType::Rgb8,
        Channels::Rgba => image_webp::ColorType::Rgba8,
    };
    enc.encode(&frame.data, frame.width, frame.height, color)
        .map_err(|e| e.to_string())?;
    Ok(out)
}
