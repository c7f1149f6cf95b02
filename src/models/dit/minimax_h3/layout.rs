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

/// Lays out one call; `None` when a size does not divide by the patch or nothing is generated.
pub fn build(req: &LayoutRequest<'_>) -> Option<PackedLayout> {
    let [pt, ph, pw] = req.patch;
    if (!req.keyframes.is_empty() && !req.references.is_empty())
        || pt == 0
        || ph == 0
        || pw == 0
        || !req.latent_frames.is_multiple_of(pt)
        || !req.latent_height.is_multiple_of(ph)
        || !req.latent_width.is_multiple_of(pw)
        || req.latent_frames == 0
        || req.latent_height < ph
        || req.latent_width < pw
    {
        return None;
    }
    let text = req.text_tags.len();
    let frames = req.latent_frames / pt;
    let sqrt_area = ((req.latent_height * req.latent_width) as f64).sqrt();
    let h_axis = spatial_axis(req.latent_height, ph, sqrt_area);
    let w_axis = spatial_axis(req.latent_width, pw, sqrt_area);
    let per_frame = h_axis.len() * w_axis.len();
    let origin = text as f64;

    let mut timesteps = Vec::new();
    let video_ti = timestep_index(&mut timesteps, req.video_t);
    let audio_ti = timestep_index(&mut timesteps, req.audio_t);

    let mut positions: Vec<[f32; 3]> = Vec::new();
    let mut push = |t: f64, h: f64, w: f64| positions.push([t as f32, h as f32, w as f32]);
    let mut runs = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    let mut add_span = |start: usize, len: usize, modulation: usize| {
        if len > 0 {
            spans.push(Span {
                start,
                len,
                modulation,
            });
        }
    };

    // Text: runs of equal tags are spans of their own.
    for (i, _) in req.text_tags.iter().enumerate() {
        push(i as f64, 0.0, 0.0);
    }
    if text > 0 {
        runs.push(Run {
            source: Source::Text,
            from: 0,
            len: text,
        });
    }
    let mut start = 0;
    for i in 1..=text {
        if i == text || req.text_tags[i] != req.text_tags[start] {
            let tag = usize::from(req.text_tags[start]).min(AUDIO_TAG);
            add_span(start, i - start, video_ti * MODALITIES + tag);
            start = i;
        }
    }

    // Keyframes: one frame of rows each, at the clock's start or at the last frame's time.
    let mut row = text;
    if !req.keyframes.is_empty() {
        let cond_ti = timestep_index(&mut timesteps, req.video_t.max(KEYFRAME_T));
        let duration: f64 = (0..frames).map(frame_span).sum();
        for (k, kf) in req.keyframes.iter().enumerate() {
            let t = match kf {
                Keyframe::First => origin,
                Keyframe::Last => origin + duration - FRAME_RESCALE,
            };
            for &h in &h_axis {
                for &w in &w_axis {
                    push(t, h, w);
                }
            }
            runs.push(Run {
                source: Source::Video,
                from: k * per_frame,
                len: per_frame,
            });
            add_span(row, per_frame, cond_ti * MODALITIES + VIDEO_TAG);
            row += per_frame;
        }
    }
    let mut cond_rows = req.keyframes.len() * per_frame;

    // Reference blocks advance the clock: an image by one unit, audio by its length. Their
    // rows are held at the conditioning timesteps (images max(t, 0.999), audio clean).
    let mut clock = origin;
    let mut ref_audio_rows = 0;
    for r in req.references {
        match *r {
            Reference::Image { height, width } => {
                if height < ph || width < pw || height % ph != 0 || width % pw != 0 {
                    return None;
                }
                let area = ((height * width) as f64).sqrt();
                let (ha, wa) = (
                    spatial_axis(height, ph, area),
                    spatial_axis(width, pw, area),
                );
                for &h in &ha {
                    for &w in &wa {
                        push(clock, h, w);
                    }
                }
                let n = ha.len() * wa.len();
                let ti = timestep_index(&mut timesteps, req.video_t.max(KEYFRAME_T));
                runs.push(Run {
                    source: Source::Video,
                    from: cond_rows,
                    len: n,
                });
                add_span(row, n, ti * MODALITIES + VIDEO_TAG);
                row += n;
                cond_rows += n;
                clock += 1.0;
            }
            Reference::Video {
                frames: n,
                height,
                width,
                audio_latents,
            } => {
                if height < ph || width < pw || height % ph != 0 || width % pw != 0 {
                    return None;
                }
                let area = ((height * width) as f64).sqrt();
                let (ha, wa) = (
                    spatial_axis(height, ph, area),
                    spatial_axis(width, pw, area),
                );
                // Its soundtrack, pinned to the video's own first / last width coordinate.
                for ch in 0..AUDIO_CHANNELS {
                    let w = if ch == 0 { wa[0] } else { wa[wa.len() - 1] };
                    for i in 0..audio_latents {
                        push(clock + i as f64, 0.0, w);
                    }
                }
                let na = AUDIO_CHANNELS * audio_latents;
                if na > 0 {
                    let ti = timestep_index(&mut timesteps, req.audio_t.max(1.0));
                    runs.push(Run {
                        source: Source::Audio,
                        from: ref_audio_rows,
                        len: na,
                    });
                    add_span(row, na, ti * MODALITIES + AUDIO_TAG);
                    row += na;
                    ref_audio_rows += na;
                }
                let mut t = clock;
                for f in 0..n {
                    for &h in &ha {
                        for &w in &wa {
                            push(t, h, w);
                        }
                    }
                    t += frame_span(f);
                }
                let nv = n * ha.len() * wa.len();
                let ti = timestep_index(&mut timesteps, req.video_t.max(KEYFRAME_T));
                runs.push(Run {
                    source: Source::Video,
                    from: cond_rows,
                    len: nv,
                });
                add_span(row, nv, ti * MODALITIES + VIDEO_TAG);
                row += nv;
                cond_rows += nv;
                let span: f64 = (0..n).map(frame_span).sum();
                clock += span.max(audio_latents as f64);
            }
            Reference::Audio { latents } => {
                for ch in 0..AUDIO_CHANNELS {
                    let w = if ch == 0 {
                        w_axis[0]
                    } else {
                        w_axis[w_axis.len() - 1]
                    };
                    for i in 0..latents {
                        push(clock + i as f64, 0.0, w);
                    }
                }
                let n = AUDIO_CHANNELS * latents;
                let ti = timestep_index(&mut timesteps, req.audio_t.max(1.0));
                if n > 0 {
                    runs.push(Run {
                        source: Source::Audio,
                        from: ref_audio_rows,
                        len: n,
                    });
                }
                add_span(row, n, ti * MODALITIES + AUDIO_TAG);
                row += n;
                ref_audio_rows += n;
                clock += latents as f64;
            }
        }
    }
    let origin = clock;

    // Target audio, channel-major.
    let audio_rows = AUDIO_CHANNELS * req.audio_latents;
    for ch in 0..AUDIO_CHANNELS {
        let w = if ch == 0 {
            w_axis[0]
        } else {
            w_axis[w_axis.len() - 1]
        };
        for i in 0..req.audio_latents {
            push(origin + i as f64, 0.0, w);
        }
    }
    let audio = Target {
        start: row,
        len: audio_rows,
        timestep: audio_ti,
    };
    if audio_rows > 0 {
        runs.push(Run {
            source: Source::Audio,
            from: ref_audio_rows,
            len: audio_rows,
        });
    }
    add_span(row, audio_rows, audio_ti * MODALITIES + AUDIO_TAG);
    row += audio_rows;

    // Target video, frame-major then row-major.
    let mut clock = origin;
    for f in 0..frames {
        for &h in &h_axis {
            for &w in &w_axis {
                push(clock, h, w);
            }
        }
        clock += frame_span(f);
    }
    let video_len = frames * per_frame;
    runs.push(Run {
        source: Source::Video,
        from: cond_rows,
        len: video_len,
    });
    add_span(row, video_len, video_ti * MODALITIES + VIDEO_TAG);
    let video = Target {
        start: row,
        len: video_len,
        timestep: video_ti,
    };
    Some(PackedLayout {
        runs,
        spans: merge(spans),
        positions,
        timesteps,
        video,
        audio,
        text_rows: text,
        video_rows: cond_rows + video_len,
        audio_rows: ref_audio_rows + audio_rows,
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
