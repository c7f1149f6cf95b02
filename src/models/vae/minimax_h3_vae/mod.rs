//! The MiniMax-H3 video VAE (diffusers `AutoencoderKLMiniMaxH3`, stable-diffusion.cpp
//! `minimax_h3_vae.hpp`): a causal 3-D CNN encoder and a non-causal ViT decoder, 16× in space,
//! 4× in time, a 24-channel latent.
//!
//! Pixels live in ImageNet-normalised RGB, `(rgb − mean) / std` over [0, 1]
//! ([`PIXEL_MEAN`], [`PIXEL_STD`]). The `*_raw` entry points work in that space, as diffusers'
//! `encode` / `decode` do; the others take and give [−1, 1] like every other VAE here
//! (decoded chunks are mapped to RGB and clamped to [0, 1] before any blending, as
//! stable-diffusion.cpp does). Latent normalisation is the caller's: the transformer works on
//! `(z − latents_mean) / latents_std` ([`LatentStats`], from `config.json` or the released
//! values).
//!
//! Video geometry (see `video`): encoding runs 17-frame clips and drops 3 latent frames
//! (`17n + 5` frames ↔ `5n + 2` latent frames); decoding runs chunks of 5 + 2 latent frames
//! whose overlaps cross-fade. Both directions are always spatially tiled as upstream runs them
//! ([`decode_video_tiled`], [`encode_video_tiled`], [`tile_settings`]). Both checkpoint layouts
//! load ([`MiniMaxH3VaeLayout`]); the configuration comes from the weight shapes and, for what
//! they cannot tell, `config.json` ([`MiniMaxH3VaeConfig::detect`]).
//!
//! A pipeline decodes with `denormalize_video_latent` then [`decode_video_tiled`], and encodes
//! a condition (`--init-img`, `--end-img`) with [`encode_video_tiled`] then
//! [`normalize_video_latent`]. The condition latent is the posterior mean, as
//! stable-diffusion.cpp takes it; diffusers' pipeline instead samples the posterior under seed
//! 42 and rounds it to f16 before normalising (`encode_vae_condition`).

mod config;
mod decoder;
mod encoder;
mod layout;
mod tiling;
mod video;

pub use super::qwen_image_2_1_vae::LatentStats;
pub use config::{MiniMaxH3VaeConfig, LATENTS_MEAN, LATENTS_STD, PIXEL_MEAN, PIXEL_STD};
pub use layout::MiniMaxH3VaeLayout;
pub use tiling::{decode_video_tiled, encode_video_tiled, tile_settings, DEFAULT_OVERLAP};

use crate::ggml::Tensor;
use crate::models::vae::wan_vae::video::shape::{check_frames, check_latent};
use crate::runner::{GraphCtx, Runner, RunnerError, WeightBuilder};
use crate::tensor::HostTensor;

use decoder::Decoder;
use encoder::Encoder;
use video::ChunkGeometry;

/// Names the VAE in errors about the caller's clips.
const INPUT: &str = "MiniMax-H3 video VAE";

fn bad_input(key: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: INPUT.into(),
        reason,
    }
}

/// ImageNet statistics of image channel `c`; channels past RGB pass through unchanged
/// ([−1, 1] ↔ mean 0.5, std 0.5).
fn pixel_stats(c: usize) -> (f32, f32) {
    (
        PIXEL_MEAN.get(c).copied().unwrap_or(0.5),
        PIXEL_STD.get(c).copied().unwrap_or(0.5),
    )
}

/// Maps every channel plane of a clip [W, H, F, C] in place.
fn map_channels(v: &mut HostTensor, f: impl Fn(f32, usize) -> f32) {
    let plane = v.ne[0] * v.ne[1] * v.ne[2];
    for (c, chunk) in v.data.chunks_mut(plane.max(1)).enumerate() {
        for x in chunk {
            *x = f(*x, c);
        }
    }
}

