//! Image input and output for sd-cli.
//!
//! - [`read_image`]: PNG, JPEG, WebP and BMP inputs (recognised by their bytes), normalised to
//!   RGB8 or RGBA8, EXIF orientation applied, with size caps so a hostile header cannot make us
//!   allocate gigabytes and truncated files refused; [`read_png`] is the hardened PNG reader
//!   behind it (any colour type and bit depth).
//! - [`write_generation_image`]: `.png`, `.jpg`/`.jpeg`/`.jpe` (quality 90) or `.webp`
//!   (lossless) by the output's extension, with the generation parameters each format can
//!   hold; [`write_png_atomic`]: PNG with text chunks. Every file is written to a temporary
//!   file in the target directory, fsynced, then renamed over the target: a reader never sees
//!   a partial file.
//! - [`resize_pil`]: Pillow-exact resizing (reference images of edit models).
//! - [`read_text_metadata`] / [`format_metadata`]: the metadata of `-M metadata` (PNG text
//!   chunks, JPEG EXIF UserComment and COM, WebP EXIF and XMP).
//! - [`audio`]: WAV reading (PCM and float, any channel count) and 16-bit PCM writing, and
//!   the conversion of reference audio to the audio VAE's stereo rate.

pub mod audio;
mod decode;
mod encode;
mod exif;
mod frames_dir;
mod metadata;
mod params;
mod pil_resize;
mod read;
mod resize;
pub mod video;
mod write;

pub use decode::{read_image, read_image_from_bytes, ImageFormat};
pub use encode::{write_generation_image, OutputFormat, JPEG_QUALITY};
pub use frames_dir::{frame_files, read_frames_dir};
pub use metadata::{
    format_metadata, format_text_chunks, read_png_text_chunks, read_png_text_pairs,
    read_text_metadata, TextChunk, TextKind,
};
pub use params::{
    base_name, cpp_float, GenerationParams, HiresUse, LoraUse, VideoUse, JSON_KEYWORD,
    PARAMETERS_KEYWORD,
};
pub use pil_resize::{resize_pil, resize_pil_luma, PilFilter};
pub use read::{read_png, read_png_from_bytes, MAX_FILE_BYTES, MAX_PIXELS, MAX_SIDE};
pub use resize::{crop_to_aspect, resize_bilinear, resize_nearest};
pub use write::{write_generation_png, write_png_atomic};

use std::path::PathBuf;

/// Pixel layout of an 8-bit image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channels {
    Rgb,
    Rgba,
}

impl Channels {
    /// Bytes per pixel.
    pub fn count(self) -> usize {
        match self {
            Channels::Rgb => 3,
            Channels::Rgba => 4,
        }
    }
}

/// An 8-bit RGB or RGBA image, rows top to bottom, no padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    pub channels: Channels,
    pub data: Vec<u8>,
}

impl Image {
    /// Wraps pixel data, checking its length.
    pub fn new(
        width: u32,
        height: u32,
        channels: Channels,
        data: Vec<u8>,
    ) -> Result<Image, ImageIoError> {
        let expected = (width as usize)
            .checked_mul(height as usize)
            .and_then(|p| p.checked_mul(channels.count()));
        if width == 0 || height == 0 || expected != Some(data.len()) {
            return Err(ImageIoError::BadBuffer {
                width,
                height,
                channels: channels.count(),
                len: data.len(),
            });
        }
        Ok(Image {
            width,
            height,
            channels,
            data,
        })
    }

    /// The image without alpha (alpha is dropped, as upstream's 3-channel loads do).
    pub fn to_rgb(&self) -> Image {
        match self.channels {
            Channels::Rgb => self.clone(),
            Channels::Rgba => Image {
                width: self.width,
                height: self.height,
                channels: Channels::Rgb,
                data: self
                    .data
                    .chunks_exact(4)
                    .flat_map(|p| [p[0], p[1], p[2]])
                    .collect(),
            },
        }
    }
}

/// Errors of image reading and writing; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ImageIoError {
    #[error("cannot read '{}': {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write '{}': {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{}' is not a valid image: {message}", path.display())]
    Decode { path: PathBuf, message: String },
    #[error("'{}' is {width}x{height}, larger than the supported {max_side} pixels per side or {max_pixels} pixels", path.display())]
    TooLarge {
        path: PathBuf,
        width: u32,
        height: u32,
        max_side: u32,
        max_pixels: u64,
    },
    #[error("cannot encode '{}': {message}", path.display())]
    Encode { path: PathBuf, message: String },
    #[error("pixel buffer of {len} bytes does not match {width}x{height}x{channels}")]
    BadBuffer {
        width: u32,
        height: u32,
        channels: usize,
        len: usize,
    },
    #[error("cannot resize to {width}x{height}: both sides must be at least 1")]
    BadSize { width: u32, height: u32 },
}
