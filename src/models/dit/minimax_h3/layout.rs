//! The packed sequence MiniMax-H3 attends over, as diffusers' `MiniMaxH3PrepareLayoutStep`
//! and upstream's `build_layout` lay it out for text-to-audio-video and keyframe
//! conditioning: `[text | keyframe rows | target audio | target video]`.
//!
//! Rotary coordinates (t, h, w): text row i at (i, 0, 0); the media clock starts at the
//! text length. Video latent frames advance it by 5/3 · (1, 4, 4, 4, 4)[frame mod 5]; the
//! spatial axes are aspect-normalised, `count = dim / patch` points of
//! `(left + i · ratio / count) · 32` with `ratio = dim / √(H·W)` and `left = (1 − ratio)/2`.
//! Audio rows are channel-major (all of channel 0, then channel 1), one clock unit per
//! latent, h = 0 and w pinned to the first / last width coordinate. A "first" keyframe
//! sits at the clock's start, a "last" one at the last generated frame's time.
//!
//! Every row also gets a timestep and a modality tag (0 video, 1 text, 2 audio), which pick
//! its AdaLN row: text rows take the video timestep, keyframe rows `max(t, 0.999)`.

use super::block::Span;

pub const VIDEO_TAG: usize = 0;
pub const TEXT_TAG: usize = 1;
pub const AUDIO_TAG: usize = 2;
/// Tags (modalities) per timestep in the AdaLN tables.
pub const MODALITIES: usize = 3;
/// The timestep keyframe rows are held at (diffusers `keyframe_noise_aug`, upstream
/// `VISUAL_COND_TIMESTEP`).
pub const KEYFRAME_T: f32 = 0.999;
/// Audio is stereo, packed channel-major.
pub const AUDIO_CHANNELS: usize = 2;
/// Clock units per latent frame: 5/3 × the frames each latent stands for.
const FRAME_RESCALE: f64 = 5.0 / 3.0;
const FRAMES_PER_LATENT: [f64; 5] = [1.0, 4.0, 4.0, 4.0, 4.0];
const SPATIAL_SCALE: f64 = 32.0;

/// Where a keyframe condition anchors on the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyframe {
    First,
    Last,
}

/// One Ref2VA reference block, in packed order (upstream: images, then videos, then audio
/// clips).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    /// A reference image: one latent frame of `height × width` (latent units).
    Image { height: usize, width: usize },
    /// A reference video of `frames` latent frames, its soundtrack's `audio_latents` per
    /// channel (0 without one) packed before it from the same clock time.
    Video {
        frames: usize,
        height: usize,
        width: usize,
        audio_latents: usize,
    },
    /// A reference soundtrack: `latents` per stereo channel.
    Audio { latents: usize },
}

/// What one call generates and conditions on.
#[derive(Clone, Debug)]
pub struct LayoutRequest<'a> {
    /// Modality tag of every text row (1, or 0 for the rows of a vision block).
    pub text_tags: &'a [u8],
    pub latent_frames: usize,
    pub latent_height: usize,
    pub latent_width: usize,
    pub patch: [usize; 3],
    /// Audio latents per channel.
    pub audio_latents: usize,
    /// One frame of keyframe rows each, in packed order.
    pub keyframes: &'a [Keyframe],
    /// Ref2VA reference blocks (not with keyframes): image rows come first among the video
    /// input rows, audio rows first among the audio input rows, both in this order.
    pub references: &'a [Reference],
    /// t = 1 − σ of the generated video and audio rows.
    pub video_t: f32,
    pub audio_t: f32,
}

/// Which input a run of sequence rows is taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Text,
    /// Video patch rows: keyframe rows first, then the generated frames.
    Video,
    /// Audio rows, channel-major.
    Audio,
}

/// `len` rows of `source` from row `from`, placed next in the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub source: Source,
    pub from: usize,
    pub len: usize,
}

/// Generated rows of one modality: where they sit and their timestep index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub start: usize,
    pub len: usize,
    pub timestep: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PackedLayout {
    pub runs: Vec<Run>,
    pub spans: Vec<Span>,
    /// (t, h, w) of every row.
    pub positions: Vec<[f32; 3]>,
    /// The distinct timesteps the rows use.
    pub timesteps: Vec<f32>,
    pub video: Target,
    pub audio: Target,
    pub text_rows: usize,
    /// Video input rows (keyframes and generated frames).
    pub video_rows: usize,
    pub audio_rows: usize,
}

