//! Video encode and decode with the Wan 2.1 VAE, chunk by chunk as diffusers'
//! `AutoencoderKLWan` runs them.
//!
//! The decoder takes one latent frame per graph; the first gives one frame, each later one
//! `temporal factor` frames (4: two `upsample3d` levels each double them, the first chunk's
//! upsamplers only start their history). The encoder takes the first frame alone, then four
//! frames per graph, each giving one latent frame (two `downsample3d` levels each halve them).
//! Between graphs every causal conv keeps its last two input frames (the temporal downsamplers
//! their last one) in the runner's named cache on the device, so memory is bounded by one
//! chunk's activations plus that history, not by the video's length; only the host holds the
//! whole clip in and out. Every graph keeps the image path's cut marks, so segmented execution
//! works per chunk.
//!
//! A one-frame video follows the image path op for op: [`WanVae::decode_video`] of a one-frame
//! latent equals [`WanVae::decode`] of it.

pub(crate) mod causal;
pub(crate) mod check;
pub(crate) mod chunk;
pub(crate) mod clip;
pub(crate) mod host;
pub(crate) mod shape;

use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;

use super::WanVae;
use chunk::CACHE_PREFIX;
use clip::ChunkLoop;
use shape::{check_frames, check_latent};

/// Frames the encoder takes per graph after the first frame (diffusers' fixed chunk).
pub const ENCODE_CHUNK_FRAMES: usize = 4;

/// Names the VAE in errors about the caller's clips.
const INPUT: &str = "Wan 2.1 VAE video";

fn bad_input(key: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: INPUT.into(),
        reason,
    }
}

impl WanVae {
    /// Whether the temporal weights were loaded ([`WanVaeConfig::video`](super::WanVaeConfig::video)),
    /// which [`decode_video`](Self::decode_video) and [`encode_video`](Self::encode_video) need.
    pub fn has_video(&self) -> bool {
        self.config.video
    }

    fn require_video(&self) -> Result<(), RunnerError> {
        if self.has_video() {
            return Ok(());
        }
        Err(bad_input(
            "time_conv",
            "the VAE was loaded for images only; set WanVaeConfig::video before WanVae::new".into(),
        ))
    }

    /// Frames each latent frame after the first decodes to: 2 per temporal upsampler (4).
    pub fn decode_time_factor(&self) -> usize {
        self.decoder.as_ref().map_or(1, |(_, d)| {
            1 << d.levels.iter().filter(|l| l.time_conv.is_some()).count()
        })
    }

    /// Input frames per latent frame after the first, encoding: 2 per temporal downsampler (4).
    pub fn encode_time_factor(&self) -> usize {
        self.encoder.as_ref().map_or(1, |(e, _)| {
            1 << e.levels.iter().filter(|l| l.time_conv.is_some()).count()
        })
    }

    /// Frames [`decode_video`](Self::decode_video) makes of `latent_frames` (≥ 1) latent
    /// frames: 1 + 4(T − 1).
    pub fn video_frames(&self, latent_frames: usize) -> usize {
        1 + latent_frames.saturating_sub(1) * self.decode_time_factor()
    }

    /// Latent frames [`encode_video`](Self::encode_video) makes of `frames` frames, which must
    /// be 1 + 4k (diffusers would drop the rest): 1 + k.
    pub fn latent_frames(&self, frames: usize) -> Result<usize, RunnerError> {
        let chunk = ENCODE_CHUNK_FRAMES;
        if frames == 0 || !(frames - 1).is_multiple_of(chunk) {
            return Err(bad_input(
                "frames",
                format!(
                    "{frames} frames; the Wan 2.1 VAE encodes 1 + {chunk}k frames (1, 5, 9, …)"
                ),
            ));
        }
        Ok(1 + (frames - 1) / chunk * (chunk / self.encode_time_factor()))
    }

    /// Decodes one clip's raw latent z [w, h, T, z_dim] (ggml order, PyTorch `[z, T, h, w]`;
    /// `x · std + mean`, as for [`decode`](Self::decode)) to frames [f·w, f·h, F, C_out]
    /// clamped to [-1, 1], F = [`video_frames`](Self::video_frames)(T). One graph per latent
    /// frame on `runner` (which holds this VAE's weights); per-chunk progress on stderr.
    pub fn decode_video(&self, runner: &Runner, z: &HostTensor) -> Result<HostTensor, RunnerError> {
        let (post_quant, decoder) = self
            .decoder
            .as_ref()
            .ok_or_else(|| bad_input("decoder", "the VAE was loaded without its decoder".into()))?;
        self.require_video()?;
        check_latent(z, self.config.z_dim, INPUT)?;
        let clip = ChunkLoop {
            runner,
            cache: CACHE_PREFIX,
            scale: self.scale_factor(),
        };
        clip.decode(
            z,
            self.decode_time_factor(),
            self.config.out_channels,
            |g, z, first| {
                let z = post_quant.forward(g, z);
                g.clamp(chunk::decode(g, decoder, z, first), -1.0, 1.0)
            },
        )
    }

    /// Encodes one clip x [W, H, F, C_in] (ggml order, PyTorch `[C, F, H, W]`) with values in
    /// [-1, 1], F = 1 + 4k and W, H multiples of the scale factor, to the raw posterior mean
    /// [W/f, H/f, 1 + k, z_dim] (normalise it with [`LatentStats::normalize`](super::LatentStats::normalize)).
    /// The first frame alone, then one graph per four frames on `runner`.
    pub fn encode_video(&self, runner: &Runner, x: &HostTensor) -> Result<HostTensor, RunnerError> {
        let (encoder, quant) = self
            .encoder
            .as_ref()
            .ok_or_else(|| bad_input("encoder", "the VAE was loaded without its encoder".into()))?;
        self.require_video()?;
        check_frames(x, self.config.in_channels, INPUT)?;
        let [w, h, frames, _] = x.ne;
        self.check_encode_size(w, h)?;
        let latent = self.latent_frames(frames)?;
        let z = self.config.z_dim;
        let per = ENCODE_CHUNK_FRAMES / self.encode_time_factor();
        let clip = ChunkLoop {
            runner,
            cache: CACHE_PREFIX,
            scale: self.scale_factor(),
        };
        clip.encode(x, per, [latent, z], |g, x| {
            let moments = quant.forward(g, chunk::encode(g, encoder, x));
            super::posterior_mean(g, moments, z)
        })
    }
}
