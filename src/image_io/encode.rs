//! Output images by the extension of `-o`, as upstream (`examples/common/media_io.cpp`): `.png`
//! (and any other extension), `.jpg`/`.jpeg`/`.jpe` (quality 90) and `.webp`, each with the
//! generation parameters where the format holds them:
//!
//! - PNG: `parameters` (A1111 text) and `sd-cli-json` text chunks;
//! - JPEG: an EXIF APP1 `UserComment` (A1111, read by its PNG-info tab) and COM segments
//!   `parameters\0<text>` (upstream's stb_image_write) and `sd-cli-json\0<json>`;
//! - WebP: an `EXIF` chunk (A1111) and upstream's `XMP ` packet (`sdcpp:parameters`, here also
//!   `sdcpp:sd-cli-json`).
//!
//! WebP is written lossless: no maintained pure-Rust lossy (VP8) encoder exists, and libwebp
//! would add a C build; upstream's quality 90 is lossy, so files are larger but pixels exact.

use std::path::Path;

use super::exif;
use super::params::{GenerationParams, JSON_KEYWORD, PARAMETERS_KEYWORD};
use super::write::{encode_png, write_bytes_atomic};
use super::{Channels, Image, ImageIoError};

/// JPEG quality of outputs (upstream's `write_image_to_file(..., 90)`).
pub const JPEG_QUALITY: u8 = 90;

/// The largest JPEG segment payload (its 16-bit length counts itself).
const MAX_SEGMENT: usize = 0xffff - 2;

/// How an output file is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Png,
    Jpeg,
    WebP,
}

impl OutputFormat {
    /// The format a path's extension names (case-insensitive), as upstream's
    /// `encoded_image_format_from_path`; `None` for other extensions.
    pub fn from_extension(path: &Path) -> Option<OutputFormat> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        match ext.as_str() {
            "png" => Some(OutputFormat::Png),
            "jpg" | "jpeg" | "jpe" => Some(OutputFormat::Jpeg),
            "webp" => Some(OutputFormat::WebP),
            _ => None,
        }
    }

    /// By the path's extension; PNG for any other.
    pub fn of(path: &Path) -> OutputFormat {
        Self::from_extension(path).unwrap_or(OutputFormat::Png)
    }
}

/// Writes a generated image in the format its extension names, with its metadata unless
/// `params` is `None` (`--disable-image-metadata`); atomically, as [`super::write_png_atomic`].
pub fn write_generation_image(
    path: &Path,
    image: &Image,
    params: Option<&GenerationParams>,
) -> Result<(), ImageIoError> {
    let text = params.map(|p| (p.to_a1111(), p.to_json()));
    let bytes = match OutputFormat::of(path) {
        OutputFormat::Png => {
            let chunks: Vec<(String, String)> = text
                .map(|(a, j)| vec![(PARAMETERS_KEYWORD.into(), a), (JSON_KEYWORD.into(), j)])
                .unwrap_or_default();
            encode_png(path, image, &chunks)?
        }
        OutputFormat::Jpeg => encode_jpeg(image, text.as_ref()).map_err(|m| encode_err(path, m))?,
        OutputFormat::WebP => encode_webp(image, text.as_ref()).map_err(|m| encode_err(path, m))?,
    };
    write_bytes_atomic(path, &bytes)
}

fn encode_err(path: &Path, message: String) -> ImageIoError {
    ImageIoError::Encode {
        path: path.to_path_buf(),
        message,
    }
}

/// A JPEG segment: marker, 16-bit length, payload.
pub(crate) fn segment(marker: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0xff, marker];
    out.extend(((payload.len() + 2) as u16).to_be_bytes());
    out.extend(payload);
    out
}

/// `keyword\0text` as a COM payload, cut to fit one segment (as upstream).
pub(crate) fn comment(keyword: &str, text: &str) -> Vec<u8> {
    let mut payload = keyword.as_bytes().to_vec();
    payload.push(0);
    payload.extend(text.as_bytes());
    payload.truncate(MAX_SEGMENT);
    payload
}