impl PackedLayout {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Every row's timestep (for checks against a reference layout).
    pub fn row_timesteps(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        for s in &self.spans {
            let t = self.timesteps[s.modulation / MODALITIES];
            out[s.start..s.start + s.len].fill(t);
        }
        out
    }
}

/// One aspect-normalised spatial axis.
pub fn spatial_axis(dim: usize, patch: usize, sqrt_area: f64) -> Vec<f64> {
    let count = dim / patch;
    let ratio = dim as f64 / sqrt_area;
    let left = (1.0 - ratio) / 2.0;
    (0..count)
        .map(|i| (left + i as f64 * (ratio / count as f64)) * SPATIAL_SCALE)
        .collect()
}

/// Clock advance after latent frame `i`.
pub fn frame_span(i: usize) -> f64 {
    FRAME_RESCALE * FRAMES_PER_LATENT[i % FRAMES_PER_LATENT.len()]
}

fn timestep_index(values: &mut Vec<f32>, t: f32) -> usize {
    match values.iter().position(|&v| v == t) {
        Some(i) => i,
        None => {
            values.push(t);
            values.len() - 1
        }
    }
}

/// The sequence as it is laid out: rows' positions, where their inputs come from, their
/// AdaLN rows.
#[derive(Default)]
struct Builder {
    positions: Vec<[f32; 3]>,
    runs: Vec<Run>,
    spans: Vec<Span>,
    timesteps: Vec<f32>,
    /// Video / audio input rows taken so far.
    video_from: usize,
    audio_from: usize,
}

impl Builder {
    fn rows(&self) -> usize {
        self.positions.len()
    }

    fn span(&mut self, len: usize, t: f32, tag: usize) {
        if len > 0 {
            let modulation = timestep_index(&mut self.timesteps, t) * MODALITIES + tag;
            let start = self.rows() - len;
            self.spans.push(Span {
                start,
                len,
                modulation,
            });
        }
    }

    /// `frames` latent frames of video rows on the `h × w` axes from clock time `t0`
    /// (advancing by [`frame_span`], or not at all with `still`), at timestep `t`; returns
    /// the clock after them.
    fn video(&mut self, t0: f64, frames: usize, axes: &Axes, still: bool, t: f32) -> f64 {
        let mut clock = t0;
        for f in 0..frames {
            for &h in &axes.h {
                for &w in &axes.w {
                    self.positions.push([clock as f32, h as f32, w as f32]);
                }
            }
            if !still {
                clock += frame_span(f);
            }
        }
        self.take(frames * axes.h.len() * axes.w.len(), t, VIDEO_TAG);
        clock
    }

    /// The next `len` rows of the video (`tag` video) or audio input, placed next, at
    /// timestep `t`.
    fn take(&mut self, len: usize, t: f32, tag: usize) {
        let (source, from) = if tag == VIDEO_TAG {
            (Source::Video, &mut self.video_from)
        } else {
            (Source::Audio, &mut self.audio_from)
        };
        if len > 0 {
            self.runs.push(Run {
                source,
                from: *from,
                len,
            });
        }
        *from += len;
        self.span(len, t, tag);
    }

    /// `latents` audio rows per stereo channel, channel-major, from clock time `t0`, the
    /// channels pinned to the first / last coordinate of the `w` axis, at timestep `t`.
    fn audio(&mut self, t0: f64, latents: usize, w: &[f64], t: f32) {
        for ch in 0..AUDIO_CHANNELS {
            let x = if ch == 0 { w[0] } else { w[w.len() - 1] };
            for i in 0..latents {
                self.positions.push([(t0 + i as f64) as f32, 0.0, x as f32]);
            }
        }
        self.take(AUDIO_CHANNELS * latents, t, AUDIO_TAG);
    }
}

/// The aspect-normalised spatial axes of one frame.
struct Axes {
    h: Vec<f64>,
    w: Vec<f64>,
}

