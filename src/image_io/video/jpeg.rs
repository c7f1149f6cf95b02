//! JPEG frames and stills at upstream's quality 90, and the text segments that carry the
//! generation parameters in a still JPEG: an EXIF `UserComment` (A1111 reads it) and upstream's
//! COM segment `parameters\0<text>`.

use crate::image_io::exif::user_comment_block;
use crate::image_io::{Image, JPEG_QUALITY, PARAMETERS_KEYWORD};

/// The largest JPEG segment payload (its 16-bit length counts itself).
const MAX_SEGMENT: usize = 0xffff - 2;

/// `frame` as a baseline JPEG; alpha is dropped (JPEG has none; upstream's stb writer drops it).
pub(super) fn encode(frame: &Image) -> Result<Vec<u8>, String> {
    let rgb = frame.to_rgb();
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY)
        .encode(
            &rgb.data,
            rgb.width,
            rgb.height,
            image::ExtendedColorType::Rgb8,
        )
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// `jpeg` with the EXIF and COM segments for `text` inserted after SOI and any JFIF APP0.
/// Text too long for one segment is cut in the COM segment (as upstream) and left out of EXIF.
pub(super) fn with_text(mut jpeg: Vec<u8>, text: &str) -> Result<Vec<u8>, String> {
    let mut meta = Vec::new();
    let mut exif = b"Exif\0\0".to_vec();
    exif.extend(user_comment_block(text));
    if exif.len() <= MAX_SEGMENT {
        meta.extend(segment(0xe1, &exif));
    }
    let mut comment = PARAMETERS_KEYWORD.as_bytes().to_vec();
    comment.push(0);
    comment.extend_from_slice(text.as_bytes());
    comment.truncate(MAX_SEGMENT);
    meta.extend(segment(0xfe, &comment));
    let at = after_jfif(&jpeg).ok_or("the JPEG encoder wrote no start-of-image marker")?;
    jpeg.splice(at..at, meta);
    Ok(jpeg)
}

/// A JPEG segment: marker, big-endian length (payload + 2), payload (at most `MAX_SEGMENT`).
fn segment(marker: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0xff, marker];
    out.extend(((payload.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Where metadata segments go: after SOI and a JFIF APP0, if there is one.
fn after_jfif(jpeg: &[u8]) -> Option<usize> {
    if !jpeg.starts_with(&[0xff, 0xd8]) {
        return None;
    }
    if jpeg.get(2..4) == Some(&[0xff, 0xe0]) {
        let len = u16::from_be_bytes([*jpeg.get(4)?, *jpeg.get(5)?]) as usize;
        return Some(4 + len);
    }
    Some(2)
}
