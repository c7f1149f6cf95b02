//! PNG decoding to RGB8/RGBA8 with size caps.

use std::path::Path;

use super::{Channels, Image, ImageIoError};

/// Largest accepted width or height.
pub const MAX_SIDE: u32 = 16384;
/// Largest accepted pixel count (2^28: 1 GiB as RGBA8).
pub const MAX_PIXELS: u64 = 1 << 28;

/// Largest PNG file read (a maximal image stored uncompressed is about 1 GiB).
pub const MAX_FILE_BYTES: u64 = (MAX_PIXELS * 4) + (64 << 20);

/// Reads a PNG file; see [`read_png_from_bytes`].
pub fn read_png(path: &Path) -> Result<Image, ImageIoError> {
    let bytes = read_capped(path)?;
    decode(&bytes, path)
}

/// Reads at most [`MAX_FILE_BYTES`] of `path`: a larger file (or an endless device such as
/// `/dev/zero`) is an error instead of an unbounded allocation.
pub(crate) fn read_capped(path: &Path) -> Result<Vec<u8>, ImageIoError> {
    use std::io::Read;
    let read_err = |source| ImageIoError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ImageIoError::Decode {
            path: path.to_path_buf(),
            message: format!("file is larger than {MAX_FILE_BYTES} bytes"),
        });
    }
    Ok(bytes)
}

/// Refuses images past [`MAX_SIDE`] or [`MAX_PIXELS`], before their pixels are allocated.
pub(crate) fn check_size(width: u32, height: u32, path: &Path) -> Result<(), ImageIoError> {
    if width > MAX_SIDE || height > MAX_SIDE || width as u64 * height as u64 > MAX_PIXELS {
        return Err(ImageIoError::TooLarge {
            path: path.to_path_buf(),
            width,
            height,
            max_side: MAX_SIDE,
            max_pixels: MAX_PIXELS,
        });
    }
    Ok(())
}

/// Decodes PNG bytes of any colour type (gray, gray+alpha, RGB, RGBA, palette, with tRNS)
/// and bit depth (1..16) into RGB8, or RGBA8 when the image has alpha. `name` is used in
/// error messages.
pub fn read_png_from_bytes(bytes: &[u8], name: &Path) -> Result<Image, ImageIoError> {
    decode(bytes, name)
}

fn decode(bytes: &[u8], path: &Path) -> Result<Image, ImageIoError> {
    let err = |message: String| ImageIoError::Decode {
        path: path.to_path_buf(),
        message,
    };
    check_palette(bytes).map_err(err)?;
    // The limit bounds every allocation the decoder makes, independent of our own checks.
    let limits = png::Limits {
        bytes: (MAX_PIXELS as usize) * 8 + (64 << 20),
    };
    let mut decoder = png::Decoder::new_with_limits(bytes, limits);
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    decoder.set_ignore_text_chunk(true);
    let mut reader = decoder.read_info().map_err(|e| err(e.to_string()))?;
    let (width, height) = {
        let info = reader.info();
        (info.width, info.height)
    };
    if width == 0 || height == 0 {
        return Err(err("zero image size".into()));
    }
    check_size(width, height, path)?;
    // Sized from the header (capped above); a failed allocation is an error, not an abort.
    let mut buf = Vec::new();
    buf.try_reserve_exact(reader.output_buffer_size())
        .map_err(|e| err(format!("cannot allocate the image buffer: {e}")))?;
    buf.resize(reader.output_buffer_size(), 0u8);
    let frame = reader
        .next_frame(&mut buf)
        .map_err(|e| err(e.to_string()))?;
    if frame.bit_depth != png::BitDepth::Eight {
        return Err(err(format!(
            "unexpected bit depth {:?} after expansion",
            frame.bit_depth
        )));
    }
    let pixels = width as usize * height as usize;
    let line = frame.line_size;
    let w = width as usize;
    // Rows may be padded to `line_size`; copy each row's pixels only.
    let rows = buf.chunks(line).take(height as usize);
    let (channels, data): (Channels, Vec<u8>) = match frame.color_type {
        png::ColorType::Rgb => (
            Channels::Rgb,
            rows.flat_map(|r| r[..w * 3].iter().copied()).collect(),
        ),
        png::ColorType::Rgba => (
            Channels::Rgba,
            rows.flat_map(|r| r[..w * 4].iter().copied()).collect(),
        ),
        png::ColorType::Grayscale => (
            Channels::Rgb,
            rows.flat_map(|r| r[..w].iter().flat_map(|&g| [g, g, g]))
                .collect(),
        ),
        png::ColorType::GrayscaleAlpha => (
            Channels::Rgba,
            rows.flat_map(|r| {
                r[..w * 2]
                    .chunks_exact(2)
                    .flat_map(|p| [p[0], p[0], p[0], p[1]])
            })
            .collect(),
        ),
        png::ColorType::Indexed => return Err(err("palette was not expanded".into())),
    };
    if data.len() != pixels * channels.count() {
        return Err(err("decoded data is shorter than the image".into()));
    }
    Image::new(width, height, channels, data)
}

/// Validates PLTE chunks before the decoder sees them: 1..=256 entries of 3 bytes (PNG spec
/// 11.2.3). The `png` crate (0.17) panics expanding a palette whose length is not a multiple of
/// 3 (found by the `png` fuzz target). Chunks are walked up to the first IDAT; framing errors
/// are left to the decoder, which reports them.
fn check_palette(bytes: &[u8]) -> Result<(), String> {
    if !bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Ok(()); // the decoder reports the bad signature
    }
    let mut pos = 8usize;
    while let Some(head) = bytes.get(pos..pos.saturating_add(8)) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        match &head[4..8] {
            b"PLTE" if len == 0 || !len.is_multiple_of(3) || len > 256 * 3 => {
                return Err(format!(
                    "PLTE chunk of {len} bytes (must be 3 to 768 bytes, a multiple of 3)"
                ));
            }
            b"IDAT" | b"IEND" => break,
            _ => {}
        }
        pos = match pos.checked_add(12).and_then(|p| p.checked_add(len)) {
            Some(p) => p,
            None => break,
        };
    }
    Ok(())
}
