//! WebM output (`.webm`), as upstream writes it with libwebm and libwebp: one VP8 video track
//! whose frames are all key frames, each frame a lossy VP8 image at quality 90 (upstream's
//! `encode_sd_image_to_vp8_frame` through `WebPEncodeRGB`; here `webp-rust`'s pure-Rust VP8
//! encoder), `DefaultDuration` = round(10⁹ / fps) ns, with cues. The parameters text goes in a
//! `Tags` `COMMENT` (upstream's WebM carries none). A soundtrack is a second track of 16-bit
//! little-endian PCM (`A_PCM/INT/LIT`, upstream's choice when built without Opus), one block
//! beside each video frame holding that frame's span of samples.
//!
//! Layout: EBML header, then one Segment of known size holding `SeekHead`, `Info`, `Tracks`,
//! `Tags`, the clusters (a new one every [`CLUSTER_MS`] so block timestamps stay within i16)
//! and `Cues` (one point per cluster).

use std::path::Path;

use super::ebml::{element, float, master, string, uint, uint8};
use super::soundtrack::Pcm;
use super::VideoError;
use crate::image_io::Image;

// Element IDs (Matroska / WebM specification).
const EBML: u32 = 0x1A45_DFA3;
const EBML_VERSION: u32 = 0x4286;
const EBML_READ_VERSION: u32 = 0x42F7;
const EBML_MAX_ID_LENGTH: u32 = 0x42F2;
const EBML_MAX_SIZE_LENGTH: u32 = 0x42F3;
const DOC_TYPE: u32 = 0x4282;
const DOC_TYPE_VERSION: u32 = 0x4287;
const DOC_TYPE_READ_VERSION: u32 = 0x4285;
const SEGMENT: u32 = 0x1853_8067;
const SEEK_HEAD: u32 = 0x114D_9B74;
const SEEK: u32 = 0x4DBB;
const SEEK_ID: u32 = 0x53AB;
const SEEK_POSITION: u32 = 0x53AC;
const INFO: u32 = 0x1549_A966;
const TIMESTAMP_SCALE: u32 = 0x2A_D7B1;
const DURATION: u32 = 0x4489;
const MUXING_APP: u32 = 0x4D80;
const WRITING_APP: u32 = 0x5741;
const TRACKS: u32 = 0x1654_AE6B;
const TRACK_ENTRY: u32 = 0xAE;
const TRACK_NUMBER: u32 = 0xD7;
const TRACK_UID: u32 = 0x73C5;
const TRACK_TYPE: u32 = 0x83;
const FLAG_LACING: u32 = 0x9C;
const CODEC_ID: u32 = 0x86;
const DEFAULT_DURATION: u32 = 0x23_E383;
const VIDEO: u32 = 0xE0;
const PIXEL_WIDTH: u32 = 0xB0;
const PIXEL_HEIGHT: u32 = 0xBA;
const AUDIO: u32 = 0xE1;
const SAMPLING_FREQUENCY: u32 = 0xB5;
const CHANNELS: u32 = 0x9F;
const BIT_DEPTH: u32 = 0x6264;
const TAGS: u32 = 0x1254_C367;
const TAG: u32 = 0x7373;
const TARGETS: u32 = 0x63C0;
const SIMPLE_TAG: u32 = 0x67C8;
const TAG_NAME: u32 = 0x45A3;
const TAG_STRING: u32 = 0x4487;
const CLUSTER: u32 = 0x1F43_B675;
const TIMESTAMP: u32 = 0xE7;
const SIMPLE_BLOCK: u32 = 0xA3;
const CUES: u32 = 0x1C53_BB6B;
const CUE_POINT: u32 = 0xBB;
const CUE_TIME: u32 = 0xB3;
const CUE_TRACK_POSITIONS: u32 = 0xB7;
const CUE_TRACK: u32 = 0xF7;
const CUE_CLUSTER_POSITION: u32 = 0xF1;

/// Timestamps count milliseconds.
const TIMESTAMP_SCALE_NS: u64 = 1_000_000;
/// A cluster spans at most this many milliseconds (block timestamps are i16 offsets).
pub(super) const CLUSTER_MS: u64 = 5_000;
/// VP8 quality of every frame (upstream's video quality).
const QUALITY: f32 = 90.0;
/// VP8 frame sides are 14-bit.
const VP8_MAX_SIDE: u32 = 16383;
const APP: &str = concat!("sd-cli ", env!("CARGO_PKG_VERSION"));

