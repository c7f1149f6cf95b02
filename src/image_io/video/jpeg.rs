//! JPEG frames and stills at upstream's quality 90, and the text segments that carry the
//! generation parameters in a still JPEG: an EXIF `UserComment` (A1111 reads it) and upstream's
//! COM segment `parameters\0<text>`.

use crate::image_io::encode::{after_jfif, comment, plain_jpeg, segment};
use crate::image_io::exif::user_comment_block;
use crate::image_io::{Image, PARAMETERS_KEYWORD};

/// The largest JPEG segment payload (its 16-bit length counts itself).
const MAX_SEGMENT: usize = 0xffff - 2;

/// `frame` as a baseline JPEG; alpha is dropped (JPEG has none; upstream's stb writer drops it).
pub(super) fn encode(frame: &Image) -> Result<Vec<u8>, String> {
    plain_jpeg(frame)
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
    meta.extend(segment(0xfe, &comment(PARAMETERS_KEYWORD, text)));
    let at = after_jfif(&jpeg).ok_or("the JPEG encoder wrote no start-of-image marker")?;
    jpeg.splice(at..at, meta);
    Ok(jpeg)
}
