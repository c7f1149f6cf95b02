//! Whole videos through the MiniMax-H3 clip geometry, on the host around one graph per clip
//! (encode) or chunk (decode).
//!
//! Encode (diffusers `_encode`): the video is padded to whole `clip_length`-frame clips by
//! repeating its last frame, each clip is encoded alone, and the last `token_drop` latent
//! frames of the result are dropped (`17n + 5` frames → `5n + 2` latent frames). A single
//! frame is encoded alone.
//!
//! Decode (stable-diffusion.cpp `MiniMaxH3VideoVAERunner::decode`, which diffusers `_decode`
//! matches on `5n + 2` latent frames): chunks of `tokens_chunk` latent frames plus the
//! `token_overlap` frames the next chunk starts with are decoded whole; each chunk's first
//! `tokens_chunk · pt` pixel frames lose their `frame_pre_padding` leading frames, the frames
//! past them (the overlap) cross-fade linearly into the next chunk's start, and the last chunk
//! keeps them. The latent is padded by repeating its last frame to whole chunks and the result
//! cut to `((T − token_overlap) / tokens_chunk) · clip_length + frame_overlap` frames. A
//! single latent frame decodes to the last of its `pt` frames.

use crate::progress::Progress;
use crate::runner::RunnerError;
use crate::tensor::HostTensor;

use crate::models::vae::wan_vae::video::host::{put_frames, take_frames};

use super::config::MiniMaxH3VaeConfig;

/// The temporal chunking numbers derived from a configuration (released: 5, 2, 3, 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ChunkGeometry {
    /// Latent frames per chunk: ceil(clip_length / pt).
    pub tokens_chunk: usize,
    /// Latent frames a chunk shares with the next: (−token_drop) mod tokens_chunk.
    pub token_overlap: usize,
    /// Leading pixel frames of a chunk that belong to no input frame: (−clip_length) mod pt.
    pub frame_pre_padding: usize,
    /// Pixel frames cross-faded between chunks.
    pub frame_overlap: usize,
    pub token_drop: usize,
    pub clip_length: usize,
    pub pt: usize,
}

impl ChunkGeometry {
    pub(crate) fn new(c: &MiniMaxH3VaeConfig) -> Self {
        let pt = c.temporal_factor();
        let clip = c.clip_length;
        let tokens_chunk = clip.div_ceil(pt);
        let token_overlap = (tokens_chunk - c.token_drop % tokens_chunk) % tokens_chunk;
        let frame_pre_padding = (pt - clip % pt) % pt;
        Self {
            tokens_chunk,
            token_overlap,
            frame_pre_padding,
            frame_overlap: (token_overlap * pt).saturating_sub(frame_pre_padding),
            token_drop: c.token_drop,
            clip_length: clip,
            pt,
        }
    }

    /// Pixel frames a `t`-frame latent decodes to (1 for 1; upstream's formula otherwise).
    pub(crate) fn video_frames(&self, t: usize) -> usize {
        if t <= 1 {
            return t;
        }
        let whole = t.saturating_sub(self.token_overlap) / self.tokens_chunk;
        let tail = if self.token_drop > 0 {
            self.frame_overlap
        } else {
            0
        };
        (whole * self.clip_length + tail).max(1)
    }
}

/// Frames `start .. start + len` of a clip [W, H, F, C], as a clip.
pub(crate) fn slice_frames(v: &HostTensor, start: usize, len: usize) -> HostTensor {
    let [w, h, f, c] = v.ne;
    let plane = w * h;
    let mut data = Vec::with_capacity(plane * len * c);
    for ch in 0..c {
        let at = (ch * f + start) * plane;
        data.extend_from_slice(&v.data[at..at + len * plane]);
    }
    HostTensor {
        ne: [w, h, len, c],
        data,
    }
}

/// The clips one after the other along frames.
pub(crate) fn concat_frames(parts: &[HostTensor]) -> HostTensor {
    let [w, h, _, c] = parts[0].ne;
    let frames: usize = parts.iter().map(|p| p.ne[2]).sum();
    let mut data = Vec::with_capacity(w * h * frames * c);
    for ch in 0..c {
        for p in parts {
            let n = w * h * p.ne[2];
            data.extend_from_slice(&p.data[ch * n..(ch + 1) * n]);
        }
    }
    HostTensor {
        ne: [w, h, frames, c],
        data,
    }
}

/// The clip with its last frame repeated `extra` more times.
pub(crate) fn repeat_last(v: &HostTensor, extra: usize) -> HostTensor {
    if extra == 0 {
        return v.clone();
    }
    let last = slice_frames(v, v.ne[2] - 1, 1);
    let mut parts = vec![v.clone()];
    parts.extend(std::iter::repeat_n(last, extra));
    concat_frames(&parts)
}

/// `cur` with its first frames cross-faded from the last frames of `prev`: frame k of the
/// `e`-frame overlap is `prev · (1 − k/e) + cur · k/e` (diffusers `_blend`).
pub(crate) fn blend_frames(prev: &HostTensor, cur: &mut HostTensor, extent: usize) {
    let [w, h, fp, c] = prev.ne;
    let fc = cur.ne[2];
    let e = extent.min(fp).min(fc);
    let plane = w * h;
    for ch in 0..c {
        for k in 0..e {
            let wb = k as f32 / e as f32;
            let wa = 1.0 - wb;
            let from = (ch * fp + fp - e + k) * plane;
            let to = (ch * fc + k) * plane;
            for i in 0..plane {
                cur.data[to + i] = prev.data[from + i] * wa + cur.data[to + i] * wb;
            }
        }
    }
}

