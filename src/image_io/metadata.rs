//! Text metadata of images (`-M metadata`): a PNG's tEXt, zTXt and iTXt chunks; a JPEG's EXIF
//! UserComment and COM segments; a WebP's EXIF UserComment and XMP parameters; in file order.
//!
//! Containers are walked by hand (bounded, every length checked) so text is available even
//! when the image itself is too large or damaged to decode. Compressed PNG text (zTXt,
//! compressed iTXt) is inflated through the `png` crate with a size limit.

use std::path::Path;

use super::decode::ImageFormat;
use super::exif;
use super::params::JSON_KEYWORD;
use super::ImageIoError;

/// Largest inflated text we accept from one compressed chunk.
const MAX_TEXT_BYTES: usize = 16 << 20;

/// Kind of PNG text chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    TEXt,
    ZTXt,
    ITXt,
    /// An EXIF UserComment (JPEG APP1, WebP `EXIF`).
    Exif,
    /// A JPEG COM segment (`keyword\0text`, upstream's layout).
    Comment,
    /// An element of an XMP packet (WebP `XMP `).
    Xmp,
}

impl TextKind {
    /// The chunk type name.
    pub fn as_str(self) -> &'static str {
        match self {
            TextKind::TEXt => "tEXt",
            TextKind::ZTXt => "zTXt",
            TextKind::ITXt => "iTXt",
            TextKind::Exif => "EXIF UserComment",
            TextKind::Comment => "COM",
            TextKind::Xmp => "XMP",
        }
    }
}

/// One text entry of a PNG file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextChunk {
    pub kind: TextKind,
    pub keyword: String,
    /// The text; for undecodable compressed text, a bracketed explanation.
    pub text: String,
}

fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| c as char).collect()
}

/// Reads the text metadata of a PNG, JPEG or WebP file (recognised by its bytes): its format
/// and entries in file order (a BMP has none).
pub fn read_text_metadata(path: &Path) -> Result<(ImageFormat, Vec<TextChunk>), ImageIoError> {
    let bytes = super::read::read_capped(path)?;
    let format = ImageFormat::sniff(&bytes).ok_or_else(|| ImageIoError::Decode {
        path: path.to_path_buf(),
        message: "not a PNG, JPEG, WebP or BMP file (unrecognised first bytes)".into(),
    })?;
    let chunks = match format {
        ImageFormat::Png => parse_text_chunks(&bytes, path)?,
        ImageFormat::Jpeg => jpeg_text(&bytes),
        ImageFormat::WebP => webp_text(&bytes),
        ImageFormat::Bmp => Vec::new(),
    };
    Ok((format, chunks))
}

/// Most segments or chunks walked in one file.
const MAX_SEGMENTS: usize = 4096;

fn exif_entry(block: &[u8]) -> Option<TextChunk> {
    exif::read_user_comment(block).map(|text| TextChunk {
        kind: TextKind::Exif,
        keyword: "UserComment".into(),
        text,
    })
}

/// A JPEG's EXIF UserComment, COM segments and XMP parameters, up to its first scan.
fn jpeg_text(bytes: &[u8]) -> Vec<TextChunk> {
    let mut out = Vec::new();
    let mut pos = 2;
    for _ in 0..MAX_SEGMENTS {
        let Some(&[0xff, marker]) = bytes.get(pos..pos + 2) else {
            break;
        };
        match marker {
            0xff => {
                pos += 1; // fill byte
                continue;
            }
            0xd8 | 0x01 | 0xd0..=0xd7 => {
                pos += 2;
                continue;
            }
            0xd9 | 0xda => break,
            _ => {}
        }
        let Some(len) = bytes.get(pos + 2..pos + 4) else {
            break;
        };
        let len = u16::from_be_bytes([len[0], len[1]]) as usize;
        let Some(payload) = bytes.get(pos + 4..pos + 2 + len.max(2)) else {
            break;
        };
        match marker {
            0xe1 if payload.starts_with(b"Exif\0\0") => out.extend(exif_entry(payload)),
            0xe1 => out.extend(xmp_entries(payload)),
            0xfe => {
                let (k, text) = split_nul(payload);
                out.push(match text {
                    Some(t) => TextChunk {
                        kind: TextKind::Comment,
                        keyword: String::from_utf8_lossy(k).into_owned(),
                        text: String::from_utf8_lossy(t).into_owned(),
                    },
                    None => TextChunk {
                        kind: TextKind::Comment,
                        keyword: "comment".into(),
                        text: String::from_utf8_lossy(k).into_owned(),
                    },
                });
            }
            _ => {}
        }
        pos += 2 + len;
    }
    out
}