/// A baseline JPEG at [`JPEG_QUALITY`] without metadata; alpha is dropped (JPEG has none).
pub(crate) fn plain_jpeg(image: &Image) -> Result<Vec<u8>, String> {
    let rgb = image.to_rgb();
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, JPEG_QUALITY)
        .encode(
            &rgb.data,
            rgb.width,
            rgb.height,
            image::ExtendedColorType::Rgb8,
        )
        .map_err(|e| e.to_string())?;
    Ok(jpeg)
}

/// JPEG at [`JPEG_QUALITY`] (alpha dropped), with the metadata segments after SOI / JFIF.
fn encode_jpeg(image: &Image, text: Option<&(String, String)>) -> Result<Vec<u8>, String> {
    let mut jpeg = plain_jpeg(image)?;
    let Some((a1111, json)) = text else {
        return Ok(jpeg);
    };
    let mut meta = Vec::new();
    let mut exif = b"Exif\0\0".to_vec();
    exif.extend(exif::user_comment_block(a1111));
    if exif.len() <= MAX_SEGMENT {
        meta.extend(segment(0xe1, &exif));
    }
    meta.extend(segment(0xfe, &comment(PARAMETERS_KEYWORD, a1111)));
    let json = comment(JSON_KEYWORD, json);
    // A record cut short is no JSON: leave it out.
    if json.len() < MAX_SEGMENT {
        meta.extend(segment(0xfe, &json));
    }
    let at = after_jfif(&jpeg).ok_or("the JPEG encoder wrote no start-of-image marker")?;
    jpeg.splice(at..at, meta);
    Ok(jpeg)
}

/// Where metadata segments go: after SOI and a JFIF APP0, if there is one.
pub(crate) fn after_jfif(jpeg: &[u8]) -> Option<usize> {
    if !jpeg.starts_with(&[0xff, 0xd8]) {
        return None;
    }
    if jpeg.get(2..4) == Some(&[0xff, 0xe0]) {
        let len = u16::from_be_bytes([*jpeg.get(4)?, *jpeg.get(5)?]) as usize;
        return Some(4 + len);
    }
    Some(2)
}

pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Upstream's XMP packet (`build_webp_xmp_packet`), with the JSON record beside it.
pub(super) fn xmp_packet(a1111: &str, json: &str) -> String {
    format!(
        "<?xpacket begin=\"\" id=\"W5M0MpCehiHzreSzNTczkc9d\"?>\n\
         <x:xmpmeta xmlns:x=\"adobe:ns:meta/\">\n  \
         <rdf:RDF xmlns:rdf=\"http://www.w3.org/1999/02/22-rdf-syntax-ns#\">\n    \
         <rdf:Description xmlns:sdcpp=\"https://github.com/leejet/stable-diffusion.cpp/ns/1.0/\">\n      \
         <sdcpp:parameters>{}</sdcpp:parameters>\n      \
         <sdcpp:sd-cli-json>{}</sdcpp:sd-cli-json>\n    \
         </rdf:Description>\n  </rdf:RDF>\n</x:xmpmeta>\n<?xpacket end=\"w\"?>",
        xml_escape(a1111),
        xml_escape(json)
    )
}

/// Lossless WebP with `EXIF` and `XMP ` chunks.
fn encode_webp(image: &Image, text: Option<&(String, String)>) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut enc = image_webp::WebPEncoder::new(&mut out);
    if let Some((a1111, json)) = text {
        enc.set_exif_metadata(exif::user_comment_block(a1111));
        enc.set_xmp_metadata(xmp_packet(a1111, json).into_bytes());
    }
    let color = match image.channels {
        Channels::Rgb => image_webp::ColorType::Rgb8,
        Channels::Rgba => image_webp::ColorType::Rgba8,
    };
    enc.encode(&image.data, image.width, image.height, color)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_choose_the_format() {
        for (p, f) in [
            ("a.png", OutputFormat::Png),
            ("a.JPG", OutputFormat::Jpeg),
            ("a.jpeg", OutputFormat::Jpeg),
            ("a.jpe", OutputFormat::Jpeg),
            ("dir.x/a.WebP", OutputFormat::WebP),
            ("a", OutputFormat::Png),
            ("a.bmp", OutputFormat::Png),
        ] {
            assert_eq!(OutputFormat::of(Path::new(p)), f, "{p}");
        }
    }

    #[test]
    fn xml_is_escaped() {
        assert_eq!(xml_escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
    }
}
