//! Every input image format sd-cli reads (`--init-img`, `-r`, `--mask`): PNG through the
//! hardened reader of [`super::read`], JPEG, WebP and BMP through the `image` crate with the
//! same size caps, EXIF orientation applied (a phone photo is used upright).

use std::io::Cursor;
use std::path::Path;

use image::{DynamicImage, ImageDecoder, ImageReader};

use super::read::{check_size, read_capped, read_png_from_bytes, MAX_PIXELS, MAX_SIDE};
use super::{Channels, Image, ImageIoError};

/// A container format, recognised by its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Jpeg,
    WebP,
    Bmp,
}

impl ImageFormat {
    /// The format of `bytes` by their signature, if one sd-cli reads.
    pub fn sniff(bytes: &[u8]) -> Option<ImageFormat> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageFormat::Png)
        } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
            Some(ImageFormat::Jpeg)
        } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Some(ImageFormat::WebP)
        } else if bytes.starts_with(b"BM") {
            Some(ImageFormat::Bmp)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::WebP => "WebP",
            ImageFormat::Bmp => "BMP",
        }
    }
}

/// Reads an image file of any supported format; see [`read_image_from_bytes`].
pub fn read_image(path: &Path) -> Result<Image, ImageIoError> {
    let bytes = read_capped(path)?;
    read_image_from_bytes(&bytes, path)
}

/// Decodes PNG, JPEG, WebP or BMP bytes (recognised by their signature, whatever the file's
/// extension) into RGB8, or RGBA8 when the image has alpha; 16-bit samples are scaled to 8
/// bits; a JPEG's or WebP's EXIF orientation is applied. `name` is used in error messages.
pub fn read_image_from_bytes(bytes: &[u8], name: &Path) -> Result<Image, ImageIoError> {
    let err = |message: String| ImageIoError::Decode {
        path: name.to_path_buf(),
        message,
    };
    let format = ImageFormat::sniff(bytes).ok_or_else(|| {
        err("not a PNG, JPEG, WebP or BMP file (unrecognised first bytes)".into())
    })?;
    let image_format = match format {
        ImageFormat::Png => return read_png_from_bytes(bytes, name),
        ImageFormat::Jpeg => image::ImageFormat::Jpeg,
        ImageFormat::WebP => image::ImageFormat::WebP,
        ImageFormat::Bmp => image::ImageFormat::Bmp,
    };
    let what = format.name();
    check_complete(format, bytes).map_err(|m| err(format!("{what}: {m}")))?;
    let mut reader = ImageReader::with_format(Cursor::new(bytes), image_format);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    // The decoded RGBA8 image plus the decoder's own buffers.
    limits.max_alloc = Some(MAX_PIXELS * 4 + (64 << 20));
    reader.limits(limits);
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| err(format!("{what}: {e}")))?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(err(format!("{what}: zero image size")));
    }
    check_size(width, height, name)?;
    // A broken EXIF block only loses the rotation, as in other viewers.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| err(format!("{what}: {e}")))?;
    img.apply_orientation(orientation);
    let (width, height) = (img.width(), img.height());
    let (channels, data) = if img.color().has_alpha() {
        (Channels::Rgba, img.into_rgba8().into_raw())
    } else {
        (Channels::Rgb, img.into_rgb8().into_raw())
    };
    Image::new(width, height, channels, data)
}

/// Refuses files cut short, which some decoders would fill in silently: a JPEG needs its
/// end-of-image marker (entropy-coded data cannot hold `FF D9`), a WebP the bytes its RIFF
/// header announces, an uncompressed BMP every row its header describes.
fn check_complete(format: ImageFormat, bytes: &[u8]) -> Result<(), String> {
    let le32 = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    match format {
        ImageFormat::Jpeg if !bytes.windows(2).any(|w| w == [0xff, 0xd9]) => {
            Err("truncated (no end-of-image marker)".into())
        }
        ImageFormat::WebP => {
            let riff = le32(4).ok_or("truncated header")? as u64;
            if riff + 8 > bytes.len() as u64 {
                Err(format!(
                    "truncated: its header announces {} bytes, the file has {}",
                    riff + 8,
                    bytes.len()
                ))
            } else {
                Ok(())
            }
        }
        ImageFormat::Bmp => {
            let (Some(offset), Some(width), Some(height), Some(bpp), Some(compression)) = (
                le32(10),
                le32(18),
                le32(22),
                bytes.get(28..30).map(|b| u16::from_le_bytes([b[0], b[1]])),
                le32(30),
            ) else {
                return Err("truncated header".into());
            };
            // BITMAPINFOHEADER and later, uncompressed or bit-field rows only (OS/2 headers
            // and RLE lengths are the decoder's to check).
            let info_header = le32(14).is_some_and(|n| n >= 40);
            if info_header && (compression == 0 || compression == 3) {
                let (w, h) = (
                    (width as i32).unsigned_abs() as u64,
                    (height as i32).unsigned_abs() as u64,
                );
                let stride = (w * bpp as u64).div_ceil(32) * 4;
                let need = offset as u64 + stride * h;
                if need > bytes.len() as u64 {
                    return Err(format!(
                        "truncated: its header describes {need} bytes, the file has {}",
                        bytes.len()
                    ));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_recognised_by_their_bytes() {
        assert_eq!(
            ImageFormat::sniff(b"\x89PNG\r\n\x1a\nrest"),
            Some(ImageFormat::Png)
        );
        assert_eq!(
            ImageFormat::sniff(&[0xff, 0xd8, 0xff, 0xe0]),
            Some(ImageFormat::Jpeg)
        );
        assert_eq!(
            ImageFormat::sniff(b"RIFF\0\0\0\0WEBPVP8 "),
            Some(ImageFormat::WebP)
        );
        assert_eq!(ImageFormat::sniff(b"BM\0\0"), Some(ImageFormat::Bmp));
        assert_eq!(ImageFormat::sniff(b"GIF89a"), None);
        let e = read_image_from_bytes(b"GIF89a....", Path::new("x.gif")).unwrap_err();
        assert!(e.to_string().contains("x.gif"), "{e}");
    }
}