/// One frame as a VP8 key frame.
fn vp8_frame(path: &Path, frame: &Image) -> Result<Vec<u8>, VideoError> {
    let rgb = frame.to_rgb();
    let rgba: Vec<u8> = rgb
        .data
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 0xff])
        .collect();
    let config = webp_rust::encoder::LossyEncodingConfig {
        quality: QUALITY,
        ..Default::default()
    };
    webp_rust::encoder::encode_lossy_rgba_to_vp8_with_config(
        frame.width as usize,
        frame.height as usize,
        &rgba,
        &config,
    )
    .map_err(|e| VideoError::Encode {
        path: path.to_path_buf(),
        message: format!("VP8: {e}"),
    })
}

fn ebml_header(out: &mut Vec<u8>) {
    master(out, EBML, |b| {
        uint(b, EBML_VERSION, 1);
        uint(b, EBML_READ_VERSION, 1);
        uint(b, EBML_MAX_ID_LENGTH, 4);
        uint(b, EBML_MAX_SIZE_LENGTH, 8);
        string(b, DOC_TYPE, "webm");
        uint(b, DOC_TYPE_VERSION, 4);
        uint(b, DOC_TYPE_READ_VERSION, 2);
    });
}

/// Every frame as a VP8 key frame, encoded on all cores (about 0.3 s per 832×480 frame on
/// one core).
fn vp8_frames(path: &Path, frames: &[Image]) -> Result<Vec<Vec<u8>>, VideoError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = frames.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let jobs: Vec<_> = frames
            .chunks(per)
            .map(|chunk| s.spawn(move || chunk.iter().map(|f| vp8_frame(path, f)).collect()))
            .collect();
        let mut out = Vec::with_capacity(frames.len());
        for job in jobs {
            let part: Result<Vec<Vec<u8>>, VideoError> =
                job.join().map_err(|_| VideoError::Encode {
                    path: path.to_path_buf(),
                    message: "the VP8 encoder panicked".into(),
                })?;
            out.extend(part?);
        }
        Ok(out)
    })
}