/// Video latent [w, h, T, C] (ggml order) of the VAE → the transformer's, in place:
/// `(z − latents_mean) / latents_std` per channel (diffusers `encode_vae_condition`).
pub fn normalize_video_latent(stats: &LatentStats, z: &mut HostTensor) -> Result<(), RunnerError> {
    per_channel(z, |v| stats.normalize(v))
}

/// The transformer's video latent [w, h, T, C] → the VAE's, in place:
/// `x · latents_std + latents_mean` per channel (diffusers `MiniMaxH3VideoDecodeStep`).
pub fn denormalize_video_latent(
    stats: &LatentStats,
    x: &mut HostTensor,
) -> Result<(), RunnerError> {
    per_channel(x, |v| stats.denormalize(v))
}

/// Runs an image-layout ([w, h, C, N]) statistics map over a video latent [w, h, T, C], seen
/// as one image whose pixels are the voxels of a channel.
fn per_channel(
    z: &mut HostTensor,
    f: impl FnOnce(&mut HostTensor) -> Result<(), RunnerError>,
) -> Result<(), RunnerError> {
    let ne = z.ne;
    z.ne = [ne[0] * ne[1] * ne[2], 1, ne[3], 1];
    let result = f(z);
    z.ne = ne;
    result
}

/// A MiniMax-H3 video VAE with its encoder and/or decoder.
#[derive(Clone, Debug)]
pub struct MiniMaxH3Vae {
    config: MiniMaxH3VaeConfig,
    encoder: Option<Encoder>,
    decoder: Option<Decoder>,
    geo: ChunkGeometry,
}