/// A WebP's EXIF UserComment and XMP parameters.
fn webp_text(bytes: &[u8]) -> Vec<TextChunk> {
    let mut out = Vec::new();
    let mut pos = 12;
    for _ in 0..MAX_SEGMENTS {
        let Some(head) = bytes.get(pos..pos + 8) else {
            break;
        };
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let Some(payload) = bytes.get(pos + 8..(pos + 8).saturating_add(len)) else {
            break;
        };
        match &head[..4] {
            b"EXIF" => out.extend(exif_entry(payload)),
            b"XMP " => out.extend(xmp_entries(payload)),
            _ => {}
        }
        pos = pos + 8 + len + (len & 1);
    }
    out
}

/// The `sdcpp:*` elements of an XMP packet (upstream's `sdcpp:parameters`, our JSON).
fn xmp_entries(packet: &[u8]) -> Vec<TextChunk> {
    let text = String::from_utf8_lossy(packet);
    let mut out = Vec::new();
    for keyword in ["parameters", JSON_KEYWORD] {
        let (open, close) = (format!("<sdcpp:{keyword}>"), format!("</sdcpp:{keyword}>"));
        let Some(start) = text.find(&open).map(|i| i + open.len()) else {
            continue;
        };
        let Some(end) = text[start..].find(&close) else {
            continue;
        };
        out.push(TextChunk {
            kind: TextKind::Xmp,
            keyword: keyword.to_string(),
            text: xml_unescape(&text[start..start + end]),
        });
    }
    out
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// Reads all text chunks of a PNG file, in file order.
pub fn read_png_text_chunks(path: &Path) -> Result<Vec<TextChunk>, ImageIoError> {
    let bytes = super::read::read_capped(path)?;
    parse_text_chunks(&bytes, path)
}

/// [`read_png_text_chunks`] as (keyword, text) pairs.
pub fn read_png_text_pairs(path: &Path) -> Result<Vec<(String, String)>, ImageIoError> {
    Ok(read_png_text_chunks(path)?
        .into_iter()
        .map(|c| (c.keyword, c.text))
        .collect())
}

const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

fn parse_text_chunks(data: &[u8], path: &Path) -> Result<Vec<TextChunk>, ImageIoError> {
    let err = |message: String| ImageIoError::Decode {
        path: path.to_path_buf(),
        message,
    };
    if data.len() < 8 || data[..8] != SIGNATURE {
        return Err(err("missing PNG signature".into()));
    }
    let mut out = Vec::new();
    let mut pos = 8usize;
    let mut saw_iend = false;
    while pos < data.len() {
        if data.len() - pos < 12 {
            return Err(err(format!("truncated chunk header at byte {pos}")));
        }
        let len =
            u32::from_be_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]) as usize;
        let kind = &data[pos + 4..pos + 8];
        let body_start = pos + 8;
        let body_end = body_start
            .checked_add(len)
            .filter(|&e| e.checked_add(4).is_some_and(|c| c <= data.len()))
            .ok_or_else(|| {
                err(format!(
                    "chunk '{}' at byte {pos} claims {len} bytes, past the end of the file",
                    latin1(kind)
                ))
            })?;
        let body = &data[body_start..body_end];
        match kind {
            b"tEXt" => out.push(parse_text(body)),
            b"zTXt" => out.push(parse_ztxt(body)),
            b"iTXt" => out.push(parse_itxt(body)),
            b"IEND" => {
                saw_iend = true;
                break;
            }
            _ => {}
        }
        pos = body_end + 4;
    }
    if !saw_iend {
        return Err(err("no IEND chunk (file truncated?)".into()));
    }
    Ok(out)
}

fn split_nul(b: &[u8]) -> (&[u8], Option<&[u8]>) {
    match b.iter().position(|&c| c == 0) {
        Some(i) => (&b[..i], Some(&b[i + 1..])),
        None => (b, None),
    }
}

fn parse_text(body: &[u8]) -> TextChunk {
    let (k, rest) = split_nul(body);
    TextChunk {
        kind: TextKind::TEXt,
        keyword: latin1(k),
        text: rest
            .map(latin1)
            .unwrap_or_else(|| "[malformed tEXt: no keyword separator]".into()),
    }
}