impl Axes {
    /// `None` when a side does not divide into patches.
    fn new(height: usize, width: usize, ph: usize, pw: usize) -> Option<Self> {
        if height < ph || width < pw || !height.is_multiple_of(ph) || !width.is_multiple_of(pw) {
            return None;
        }
        let area = ((height * width) as f64).sqrt();
        Some(Self {
            h: spatial_axis(height, ph, area),
            w: spatial_axis(width, pw, area),
        })
    }
}

/// Lays out one call; `None` when a size does not divide by the patch or nothing is generated.
pub fn build(req: &LayoutRequest<'_>) -> Option<PackedLayout> {
    let [pt, ph, pw] = req.patch;
    if (!req.keyframes.is_empty() && !req.references.is_empty())
        || pt == 0
        || ph == 0
        || pw == 0
        || !req.latent_frames.is_multiple_of(pt)
        || req.latent_frames == 0
    {
        return None;
    }
    let axes = Axes::new(req.latent_height, req.latent_width, ph, pw)?;
    let text = req.text_tags.len();
    let frames = req.latent_frames / pt;
    let origin = text as f64;
    let condition_t = req.video_t.max(KEYFRAME_T);
    let mut b = Builder::default();
    // The generated rows' timesteps come first.
    let video_ti = timestep_index(&mut b.timesteps, req.video_t);
    let audio_ti = timestep_index(&mut b.timesteps, req.audio_t);

    // Text: runs of equal tags are spans of their own.
    for i in 0..text {
        b.positions.push([i as f32, 0.0, 0.0]);
    }
    if text > 0 {
        b.runs.push(Run {
            source: Source::Text,
            from: 0,
            len: text,
        });
    }
    let mut start = 0;
    for i in 1..=text {
        if i == text || req.text_tags[i] != req.text_tags[start] {
            let tag = usize::from(req.text_tags[start]).min(AUDIO_TAG);
            b.spans.push(Span {
                start,
                len: i - start,
                modulation: video_ti * MODALITIES + tag,
            });
            start = i;
        }
    }

    // Keyframes: one frame of rows each, at the clock's start or at the last frame's time;
    // they do not move the clock.
    let duration: f64 = (0..frames).map(frame_span).sum();
    for kf in req.keyframes {
        let t = match kf {
            Keyframe::First => origin,
            Keyframe::Last => origin + duration - FRAME_RESCALE,
        };
        b.video(t, 1, &axes, true, condition_t);
    }

    // Reference blocks advance the clock: an image by one unit, a video by its frames' span
    // or its soundtrack's length, a clip by its length. Video conditions are held at
    // max(t, 0.999), reference audio is clean.
    let mut clock = origin;
    for r in req.references {
        match *r {
            Reference::Image { height, width } => {
                b.video(
                    clock,
                    1,
                    &Axes::new(height, width, ph, pw)?,
                    true,
                    condition_t,
                );
                clock += 1.0;
            }
            Reference::Video {
                frames: n,
                height,
                width,
                audio_latents,
            } => {
                let ref_axes = Axes::new(height, width, ph, pw)?;
                // Its soundtrack first, pinned to the video's own width coordinates.
                b.audio(clock, audio_latents, &ref_axes.w, req.audio_t.max(1.0));
                let end = b.video(clock, n, &ref_axes, false, condition_t);
                clock = end.max(clock + audio_latents as f64);
            }
            Reference::Audio { latents } => {
                b.audio(clock, latents, &axes.w, req.audio_t.max(1.0));
                clock += latents as f64;
            }
        }
    }
    let video_rows_before = b.video_from;

    // Target audio (channel-major), then the target video, from the same clock time.
    let audio = Target {
        start: b.rows(),
        len: AUDIO_CHANNELS * req.audio_latents,
        timestep: audio_ti,
    };
    b.audio(clock, req.audio_latents, &axes.w, req.audio_t);
    let video = Target {
        start: b.rows(),
        len: frames * axes.h.len() * axes.w.len(),
        timestep: video_ti,
    };
    b.video(clock, frames, &axes, false, req.video_t);
    debug_assert_eq!(b.video_from, video_rows_before + video.len);
    Some(PackedLayout {
        runs: b.runs,
        spans: merge(b.spans),
        positions: b.positions,
        timesteps: b.timesteps,
        video,
        audio,
        text_rows: text,
        video_rows: b.video_from,
        audio_rows: b.audio_from,
    })
}