impl MiniMaxH3Vae {
    /// Declares the weights of the parts `config` asks for.
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: MiniMaxH3VaeConfig,
    ) -> Result<Self, RunnerError> {
        if !(config.encoder || config.decoder) {
            return Err(bad_input(
                "config",
                "neither the encoder nor the decoder was asked for".into(),
            ));
        }
        let encoder = if config.encoder {
            Some(Encoder::new(wb, &config)?)
        } else {
            None
        };
        let decoder = if config.decoder {
            Some(Decoder::new(wb, &config)?)
        } else {
            None
        };
        // A decoder-only file carries the mask token it never reads; nothing loads it.
        Ok(Self {
            geo: ChunkGeometry::new(&config),
            config,
            encoder,
            decoder,
        })
    }

    pub fn config(&self) -> &MiniMaxH3VaeConfig {
        &self.config
    }

    /// Pixels per latent pixel along each axis (16).
    pub fn scale_factor(&self) -> usize {
        self.config.scale_factor()
    }

    /// Pixel frames per latent frame inside a clip (4).
    pub fn temporal_factor(&self) -> usize {
        self.config.temporal_factor()
    }

    /// The latent statistics, when known (see [`MiniMaxH3VaeConfig::latent_stats`]).
    pub fn latent_stats(&self) -> Option<&LatentStats> {
        self.config.latent_stats.as_ref()
    }

    pub fn has_encoder(&self) -> bool {
        self.encoder.is_some()
    }

    pub fn has_decoder(&self) -> bool {
        self.decoder.is_some()
    }

    /// Pixel frames [`decode_video`](Self::decode_video) makes of `latent_frames` (≥ 1):
    /// `17n + 5` for `5n + 2` (upstream cuts other counts down to that form), 1 for 1.
    pub fn video_frames(&self, latent_frames: usize) -> usize {
        self.geo.video_frames(latent_frames)
    }

    /// Latent frames [`encode_video`](Self::encode_video) makes of `frames` (≥ 1): the video
    /// is padded to whole 17-frame clips, then 3 latent frames are dropped (1 for 1 frame).
    pub fn latent_frames(&self, frames: usize) -> usize {
        if frames <= 1 {
            return frames;
        }
        let per_clip = self
            .config
            .temporal_factors
            .iter()
            .fold(self.geo.clip_length, |n, &s| (n - 1) / s + 1);
        let clips = frames.div_ceil(self.geo.clip_length);
        (clips * per_clip)
            .saturating_sub(self.geo.token_drop)
            .max(1)
    }

    /// Checks that `width × height` frames can be encoded: positive multiples of the scale
    /// factor (the strided convs round odd sizes up, the decoder could not give them back).
    pub fn check_encode_size(&self, width: usize, height: usize) -> Result<(), RunnerError> {
        super::check_multiple_of(width, height, self.scale_factor(), "MiniMax-H3 VAE encode")
    }

    fn decoder(&self) -> Result<&Decoder, RunnerError> {
        self.decoder
            .as_ref()
            .ok_or_else(|| bad_input("decoder", "the VAE was loaded without its decoder".into()))
    }

    fn encoder(&self) -> Result<&Encoder, RunnerError> {
        self.encoder
            .as_ref()
            .ok_or_else(|| bad_input("encoder", "the VAE was loaded without its encoder".into()))
    }

    /// Decodes a raw latent z [w, h, T, latent] (ggml order, PyTorch `[latent, T, h, w]`) to
    /// pixels [16w, 16h, F, 3] in the ImageNet-normalised space, unclamped (diffusers
    /// `vae.decode` with tiling off, for `T = 5n + 2`), F = [`video_frames`](Self::video_frames).
    /// One graph per chunk on `runner` (which holds this VAE's weights).
    pub fn decode_video_raw(
        &self,
        runner: &Runner,
        z: &HostTensor,
    ) -> Result<HostTensor, RunnerError> {
        self.decode_mapped(runner, z, |_| {})
    }

    /// [`decode_video_raw`](Self::decode_video_raw) with every chunk mapped to RGB, clamped to
    /// [0, 1] and given as [−1, 1] before the chunks are blended (upstream's order).
    pub fn decode_video(&self, runner: &Runner, z: &HostTensor) -> Result<HostTensor, RunnerError> {
        self.decode_mapped(runner, z, |v| {
            map_channels(v, |x, c| {
                let (mean, std) = pixel_stats(c);
                (x * std + mean).clamp(0.0, 1.0) * 2.0 - 1.0
            })
        })
    }

    fn decode_mapped(
        &self,
        runner: &Runner,
        z: &HostTensor,
        map: impl Fn(&mut HostTensor),
    ) -> Result<HostTensor, RunnerError> {
        let decoder = self.decoder()?;
        check_latent(z, self.config.latent_channels, INPUT)?;
        video::decode_chunks(&self.geo, z, |chunk| {
            let data = chunk.data.clone();
            let mut out = runner.compute_one(|g| -> Result<_, RunnerError> {
                Ok(decoder.forward(g, g.input_f32("minimax_h3_vae.z", chunk.ne, data)))
            })?;
            map(&mut out);
            Ok(out)
        })
    }

    /// Encodes frames x [W, H, F, 3] (ggml order, PyTorch `[3, F, H, W]`) in the
    /// ImageNet-normalised space to the raw posterior mean [W/16, H/16, T, latent]
    /// (diffusers `vae.encode(x).latent_dist.mode()` with tiling off), T =
    /// [`latent_frames`](Self::latent_frames)(F). One graph per 17-frame clip on `runner`.
    pub fn encode_video_raw(
        &self,
        runner: &Runner,
        x: &HostTensor,
    ) -> Result<HostTensor, RunnerError> {
        let encoder = self.encoder()?;
        check_frames(x, self.config.in_channels, INPUT)?;
        let [w, h, frames, _] = x.ne;
        if frames == 0 {
            return Err(bad_input("frames", "an empty video".into()));
        }
        self.check_encode_size(w, h)?;
        video::encode_clips(&self.geo, x, |ne, data| {
            runner.compute_one(|g| -> Result<_, RunnerError> {
                Ok(encoder.forward(g, g.input_f32("minimax_h3_vae.x", *ne, data)))
            })
        })
    }

    /// [`encode_video_raw`](Self::encode_video_raw) of frames given in [−1, 1].
    pub fn encode_video(&self, runner: &Runner, x: &HostTensor) -> Result<HostTensor, RunnerError> {
        let mut x = x.clone();
        map_channels(&mut x, |v, c| {
            let (mean, std) = pixel_stats(c);
            ((v + 1.0) * 0.5 - mean) / std
        });
        self.encode_video_raw(runner, &x)
    }

    /// Per-channel constants [1, 1, C, 1] as a graph input.
    fn channel_input<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        name: &str,
        c: usize,
        f: impl Fn(usize) -> f32,
    ) -> Tensor<'g> {
        g.input_f32(name, [1, 1, c, 1], (0..c).map(f).collect())
    }
}