/// Inflates a zlib stream through the png crate's zTXt support (bounded).
fn inflate(compressed: &[u8]) -> Result<Vec<u8>, String> {
    // zTXt text is Latin-1 after inflation; map the chars back to bytes so callers can
    // decode UTF-8 (iTXt) themselves.
    // Build a raw zTXt body (keyword "k", method 0) and decode it with the crate's parser.
    let mut body = b"k\0\0".to_vec();
    body.extend_from_slice(compressed);
    let mut decoded = decode_ztxt_body(&body)?;
    decoded
        .decompress_text_with_limit(MAX_TEXT_BYTES)
        .map_err(|e| e.to_string())?;
    let s = decoded.get_text().map_err(|e| e.to_string())?;
    Ok(s.chars().map(|c| c as u32 as u8).collect())
}

/// Decodes a zTXt chunk body with the png crate by embedding it in a minimal PNG.
fn decode_ztxt_body(body: &[u8]) -> Result<png::text_metadata::ZTXtChunk, String> {
    let png = minimal_png_with_chunk(b"zTXt", body);
    let decoder = png::Decoder::new(&png[..]);
    let reader = decoder.read_info().map_err(|e| e.to_string())?;
    reader
        .info()
        .compressed_latin1_text
        .first()
        .cloned()
        .ok_or_else(|| "compressed text chunk was not recognised".to_string())
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn push_chunk(out: &mut Vec<u8>, kind: &[u8; 4], body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// A 1x1 gray PNG header plus one extra chunk placed before IDAT, enough for `read_info`.
fn minimal_png_with_chunk(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = SIGNATURE.to_vec();
    let ihdr = [0, 0, 0, 1, 0, 0, 0, 1, 8, 0, 0, 0, 0];
    push_chunk(&mut out, b"IHDR", &ihdr);
    push_chunk(&mut out, kind, body);
    // zlib stream of one filtered row: filter byte 0, pixel 0.
    push_chunk(
        &mut out,
        b"IDAT",
        &[0x78, 0x01, 0x63, 0x60, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01],
    );
    push_chunk(&mut out, b"IEND", &[]);
    out
}

fn parse_ztxt(body: &[u8]) -> TextChunk {
    let (k, rest) = split_nul(body);
    let text = match rest {
        Some(r) if r.len() >= 2 && r[0] == 0 => match inflate(&r[1..]) {
            Ok(bytes) => latin1(&bytes),
            Err(e) => format!("[compressed text could not be decoded: {e}]"),
        },
        _ => "[malformed zTXt]".into(),
    };
    TextChunk {
        kind: TextKind::ZTXt,
        keyword: latin1(k),
        text,
    }
}

fn parse_itxt(body: &[u8]) -> TextChunk {
    let (k, rest) = split_nul(body);
    let keyword = latin1(k);
    let text = (|| {
        let rest = rest?;
        if rest.len() < 2 {
            return None;
        }
        let (flag, method) = (rest[0], rest[1]);
        let (_lang, rest) = split_nul(&rest[2..]);
        let (_translated, text) = split_nul(rest?);
        let text = text?;
        Some(if flag == 0 {
            String::from_utf8_lossy(text).into_owned()
        } else if method != 0 {
            "[unknown iTXt compression method]".into()
        } else {
            match inflate(text) {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(e) => format!("[compressed text could not be decoded: {e}]"),
            }
        })
    })()
    .unwrap_or_else(|| "[malformed iTXt]".into());
    TextChunk {
        kind: TextKind::ITXt,
        keyword,
        text,
    }
}

/// Formats a PNG's text chunks for printing; see [`format_metadata`].
pub fn format_text_chunks(path: &Path, chunks: &[TextChunk]) -> String {
    format_metadata(path, ImageFormat::Png, chunks)
}

/// Formats metadata entries for printing: a header line per entry, then its text; the
/// `sd-cli-json` entry is pretty-printed when it parses as JSON.
pub fn format_metadata(path: &Path, format: ImageFormat, chunks: &[TextChunk]) -> String {
    let mut s = format!("File: {}\nFormat: {}\n\n", path.display(), format.name());
    if chunks.is_empty() {
        s.push_str("No metadata entries found.\n");
        return s;
    }
    for c in chunks {
        s.push_str(&format!(
            "Chunk: {}\n  keyword: {}\n",
            c.kind.as_str(),
            c.keyword
        ));
        let text = if c.keyword == JSON_KEYWORD {
            serde_json::from_str::<serde_json::Value>(&c.text)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok())
                .unwrap_or_else(|| c.text.clone())
        } else {
            c.text.clone()
        };
        s.push_str("  text:\n");
        for line in text.lines() {
            s.push_str("    ");
            s.push_str(line);
            s.push('\n');
        }
        s.push('\n');
    }
    s
}