/// The SeekHead for (element ID, position from the segment's payload start) pairs; its size
/// does not depend on the positions.
fn seek_head(entries: &[(u32, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    master(&mut out, SEEK_HEAD, |b| {
        for &(id, pos) in entries {
            master(b, SEEK, |s| {
                element(s, SEEK_ID, &id.to_be_bytes());
                uint8(s, SEEK_POSITION, pos);
            });
        }
    });
    out
}

/// The `.webm` of `frames` (checked by `frames::check`) at `fps`, with `audio` as a PCM
/// track.
pub(super) fn encode(
    path: &Path,
    frames: &[Image],
    (width, height): (u32, u32),
    fps: u32,
    text: Option<&str>,
    audio: Option<&Pcm>,
) -> Result<Vec<u8>, VideoError> {
    if width > VP8_MAX_SIDE || height > VP8_MAX_SIDE {
        return Err(VideoError::TooLarge {
            path: path.to_path_buf(),
            reason: format!("{width}x{height} frames exceed VP8's {VP8_MAX_SIDE} pixels per side"),
        });
    }
    let encoded = vp8_frames(path, frames)?;
    let frame_ns = (1e9 / f64::from(fps)).round().max(1.0) as u64;
    let at_ms = |i: usize| (i as u64 * frame_ns + TIMESTAMP_SCALE_NS / 2) / TIMESTAMP_SCALE_NS;

    let mut info = Vec::new();
    master(&mut info, INFO, |b| {
        uint(b, TIMESTAMP_SCALE, TIMESTAMP_SCALE_NS);
        float(
            b,
            DURATION,
            (frames.len() as u64 * frame_ns) as f64 / TIMESTAMP_SCALE_NS as f64,
        );
        string(b, MUXING_APP, APP);
        string(b, WRITING_APP, APP);
    });
    let mut tracks = Vec::new();
    master(&mut tracks, TRACKS, |b| {
        master(b, TRACK_ENTRY, |t| {
            uint(t, TRACK_NUMBER, 1);
            uint(t, TRACK_UID, 1);
            uint(t, TRACK_TYPE, 1);
            uint(t, FLAG_LACING, 0);
            string(t, CODEC_ID, "V_VP8");
            uint(t, DEFAULT_DURATION, frame_ns);
            master(t, VIDEO, |v| {
                uint(v, PIXEL_WIDTH, u64::from(width));
                uint(v, PIXEL_HEIGHT, u64::from(height));
            });
        });
        if let Some(a) = audio {
            master(b, TRACK_ENTRY, |t| {
                uint(t, TRACK_NUMBER, 2);
                uint(t, TRACK_UID, 2);
                uint(t, TRACK_TYPE, 2);
                uint(t, FLAG_LACING, 0);
                string(t, CODEC_ID, "A_PCM/INT/LIT");
                master(t, AUDIO, |v| {
                    float(v, SAMPLING_FREQUENCY, f64::from(a.rate));
                    uint(v, CHANNELS, u64::from(a.channels));
                    uint(v, BIT_DEPTH, 16);
                });
            });
        }
    });
    // Frame i's samples; the last frame takes whatever the clip has left.
    let samples_at = |i: usize| match audio {
        Some(a) if fps > 0 => {
            ((i as u64 * u64::from(a.rate) + u64::from(fps) / 2) / u64::from(fps)) as usize
        }
        _ => 0,
    };
    let mut tags = Vec::new();
    if let Some(text) = text {
        master(&mut tags, TAGS, |b| {
            master(b, TAG, |t| {
                master(t, TARGETS, |_| {});
                master(t, SIMPLE_TAG, |s| {
                    string(s, TAG_NAME, "COMMENT");
                    string(s, TAG_STRING, text);
                });
            });
        });
    }

    let head_len = seek_head(&[(INFO, 0), (TRACKS, 0), (TAGS, 0), (CUES, 0)]).len() as u64;
    let info_at = head_len;
    let tracks_at = info_at + info.len() as u64;
    let tags_at = tracks_at + tracks.len() as u64;
    let clusters_at = tags_at + tags.len() as u64;

    // Clusters, and a cue per cluster: (its time, its position).
    let mut clusters = Vec::new();
    let mut cues = Vec::new();
    let mut start = 0;
    while start < frames.len() {
        let t0 = at_ms(start);
        let end = (start..frames.len())
            .find(|&i| at_ms(i) - t0 >= CLUSTER_MS)
            .unwrap_or(frames.len());
        cues.push((t0, clusters_at + clusters.len() as u64));
        let mut body = Vec::new();
        uint(&mut body, TIMESTAMP, t0);
        for (i, vp8) in encoded.iter().enumerate().take(end).skip(start) {
            let mut block = Vec::with_capacity(vp8.len() + 4);
            block.push(0x81); // track 1 as a 1-byte vint
            block.extend_from_slice(&((at_ms(i) - t0) as i16).to_be_bytes());
            block.push(0x80); // key frame
            block.extend_from_slice(vp8);
            element(&mut body, SIMPLE_BLOCK, &block);
            if let Some(a) = audio {
                let end = if i + 1 == frames.len() {
                    a.len
                } else {
                    samples_at(i + 1)
                };
                let pcm = a.span(samples_at(i), end);
                if !pcm.is_empty() {
                    let mut block = Vec::with_capacity(pcm.len() + 4);
                    block.push(0x82); // track 2
                    block.extend_from_slice(&((at_ms(i) - t0) as i16).to_be_bytes());
                    block.push(0x80);
                    block.extend_from_slice(pcm);
                    element(&mut body, SIMPLE_BLOCK, &block);
                }
            }
        }
        element(&mut clusters, CLUSTER, &body);
        start = end;
    }
    let cues_at = clusters_at + clusters.len() as u64;
    let mut cue_bytes = Vec::new();
    master(&mut cue_bytes, CUES, |b| {
        for &(time, pos) in &cues {
            master(b, CUE_POINT, |p| {
                uint(p, CUE_TIME, time);
                master(p, CUE_TRACK_POSITIONS, |c| {
                    uint(c, CUE_TRACK, 1);
                    uint(c, CUE_CLUSTER_POSITION, pos);
                });
            });
        }
    });

    let mut seeks = vec![(INFO, info_at), (TRACKS, tracks_at)];
    if text.is_some() {
        seeks.push((TAGS, tags_at));
    }
    seeks.push((CUES, cues_at));
    let mut head = seek_head(&seeks);
    // Without tags the SeekHead is one entry shorter: pad it back with a Void element so that
    // the positions computed above stay true.
    let missing = head_len as usize - head.len();
    if missing > 0 {
        void(&mut head, missing);
    }

    let mut segment = head;
    segment.extend_from_slice(&info);
    segment.extend_from_slice(&tracks);
    segment.extend_from_slice(&tags);
    segment.extend_from_slice(&clusters);
    segment.extend_from_slice(&cue_bytes);
    let mut out = Vec::new();
    ebml_header(&mut out);
    element(&mut out, SEGMENT, &segment);
    Ok(out)
}

/// A Void element (ID 0xEC) of exactly `len` ≥ 2 bytes.
fn void(out: &mut Vec<u8>, len: usize) {
    // ID (1 byte) + a 1-byte size up to 126 payload bytes; the SeekHead entry left out is
    // far shorter than that.
    out.push(0xEC);
    out.push(0x80 | (len - 2) as u8);
    out.extend(std::iter::repeat_n(0u8, len - 2));
}