/// Adjacent spans with the same AdaLN row become one.
fn merge(spans: Vec<Span>) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(last) if last.modulation == s.modulation && last.start + last.len == s.start => {
                last.len += s.len;
            }
            _ => out.push(s),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn square_axis_spans_zero_to_32() {
        let a = spatial_axis(8, 2, 8.0);
        assert_eq!(a, vec![0.0, 8.0, 16.0, 24.0]);
    }

    #[test]
    fn sequence_order_and_spans() {
        let tags = [1u8, 0, 0, 1];
        let req = LayoutRequest {
            text_tags: &tags,
            latent_frames: 2,
            latent_height: 4,
            latent_width: 4,
            patch: [1, 2, 2],
            audio_latents: 3,
            keyframes: &[Keyframe::First],
            references: &[],
            video_t: 0.5,
            audio_t: 0.25,
        };
        let l = build(&req).unwrap();
        // 4 text + 4 keyframe + 6 audio + 8 video rows.
        assert_eq!(l.len(), 22);
        assert_eq!(
            l.video,
            Target {
                start: 14,
                len: 8,
                timestep: 0
            }
        );
        assert_eq!(
            l.audio,
            Target {
                start: 8,
                len: 6,
                timestep: 1
            }
        );
        assert_eq!(l.timesteps, vec![0.5, 0.25, 0.999]);
        let mods: Vec<usize> = l.spans.iter().map(|s| s.modulation).collect();
        assert_eq!(mods, vec![1, 0, 1, 6, 5, 0]);
        // The second frame starts 5/3 clock units after the first.
        assert!((l.positions[18][0] - (4.0 + 5.0 / 3.0) as f32).abs() < 1e-6);
        assert_eq!(l.positions[8], [4.0, 0.0, 0.0]);
        assert_eq!(l.positions[11][2], l.positions[21][2]);
    }

    #[test]
    fn references_advance_the_clock() {
        let tags = [1u8, 1];
        let refs = [
            Reference::Image {
                height: 4,
                width: 8,
            },
            Reference::Audio { latents: 3 },
        ];
        let req = LayoutRequest {
            text_tags: &tags,
            latent_frames: 2,
            latent_height: 4,
            latent_width: 4,
            patch: [1, 2, 2],
            audio_latents: 3,
            keyframes: &[],
            references: &refs,
            video_t: 0.5,
            audio_t: 0.25,
        };
        let l = build(&req).unwrap();
        // 2 text + 8 image + 6 reference audio + 6 audio + 8 video rows.
        assert_eq!(l.len(), 30);
        assert_eq!((l.video_rows, l.audio_rows), (16, 12));
        assert_eq!(l.positions[2][0], 2.0, "the image at the clock's start");
        assert_eq!(l.positions[10][0], 3.0, "reference audio one unit later");
        assert_eq!(l.positions[13][0], 3.0, "its second channel too");
        assert_eq!(l.positions[16][0], 6.0, "target audio after the clip");
        assert_eq!(l.positions[22][0], 6.0, "target video from the same origin");
        assert_eq!(l.timesteps, vec![0.5, 0.25, 0.999, 1.0]);
        let runs: Vec<(Source, usize, usize)> =
            l.runs.iter().map(|r| (r.source, r.from, r.len)).collect();
        assert_eq!(
            runs,
            vec![
                (Source::Text, 0, 2),
                (Source::Video, 0, 8),
                (Source::Audio, 0, 6),
                (Source::Audio, 6, 6),
                (Source::Video, 8, 8)
            ]
        );
        let mods: Vec<usize> = l.spans.iter().map(|s| s.modulation).collect();
        assert_eq!(mods, vec![1, 6, 11, 5, 0]);
        let keyed = LayoutRequest {
            keyframes: &[Keyframe::First],
            ..req
        };
        assert!(
            build(&keyed).is_none(),
            "keyframes and references exclude each other"
        );
    }
}
