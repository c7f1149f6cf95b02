//! The media a MiniMax-H3 batch conditions on, encoded once per batch: keyframes (I2VA /
//! FL2VA, `keyframes`) or Ref2VA references (`references`) — video latents held at the
//! conditioning level with their visual noise, reference soundtracks as clean audio rows,
//! and the pictures' vision embeddings for the prompt.

use std::hash::{Hash, Hasher};
use std::time::Instant;

use super::keyframes::{self, visual_noise, KeyframeImage};
use super::pipeline::MiniMaxH3Pipeline;
use crate::error::Result;
use crate::image_io::audio::Audio;
use crate::image_io::Image;
use crate::models::dit::minimax_h3::{self, Keyframe, Reference};
use crate::models::te::qwen3::VisionEmbeds;
use crate::models::vae::minimax_h3_vae::{encode_video_tiled, normalize_video_latent};
use crate::models::vae::tiling::TileSettings;
use crate::pipeline::family::RefVideo;
use crate::progress::Progress;
use crate::tensor::HostTensor;

/// The batch's conditioning media.
#[derive(Default)]
pub struct Conditions {
    /// Normalised video latents [w, h, 1, C] (before the visual noise), in packed order.
    pub latents: Vec<HostTensor>,
    /// One anchor per latent in a keyframe run.
    pub anchors: Vec<Keyframe>,
    /// The reference blocks of a Ref2VA run, in packed order.
    pub references: Vec<Reference>,
    /// Reference soundtracks as transformer audio rows ([audio channels, rows] data), clips
    /// in order, each channel-major.
    pub audio_rows: Vec<f32>,
    /// The vision embeddings of every vision block in prompt order (empty without the
    /// vision tower).
    pub vision: Vec<VisionEmbeds>,
    /// What the prompt presents before the text (empty without the vision tower, as
    /// upstream).
    pub presentation: Vec<Item>,
    /// Fingerprint of the above (prompt conditions are memoised per prompt and media).
    pub id: u64,
}

/// One presented reference: `<Picture i>: ` + a vision block, `<Audio k>: `, or
/// `<Video j>: ` + per block a `<t seconds>` label and a vision block.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Picture,
    Audio,
    Video(Vec<String>),
}

impl Conditions {
    /// Whether the prompt carries anything besides the text.
    pub fn has_presentation(&self) -> bool {
        !self.presentation.is_empty()
    }

    fn fingerprint(mut self) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for z in &self.latents {
            z.data.iter().for_each(|v| v.to_bits().hash(&mut h));
        }
        for a in &self.anchors {
            (*a == Keyframe::Last).hash(&mut h);
        }
        self.audio_rows
            .iter()
            .for_each(|v| v.to_bits().hash(&mut h));
        for e in &self.vision {
            e.embeds.data.iter().for_each(|v| v.to_bits().hash(&mut h));
        }
        format!("{:?}", self.presentation).hash(&mut h);
        self.id = h.finish();
        self
    }
}

/// One image's condition rows: the video latents with their visual noise, patchified, and
/// the reference audio rows; with where the layout puts them.
pub struct ConditionRows {
    /// [video features, rows].
    pub video: HostTensor,
    /// Reference audio rows ([audio channels, rows] data).
    pub audio: Vec<f32>,
    pub anchors: Vec<Keyframe>,
    pub references: Vec<Reference>,
}

impl MiniMaxH3Pipeline {
    /// Encodes keyframes: their latents (normalised, before the visual noise, which depends
    /// on each image's seed) and, with the vision tower, their pictures.
    pub(super) fn encode_keyframes(
        &self,
        images: &[KeyframeImage],
        tiling: Option<&TileSettings>,
    ) -> Result<Conditions> {
        let t = Instant::now();
        let mut bar = Progress::new("keyframes", images.len());
        let mut c = Conditions::default();
        for (i, k) in images.iter().enumerate() {
            c.latents.push(self.encode_frame(&k.image, tiling)?);
            c.anchors.push(k.anchor);
            if let Some(v) = self.picture(&k.image)? {
                c.vision.push(v);
                c.presentation.push(Item::Picture);
            }
            bar.set(i + 1);
        }
        log::debug!("minimax_h3: keyframes {:.2}s", t.elapsed().as_secs_f64());
        Ok(c.fingerprint())
    }

