//! Motion-JPEG AVI (RIFF `AVI `), laid out as upstream's `create_mjpg_avi_from_sd_images`
//! (examples/common/media_io.cpp): `hdrl` (avih, one `vids`/`MJPG` stream), `movi` with one
//! `00dc` JPEG chunk per frame, then an `idx1` index marking every frame a keyframe. JPEG
//! quality is upstream's 90 (it caps MJPG at 90). Differences, all within the AVI 1.0 spec:
//! index offsets are relative to the `movi` list (the convention of Microsoft's and ffmpeg's
//! writers; upstream writes absolute offsets, which readers must guess), buffer sizes and
//! `rcFrame` are filled in, and the generation parameters go in a `LIST INFO` (`ICMT`, with
//! the program in `ISFT`).

use std::path::Path;

use super::riff::{Overflow, RiffWriter};
use super::soundtrack::Pcm;
use super::{jpeg, VideoError};
use crate::image_io::Image;

/// `AVIF_HASINDEX | AVIF_ISINTERLEAVED`, as upstream.
const AVIF_FLAGS: u32 = 0x10 | 0x100;
/// `AVIIF_KEYFRAME`: every MJPEG frame stands alone.
const AVIIF_KEYFRAME: u32 = 0x10;

/// The AVI file of `frames` (checked by `frames::check`) at `fps` frames per second, with a
/// PCM soundtrack when `audio` is given: a second stream (`auds`, 16-bit PCM) whose samples
/// follow the frames in one `01wb` chunk, as upstream's writer lays it out.
pub(super) fn encode(
    path: &Path,
    frames: &[Image],
    (width, height): (u32, u32),
    fps: u32,
    text: Option<&str>,
    audio: Option<&Pcm>,
) -> Result<Vec<u8>, VideoError> {
    let jpegs = frames
        .iter()
        .enumerate()
        .map(|(i, f)| jpeg::encode(f).map_err(|m| encode_err(path, format!("frame {i}: {m}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let too_large = |_: Overflow| VideoError::TooLarge {
        path: path.to_path_buf(),
        reason: "the frames do not fit an AVI file's 4 GiB".into(),
    };
    let count = u32::try_from(frames.len()).map_err(|_| too_large(Overflow))?;
    let largest = jpegs.iter().map(Vec::len).max().unwrap_or(0);
    let largest = u32::try_from(largest).map_err(|_| too_large(Overflow))?;
    if let Some(a) = audio {
        if a.bytes.len() > u32::MAX as usize / 2 || a.rate == 0 || a.channels == 0 {
            return Err(too_large(Overflow));
        }
    }
    let stream = StreamInfo {
        width,
        height,
        fps,
        count,
        buffer: largest.saturating_add(8),
        audio,
    };

    let mut w = RiffWriter::new();
    let riff = w.open(b"RIFF", b"AVI ");
    write_headers(&mut w, &stream).map_err(too_large)?;
    if let Some(t) = text {
        write_info(&mut w, t).map_err(too_large)?;
    }
    let movi = w.open(b"LIST", b"movi");
    // idx1 offsets count from the `movi` FourCC, 4 bytes after the size field.
    let movi_base = movi + 4;
    let mut index = Vec::with_capacity(jpegs.len());
    for jpeg in &jpegs {
        let offset = u32::try_from(w.pos() - movi_base).map_err(|_| too_large(Overflow))?;
        w.chunk(b"00dc", jpeg).map_err(too_large)?;
        index.push((*b"00dc", offset, jpeg.len() as u32));
    }
    if let Some(a) = audio.filter(|a| !a.bytes.is_empty()) {
        let offset = u32::try_from(w.pos() - movi_base).map_err(|_| too_large(Overflow))?;
        w.chunk(b"01wb", &a.bytes).map_err(too_large)?;
        index.push((*b"01wb", offset, a.bytes.len() as u32));
    }
    w.close(movi).map_err(too_large)?;
    let mut idx1 = Vec::with_capacity(index.len() * 16);
    for (id, offset, size) in index {
        idx1.extend_from_slice(&id);
        idx1.extend_from_slice(&AVIIF_KEYFRAME.to_le_bytes());
        idx1.extend_from_slice(&offset.to_le_bytes());
        idx1.extend_from_slice(&size.to_le_bytes());
    }
    w.chunk(b"idx1", &idx1).map_err(too_large)?;
    w.close(riff).map_err(too_large)?;
    Ok(w.into_inner())
}

fn encode_err(path: &Path, message: String) -> VideoError {
    VideoError::Encode {
        path: path.to_path_buf(),
        message,
    }
}

/// What the header chunks say about the one video stream.
struct StreamInfo<'a> {
    width: u32,
    height: u32,
    fps: u32,
    count: u32,
    /// Largest chunk a reader must buffer.
    buffer: u32,
    audio: Option<&'a Pcm>,
}

/// `hdrl`: the main header (`avih`) and the stream's `strl` (`strh` + `strf`).
fn write_headers(w: &mut RiffWriter, s: &StreamInfo<'_>) -> Result<(), Overflow> {
    let hdrl = w.open(b"LIST", b"hdrl");
    let mut avih = Fields::default();
    avih.u32((1_000_000 + s.fps / 2) / s.fps); // dwMicroSecPerFrame, rounded
    avih.u32(s.buffer.saturating_mul(s.fps)); // dwMaxBytesPerSec
    avih.u32(0); // dwPaddingGranularity
    avih.u32(AVIF_FLAGS);
    avih.u32(s.count); // dwTotalFrames
    avih.u32(0); // dwInitialFrames
    avih.u32(if s.audio.is_some() { 2 } else { 1 }); // dwStreams
    avih.u32(s.buffer); // dwSuggestedBufferSize
    avih.u32(s.width);
    avih.u32(s.height);
    avih.zeros(16); // dwReserved[4]
    w.chunk(b"avih", &avih.0)?;

    let strl = w.open(b"LIST", b"strl");
    let mut strh = Fields::default();
    strh.fourcc(b"vids");
    strh.fourcc(b"MJPG");
    strh.u32(0); // dwFlags
    strh.u16(0); // wPriority
    strh.u16(0); // wLanguage
    strh.u32(0); // dwInitialFrames
    strh.u32(1); // dwScale: rate / scale = fps
    strh.u32(s.fps); // dwRate
    strh.u32(0); // dwStart
    strh.u32(s.count); // dwLength, in frames
    strh.u32(s.buffer); // dwSuggestedBufferSize
    strh.u32(u32::MAX); // dwQuality: default
    strh.u32(0); // dwSampleSize: varies per frame
                 // rcFrame (left, top, right, bottom) is 16-bit: leave it empty when the size does not fit.
    let rect = |v: u32| u16::try_from(v).ok().filter(|v| *v <= i16::MAX as u16);
    let (right, bottom) = match (rect(s.width), rect(s.height)) {
        (Some(r), Some(b)) => (r, b),
        _ => (0, 0),
    };
    for v in [0, 0, right, bottom] {
        strh.u16(v);
    }
    w.chunk(b"strh", &strh.0)?;

    let mut strf = Fields::default(); // BITMAPINFOHEADER
    strf.u32(40); // biSize
    strf.u32(s.width);
    strf.u32(s.height);
    strf.u16(1); // biPlanes
    strf.u16(24); // biBitCount
    strf.fourcc(b"MJPG"); // biCompression
    let image_size = u64::from(s.width) * u64::from(s.height) * 3;
    strf.u32(u32::try_from(image_size).unwrap_or(u32::MAX)); // biSizeImage
    strf.zeros(16); // pixels per metre x/y, colours used/important
    w.chunk(b"strf", &strf.0)?;
    w.close(strl)?;
    if let Some(a) = s.audio {
        write_audio_stream(w, a)?;
    }
    w.close(hdrl)
}

/// The soundtrack's `strl`: a PCM `auds` stream header and its WAVEFORMATEX.
fn write_audio_stream(w: &mut RiffWriter, a: &Pcm) -> Result<(), Overflow> {
    let align = u32::from(a.block_align());
    let bytes_per_sec = a.rate.checked_mul(align).ok_or(Overflow)?;
    let strl = w.open(b"LIST", b"strl");
    let mut strh = Fields::default();
    strh.fourcc(b"auds");
    strh.u32(0); // fccHandler: none for PCM
    strh.u32(0); // dwFlags
    strh.u16(0); // wPriority
    strh.u16(0); // wLanguage
    strh.u32(0); // dwInitialFrames
    strh.u32(align); // dwScale: one block ...
    strh.u32(bytes_per_sec); // dwRate: ... of rate × align bytes per second
    strh.u32(0); // dwStart
    strh.u32(a.len as u32); // dwLength, in blocks
    strh.u32(a.bytes.len() as u32); // dwSuggestedBufferSize: the one chunk
    strh.u32(u32::MAX); // dwQuality
    strh.u32(align); // dwSampleSize
    strh.zeros(8); // rcFrame
    w.chunk(b"strh", &strh.0)?;
    let mut strf = Fields::default(); // WAVEFORMATEX
    strf.u16(1); // WAVE_FORMAT_PCM
    strf.u16(a.channels);
    strf.u32(a.rate);
    strf.u32(bytes_per_sec);
    strf.u16(a.block_align());
    strf.u16(16); // wBitsPerSample
    strf.u16(0); // cbSize
    w.chunk(b"strf", &strf.0)?;
    w.close(strl)
}

/// `LIST INFO`: the parameters text in `ICMT` (comment), this program in `ISFT`.
fn write_info(w: &mut RiffWriter, text: &str) -> Result<(), Overflow> {
    let info = w.open(b"LIST", b"INFO");
    w.chunk(
        b"ISFT",
        &zstr(concat!("sd-cli ", env!("CARGO_PKG_VERSION"))),
    )?;
    w.chunk(b"ICMT", &zstr(text))?;
    w.close(info)
}

/// An INFO string: the text up to any NUL, NUL-terminated.
fn zstr(text: &str) -> Vec<u8> {
    let mut out: Vec<u8> = text.bytes().take_while(|b| *b != 0).collect();
    out.push(0);
    out
}

/// A fixed-layout little-endian header payload.
#[derive(Default)]
struct Fields(Vec<u8>);

impl Fields {
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn fourcc(&mut self, id: &[u8; 4]) {
        self.0.extend_from_slice(id);
    }
    fn zeros(&mut self, n: usize) {
        self.0.resize(self.0.len() + n, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image_io::Channels;

    #[test]
    fn header_sizes_match_the_spec() {
        let frame = Image::new(3, 2, Channels::Rgb, vec![7; 18]).unwrap();
        let avi = encode(Path::new("t.avi"), &[frame], (3, 2), 24, None, None).unwrap();
        assert_eq!(&avi[..4], b"RIFF");
        assert_eq!(&avi[8..12], b"AVI ");
        assert_eq!(avi.len() % 2, 0);
        let riff = u32::from_le_bytes(avi[4..8].try_into().unwrap()) as usize;
        assert_eq!(riff + 8, avi.len());
        // LIST hdrl: avih (8+56) + LIST strl (12 + 8+56 + 8+40).
        assert_eq!(&avi[12..16], b"LIST");
        let hdrl = u32::from_le_bytes(avi[16..20].try_into().unwrap());
        assert_eq!(hdrl, 4 + 64 + 12 + 64 + 48);
    }
}
