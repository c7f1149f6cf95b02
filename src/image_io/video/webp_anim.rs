//! Animated WebP (RIFF `WEBP` extended format): `VP8X` with the animation flag, `ANIM`
//! (loop forever, white background as libwebp's `WebPAnimEncoder` defaults), one `ANMF` per
//! frame covering the whole canvas, then the parameters text in `EXIF` (A1111's UserComment)
//! and upstream's `XMP ` packet.
//!
//! Upstream encodes lossy frames at quality 90 through libwebp; we have no established
//! pure-Rust VP8 encoder, so frames here are lossless VP8L from `image-webp` (exact pixels,
//! larger files). Its encoder only writes whole files, so each frame is encoded as a simple
//! (`RIFF WEBP VP8L`) file and its `VP8L` payload lifted out.

use std::path::Path;

use super::riff::{Overflow, RiffWriter};
use super::{xmp, VideoError};
use crate::image_io::exif::user_comment_block;
use crate::image_io::{Channels, Image};

const FLAG_ANIMATION: u8 = 1 << 1;
const FLAG_XMP: u8 = 1 << 2;
const FLAG_EXIF: u8 = 1 << 3;
const FLAG_ALPHA: u8 = 1 << 4;
/// ANMF flags: do not blend (each frame replaces the canvas), dispose none.
const ANMF_NO_BLEND: u8 = 1 << 1;
/// Largest side of a lossless frame (14-bit fields in the VP8L header).
const VP8L_MAX_SIDE: u32 = 16384;
/// `ANIM` background, as bytes B, G, R, A: opaque white.
const BACKGROUND: [u8; 4] = [0xff; 4];

/// Frame duration in milliseconds, as upstream: `max(1, round(1000 / fps))`.
pub(super) fn frame_duration_ms(fps: u32) -> u32 {
    ((1000 + fps / 2) / fps.max(1)).max(1)
}

/// The animated WebP of `frames` (checked by `frames::check`) at `fps`.
pub(super) fn encode(
    path: &Path,
    frames: &[Image],
    (width, height): (u32, u32),
    fps: u32,
    text: Option<&str>,
) -> Result<Vec<u8>, VideoError> {
    if width > VP8L_MAX_SIDE || height > VP8L_MAX_SIDE {
        return Err(VideoError::TooLarge {
            path: path.to_path_buf(),
            reason: format!(
                "{width}x{height} frames exceed WebP's {VP8L_MAX_SIDE} pixels per side"
            ),
        });
    }
    let too_large = |_: Overflow| VideoError::TooLarge {
        path: path.to_path_buf(),
        reason: "the frames do not fit a WebP file's 4 GiB".into(),
    };
    let meta = text.map(|t| (user_comment_block(t), xmp::packet(t)));
    let mut flags = FLAG_ANIMATION;
    if frames.iter().any(|f| f.channels == Channels::Rgba) {
        flags |= FLAG_ALPHA;
    }
    if meta.is_some() {
        flags |= FLAG_EXIF | FLAG_XMP;
    }

    let mut w = RiffWriter::new();
    let riff = w.open(b"RIFF", b"WEBP");
    let mut vp8x = Vec::with_capacity(10);
    vp8x.extend_from_slice(&[flags, 0, 0, 0]);
    vp8x.extend_from_slice(&(width - 1).to_le_bytes()[..3]);
    vp8x.extend_from_slice(&(height - 1).to_le_bytes()[..3]);
    w.chunk(b"VP8X", &vp8x).map_err(too_large)?;
    let mut anim = BACKGROUND.to_vec();
    anim.extend_from_slice(&0u16.to_le_bytes()); // loop count: forever
    w.chunk(b"ANIM", &anim).map_err(too_large)?;

    let duration = frame_duration_ms(fps);
    for (index, frame) in frames.iter().enumerate() {
        let vp8l = encode_vp8l(frame).map_err(|message| VideoError::Encode {
            path: path.to_path_buf(),
            message: format!("frame {index}: {message}"),
        })?;
        let anmf = w.begin(b"ANMF");
        w.u24(0); // X / 2: every frame covers the canvas from its origin
        w.u24(0); // Y / 2
        w.u24(width - 1);
        w.u24(height - 1);
        w.u24(duration);
        w.bytes(&[ANMF_NO_BLEND]);
        w.chunk(b"VP8L", &vp8l).map_err(too_large)?;
        w.close(anmf).map_err(too_large)?;
    }
    if let Some((exif, xmp)) = meta {
        w.chunk(b"EXIF", &exif).map_err(too_large)?;
        w.chunk(b"XMP ", xmp.as_bytes()).map_err(too_large)?;
    }
    w.close(riff).map_err(too_large)?;
    Ok(w.into_inner())
}

/// The VP8L bitstream of one frame.
fn encode_vp8l(frame: &Image) -> Result<Vec<u8>, String> {
    let color = match frame.channels {
        Channels::Rgb => image_webp::ColorType::Rgb8,
        Channels::Rgba => image_webp::ColorType::Rgba8,
    };
    let mut file = Vec::new();
    image_webp::WebPEncoder::new(&mut file)
        .encode(&frame.data, frame.width, frame.height, color)
        .map_err(|e| e.to_string())?;
    vp8l_payload(&file)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| "the WebP encoder wrote an unexpected layout".into())
}

/// The `VP8L` payload of a simple-format file: `RIFF` size `WEBP` `VP8L` size payload.
fn vp8l_payload(file: &[u8]) -> Option<&[u8]> {
    if file.get(..4)? != b"RIFF" || file.get(8..12)? != b"WEBP" || file.get(12..16)? != b"VP8L" {
        return None;
    }
    let size = u32::from_le_bytes(file.get(16..20)?.try_into().ok()?) as usize;
    file.get(20..20usize.checked_add(size)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_as_upstream() {
        assert_eq!(frame_duration_ms(1), 1000);
        assert_eq!(frame_duration_ms(16), 63); // 62.5 rounds half away from zero
        assert_eq!(frame_duration_ms(24), 42);
        assert_eq!(frame_duration_ms(3000), 1);
    }

    #[test]
    fn payload_needs_the_simple_layout() {
        assert!(vp8l_payload(b"RIFF\0\0\0\0WEBPVP8X").is_none());
        let mut f = b"RIFF\x0e\0\0\0WEBPVP8L\x02\0\0\0ab".to_vec();
        assert_eq!(vp8l_payload(&f), Some(&b"ab"[..]));
        f.truncate(21);
        assert!(vp8l_payload(&f).is_none());
    }
}