    /// Encodes Ref2VA references in upstream's packed order: the images (each scaled down to
    /// at most the output's area, sides rounded to 32, nearest resize; its latent and its
    /// picture), then the soundtracks (32 kHz stereo, zero-padded to whole 800-sample
    /// latents, the audio VAE's posterior mean, normalised).
    pub(super) fn encode_references(
        &self,
        images: &[Image],
        videos: &[RefVideo],
        audio: &[Audio],
        size: (usize, usize, usize),
        tiling: Option<&TileSettings>,
    ) -> Result<Conditions> {
        let (width, height, frames) = size;
        let t = Instant::now();
        let total = images.len() + videos.len() + audio.len();
        let mut bar = Progress::new("references", total);
        let mut c = Conditions::default();
        for (i, img) in images.iter().enumerate() {
            let resized = super::references::fit_reference(img, width, height);
            log::debug!(
                "reference image {}: {}x{} -> {}x{}",
                i + 1,
                img.width,
                img.height,
                resized.width,
                resized.height
            );
            let z = self.encode_frame(&resized, tiling)?;
            c.references.push(Reference::Image {
                height: z.ne[1],
                width: z.ne[0],
            });
            c.latents.push(z);
            if let Some(v) = self.picture(&resized)? {
                c.vision.push(v);
                c.presentation.push(Item::Picture);
            }
            bar.set(i + 1);
        }
        let mut done = images.len();
        for (i, video) in videos.iter().enumerate() {
            let clip = super::references::fit_reference_video(&video.frames, frames, i)?;
            let audio_latents = match &video.audio {
                Some(a) => {
                    let n = self.push_audio_rows(&mut c, a, i)?;
                    c.presentation.push(Item::Audio);
                    n
                }
                None => 0,
            };
            let z = self.encode_clip(&clip, tiling)?;
            c.references.push(Reference::Video {
                frames: z.ne[2],
                height: z.ne[1],
                width: z.ne[0],
                audio_latents,
            });
            c.latents.push(z);
            if self.vision().is_some() {
                let mut labels = Vec::new();
                for (label, pair) in super::references::presentation_pairs(&clip) {
                    c.vision.push(self.picture_pair(&pair)?);
                    labels.push(label);
                }
                c.presentation.push(Item::Video(labels));
            }
            done += 1;
            bar.set(done);
        }
        for (i, clip) in audio.iter().enumerate() {
            let latents = self.push_audio_rows(&mut c, clip, videos.len() + i)?;
            c.references.push(Reference::Audio { latents });
            c.presentation.push(Item::Audio);
            done += 1;
            bar.set(done);
        }
        if self.vision().is_none() {
            // Upstream presents references only with the vision tower.
            c.presentation.clear();
        }
        log::debug!("minimax_h3: references {:.2}s", t.elapsed().as_secs_f64());
        Ok(c.fingerprint())
    }

    /// Appends a reference soundtrack's rows (its block is the caller's: a video's soundtrack
    /// belongs to the video's); returns its latents per channel.
    fn push_audio_rows(&self, c: &mut Conditions, clip: &Audio, index: usize) -> Result<usize> {
        let vae = self.audio_vae_encoder()?;
        let z = super::references::encode_reference_audio(vae, clip, index)?;
        // [T, C, S] → rows channel-major: stream s, latent t is row s·T + t.
        let [n, ch, streams, _] = z.ne;
        for s in 0..streams {
            for t in 0..n {
                for k in 0..ch {
                    c.audio_rows.push(z.data[t + n * (k + ch * s)]);
                }
            }
        }
        Ok(n)
    }

    /// One RGB frame through the VAE encoder, normalised: [w, h, 1, C].
    fn encode_frame(&self, img: &Image, tiling: Option<&TileSettings>) -> Result<HostTensor> {
        self.encode_clip(std::slice::from_ref(img), tiling)
    }

    /// RGB frames of one size through the VAE encoder (spatially tiled by the decode's rule),
    /// normalised: [w, h, T, C].
    fn encode_clip(&self, frames: &[Image], tiling: Option<&TileSettings>) -> Result<HostTensor> {
        let (w, h) = (frames[0].width as usize, frames[0].height as usize);
        let n = frames.len();
        // [W, H, F, 3] in [−1, 1].
        let mut data = vec![0f32; w * h * n * 3];
        for (f, img) in frames.iter().enumerate() {
            let rgb = img.to_rgb();
            for (i, px) in rgb.data.chunks_exact(3).enumerate() {
                for (c, &v) in px.iter().enumerate() {
                    data[i + w * h * (f + n * c)] = f32::from(v) / 255.0 * 2.0 - 1.0;
                }
            }
        }
        let clip = HostTensor {
            ne: [w, h, n, 3],
            data,
        };
        let (vae, stats) = self.video_vae();
        let mut z = encode_video_tiled(&vae.model, &vae.runner, &clip, tiling)?;
        normalize_video_latent(stats, &mut z)?;
        Ok(z)
    }

    /// A video block's vision embeddings: two frames (already at one size) in the tower's two
    /// temporal slots, each resized as a picture is.
    fn picture_pair(&self, pair: &[Image; 2]) -> Result<VisionEmbeds> {
        let v = self.vision().ok_or_else(|| {
            crate::error::Error::Unsupported("the vision tower is not loaded".into())
        })?;
        let factor = v.preprocess().factor();
        let (a, w, h) = keyframes::vision_input(&pair[0], factor)?;
        let (b, _, _) = keyframes::vision_input(&pair[1], factor)?;
        v.embed_frames(&[&a, &b], w, h)
    }

    /// A picture's vision embeddings, when the vision tower is loaded.
    fn picture(&self, img: &Image) -> Result<Option<VisionEmbeds>> {
        let Some(v) = self.vision() else {
            return Ok(None);
        };
        let (rgb, vw, vh) = keyframes::vision_input(img, v.preprocess().factor())?;
        Ok(Some(v.embed(&rgb, vw, vh)?))
    }

    /// The condition rows of an image with seed `seed`: each video latent with its visual
    /// noise, patchified, and the reference audio rows, in packed order.
    pub(super) fn condition_rows(&self, seed: u64) -> Option<ConditionRows> {
        let c = self.conditions()?;
        if c.latents.is_empty() && c.audio_rows.is_empty() {
            return None;
        }
        let patch = self.transformer_patch();
        let mut data = Vec::new();
        let mut count = 0;
        let mut features = 0;
        for z in &c.latents {
            let rows = minimax_h3::patchify(&visual_noise(z, seed), patch);
            features = rows.ne[0];
            count += rows.ne[1];
            data.extend_from_slice(&rows.data);
        }
        Some(ConditionRows {
            video: HostTensor {
                ne: [features, count, 1, 1],
                data,
            },
            audio: c.audio_rows.clone(),
            anchors: c.anchors.clone(),
            references: c.references.clone(),
        })
    }
}