/// One image per batch item, each as a one-frame clip.
fn per_item<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    f: impl Fn(Tensor<'g>) -> Tensor<'g>,
) -> Tensor<'g> {
    let [w, h, c, n] = x.ne();
    let nb = x.nb();
    (0..n)
        .map(|i| f(g.view(x, [w, h, c, 1], [nb[1], nb[2], nb[3]], i * nb[3])))
        .reduce(|a, b| g.concat(a, b, 3))
        .expect("a batch of at least one image")
}

impl crate::models::vae::Vae for MiniMaxH3Vae {
    fn scale_factor(&self) -> usize {
        self.config.scale_factor()
    }

    fn has_encoder(&self) -> bool {
        self.encoder.is_some()
    }

    fn has_decoder(&self) -> bool {
        self.decoder.is_some()
    }

    fn image_channels(&self) -> usize {
        self.config.in_channels
    }

    fn check_encode_size(&self, width: usize, height: usize) -> Result<(), RunnerError> {
        MiniMaxH3Vae::check_encode_size(self, width, height)
    }

    /// A latent image [w, h, C, N] as N one-frame latents, each the last of its decoded
    /// frames (upstream), in [−1, 1].
    fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let decoder = self
            .decoder
            .as_ref()
            .expect("MiniMaxH3Vae::decode without a decoder (check has_decoder)");
        let c = self.config.out_channels;
        let mean = self.channel_input(g, "minimax_h3_vae.pixel_mean", c, |i| pixel_stats(i).0);
        let std = self.channel_input(g, "minimax_h3_vae.pixel_std", c, |i| pixel_stats(i).1);
        per_item(g, z, |zi| {
            let [w, h, zc, _] = zi.ne();
            let frames = decoder.forward(g, g.reshape(g.cont(zi), [w, h, 1, zc]));
            let [fw, fh, f, _] = frames.ne();
            let nb = frames.nb();
            let last = g.view(
                frames,
                [fw, fh, 1, c],
                [nb[1], nb[2], nb[3]],
                (f - 1) * nb[2],
            );
            let rgb = g.add(g.mul(g.reshape(g.cont(last), [fw, fh, c, 1]), std), mean);
            g.scale_bias(g.clamp(rgb, 0.0, 1.0), 2.0, -1.0)
        })
    }

    /// An image [W, H, C, N] in [−1, 1] as N one-frame videos → means [W/16, H/16, z, N].
    fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let encoder = self
            .encoder
            .as_ref()
            .expect("MiniMaxH3Vae::encode_mean without an encoder (check has_encoder)");
        let c = self.config.in_channels;
        let mean = self.channel_input(g, "minimax_h3_vae.pixel_mean", c, |i| pixel_stats(i).0);
        let inv_std = self.channel_input(g, "minimax_h3_vae.pixel_inv_std", c, |i| {
            1.0 / pixel_stats(i).1
        });
        per_item(g, x, |xi| {
            let unit = g.scale_bias(g.cont(xi), 0.5, 0.5);
            encoder.forward(g, g.mul(g.sub(unit, mean), inv_std))
        })
    }

    fn decode_video(
        &self,
        runner: &Runner,
        z: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        Some(MiniMaxH3Vae::decode_video(self, runner, z))
    }

    fn encode_video(
        &self,
        runner: &Runner,
        x: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        Some(MiniMaxH3Vae::encode_video(self, runner, x))
    }
}