fn progress(label: &str, n: usize) -> Option<Progress> {
    (n > 1).then(|| Progress::new(label, n))
}

/// Decodes latent z [w, h, T, C] chunk by chunk; `chunk` decodes one chunk [w, h, t, C] to
/// frames [W, H, t·pt, C_out] (and maps them as the caller wants, before any blending).
pub(crate) fn decode_chunks(
    geo: &ChunkGeometry,
    z: &HostTensor,
    mut chunk: impl FnMut(&HostTensor) -> Result<HostTensor, RunnerError>,
) -> Result<HostTensor, RunnerError> {
    let t = z.ne[2];
    if t == 1 {
        let frames = chunk(z)?;
        let n = frames.ne[2];
        return Ok(slice_frames(&frames, n - 1, 1));
    }
    let step = geo.tokens_chunk;
    let lead = usize::from(geo.token_drop > 0);
    let pseudo = t + geo.token_drop;
    let mut pad = (step - pseudo % step) % step;
    let mut chunks = (pseudo + pad) / step - lead;
    if chunks == 0 {
        pad += step;
        chunks = 1;
    }
    let z = repeat_last(z, pad);
    let total = z.ne[2];
    let keep = step * geo.pt;
    let mut parts = Vec::with_capacity(chunks + 1);
    let mut overlap: Option<HostTensor> = None;
    let mut bar = progress("VAE decode (video chunks)", chunks);
    for i in 0..chunks {
        let start = i * step;
        let len = (step + geo.token_overlap).min(total - start);
        let decoded = chunk(&slice_frames(&z, start, len))?;
        let f = decoded.ne[2];
        let end = keep.min(f);
        let begin = geo.frame_pre_padding.min(end);
        let mut first = slice_frames(&decoded, begin, end - begin);
        if let Some(prev) = overlap.take() {
            blend_frames(&prev, &mut first, geo.frame_overlap);
        }
        if f > keep + geo.frame_pre_padding {
            let from = keep + geo.frame_pre_padding;
            overlap = Some(slice_frames(&decoded, from, f - from));
        }
        parts.push(first);
        if i + 1 == chunks {
            if let Some(tail) = overlap.take() {
                parts.push(tail);
            }
        }
        if let Some(bar) = &mut bar {
            bar.tick();
        }
    }
    let out = concat_frames(&parts);
    let want = geo.video_frames(t);
    Ok(if out.ne[2] > want {
        slice_frames(&out, 0, want)
    } else {
        out
    })
}

/// Encodes frames x [W, H, F, C] clip by clip into the mean [w, h, T, z]; `clip` encodes one
/// clip given as [W, H, C, n] (frames in the batch slot) to [w, h, z, latent frames].
pub(crate) fn encode_clips(
    geo: &ChunkGeometry,
    x: &HostTensor,
    mut clip: impl FnMut(&[usize; 4], Vec<f32>) -> Result<HostTensor, RunnerError>,
) -> Result<HostTensor, RunnerError> {
    let [w, h, f, c] = x.ne;
    let len = if f == 1 { 1 } else { geo.clip_length };
    let x = repeat_last(x, (len - f % len) % len);
    let clips = x.ne[2] / len;
    let mut means = Vec::with_capacity(clips);
    let mut bar = progress("VAE encode (video clips)", clips);
    for i in 0..clips {
        let mean = clip(&[w, h, c, len], take_frames(&x, i * len, len))?;
        means.push(mean);
        if let Some(bar) = &mut bar {
            bar.tick();
        }
    }
    let [lw, lh, z, n] = means[0].ne;
    let mut out = HostTensor::zeros([lw, lh, n * clips, z]);
    for (i, m) in means.iter().enumerate() {
        if m.ne != [lw, lh, z, n] {
            return Err(RunnerError::Internal(format!(
                "MiniMax-H3 VAE encode: clip {i} gave {:?}, the first {:?}",
                m.ne, means[0].ne
            )));
        }
        put_frames(&mut out, i * n, m);
    }
    let total = n * clips;
    Ok(if f > 1 && total > geo.token_drop {
        slice_frames(&out, 0, total - geo.token_drop)
    } else {
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> ChunkGeometry {
        ChunkGeometry {
            tokens_chunk: 5,
            token_overlap: 2,
            frame_pre_padding: 3,
            frame_overlap: 5,
            token_drop: 3,
            clip_length: 17,
            pt: 4,
        }
    }

    #[test]
    fn released_frame_counts() {
        let g = geo();
        assert_eq!(g.video_frames(2), 5);
        assert_eq!(g.video_frames(7), 22);
        assert_eq!(g.video_frames(12), 39);
        assert_eq!(g.video_frames(1), 1);
    }

    #[test]
    fn chunks_cover_the_clip_in_order() {
        // A latent whose value is its frame index decodes (by repeating each frame 4 times)
        // to frames that read the chunk geometry back.
        let t = 12;
        let z = HostTensor {
            ne: [1, 1, t, 1],
            data: (0..t).map(|i| i as f32).collect(),
        };
        let mut calls = Vec::new();
        let out = decode_chunks(&geo(), &z, |c| {
            calls.push(c.data.clone());
            let data = c.data.iter().flat_map(|&v| [v; 4]).collect();
            Ok(HostTensor {
                ne: [1, 1, 4 * c.ne[2], 1],
                data,
            })
        })
        .unwrap();
        assert_eq!(calls[0], (0..7).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(calls[1], (5..12).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(out.ne[2], 39);
        // First chunk: pixel frames 3..20 of latent frames 0..5.
        assert_eq!(out.data[0], 0.0);
        assert_eq!(out.data[16], 4.0);
    }
}
