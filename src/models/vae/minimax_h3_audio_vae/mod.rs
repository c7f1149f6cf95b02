//! The MiniMax-H3 audio VAE (diffusers `AutoencoderKLMiniMaxH3Audio`, stable-diffusion.cpp
//! `MiniMaxH3::AudioVAE`): mono waveforms at 32 kHz ↔ 32-channel latents at 40 frames/s.
//!
//! * Encoder: a DAC-style strided convolution stack with Snake activations (hop 800), then
//!   `pre_block`, a causal-attention projection from the 2048-wide trunk to the latent width,
//!   and `mean_proj` (the posterior mean, which MiniMax-H3 always takes; `logs_proj` is never
//!   loaded).
//! * Decoder: `dec_in_proj` (1×1) and BigVGAN (transposed-convolution upsamplers, AMP blocks of
//!   anti-aliased SnakeBeta activations), clamped to [-1, 1].
//!
//! The model is mono: stereo travels as two sequences (PyTorch batch items), here the last
//! axis of `[T, C, S]` latents and `[samples, 1, S]` waveforms (ggml order). Every size comes
//! from the weights; heads, AMP dilations, decoder rates and the sample rate — which the
//! weights cannot show — from `config.json`, else the released values ([`config`]). Both the
//! diffusers folder and the original single file load ([`AudioVaeLayout`]).
//!
//! Entry points for a pipeline: [`MiniMaxH3AudioVae::load`] (or `detect` + `new` on a
//! [`WeightLoader`](crate::runner::WeightLoader)), then [`MiniMaxH3AudioVae::decode_latent`]
//! (normalised latent → per-channel samples) and [`MiniMaxH3AudioVae::encode_channels`]
//! (per-channel samples at [`sample_rate`](MiniMaxH3AudioVae::sample_rate) → normalised
//! latent); WAV files are read and written by [`crate::image_io::audio`].

pub mod config;
mod decoder;
mod encoder;
pub mod latent;
mod layout;
mod projection;
mod snake;

pub use config::MiniMaxH3AudioVaeConfig;
pub use layout::{AudioVaeLayout, AudioVaeSource};

use serde_json::Value;

use crate::ggml::Tensor;
use crate::models::vae::qwen_image_2_1_vae::LatentStats;
use crate::nn::Conv1d;
use crate::runner::{
    GraphCtx, LoadOptions, Loaded, Runner, RunnerError, WeightBuilder, WeightSource,
};
use crate::tensor::HostTensor;

use config::ORIGIN;
use decoder::Decoder;
use encoder::{expect_channels, Encoder};
use projection::Projection;

/// Audio channels MiniMax-H3 generates and conditions on.
pub const STEREO: usize = 2;

/// Latent frames that cover `num_frames` video frames at `fps` (diffusers
/// `audio_latent_num_frames`: `round(frames / fps · latents_per_second)`).
pub fn audio_latent_frames(num_frames: usize, fps: f64, latents_per_second: f64) -> usize {
    (num_frames as f64 / fps * latents_per_second).round() as usize
}

/// A MiniMax-H3 audio VAE with its encoder and/or decoder.
#[derive(Clone, Debug)]
pub struct MiniMaxH3AudioVae {
    config: MiniMaxH3AudioVaeConfig,
    encoder: Option<(Encoder, Projection, Conv1d)>,
    decoder: Option<(Conv1d, Decoder)>,
}

fn missing(part: &str) -> RunnerError {
    RunnerError::MissingTensor {
        key: format!("{part}.*"),
        origin: format!("{ORIGIN} (the file has no {part})"),
    }
}

impl MiniMaxH3AudioVae {
    /// Declares the weights of the parts `config` asks for (see
    /// [`MiniMaxH3AudioVaeConfig::detect`]). `wb` must read through an [`AudioVaeSource`].
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: MiniMaxH3AudioVaeConfig,
    ) -> Result<Self, RunnerError> {
        let c = &config;
        let encoder = if c.encoder {
            let wm = wb.pp("mean_proj");
            let mean = Conv1d::from_weights(&wm, ORIGIN)?;
            expect_channels(&wm, &mean, c.latent_channels, c.latent_channels)?;
            Some((Encoder::new(wb, c)?, Projection::new(wb, c)?, mean))
        } else {
            None
        };
        let decoder = if c.decoder {
            let wi = wb.pp("dec_in_proj");
            let proj = Conv1d::from_weights(&wi, ORIGIN)?;
            expect_channels(&wi, &proj, c.latent_channels, c.latent_dim)?;
            Some((proj, Decoder::new(wb, c)?))
        } else {
            None
        };
        if encoder.is_none() && decoder.is_none() {
            return Err(missing("encoder or decoder"));
        }
        Ok(Self {
            config,
            encoder,
            decoder,
        })
    }

    /// Detects the configuration from `source` (a diffusers folder's or the original file's
    /// tensors, names relative to the component) and `config_json`, and loads the parts asked
    /// for (`encoder`: also the encoder, for reference audio; the decoder is always loaded).
    pub fn load(
        name: &str,
        source: &dyn WeightSource,
        config_json: Option<&Value>,
        opts: LoadOptions,
        encoder: bool,
    ) -> Result<Loaded<Self>, RunnerError> {
        let source = AudioVaeSource::new(source);
        Runner::load(name, &source, opts, |wb| {
            let mut config = MiniMaxH3AudioVaeConfig::detect(wb, &source, config_json)?;
            if !config.decoder {
                return Err(missing("decoder"));
            }
            if encoder && !config.encoder {
                return Err(missing("encoder"));
            }
            config.encoder = encoder;
            Self::new(wb, config)
        })
    }

    pub fn config(&self) -> &MiniMaxH3AudioVaeConfig {
        &self.config
    }

    pub fn has_encoder(&self) -> bool {
        self.encoder.is_some()
    }

    pub fn has_decoder(&self) -> bool {
        self.decoder.is_some()
    }

    /// Waveform samples per second (32 000).
    pub fn sample_rate(&self) -> u32 {
        self.config.sample_rate
    }

    /// Waveform samples per latent frame (800).
    pub fn hop_length(&self) -> usize {
        self.config.hop_length()
    }

    /// Latent channels (32).
    pub fn latent_channels(&self) -> usize {
        self.config.latent_channels
    }

    pub fn latent_stats(&self) -> Option<&LatentStats> {
        self.config.latent_stats.as_ref()
    }

    /// Decodes the raw latent z `[T, C, S]` (already `x · std + mean`) to the waveforms
    /// `[T · hop, 1, S]` in [-1, 1] (diffusers `decode`).
    ///
    /// # Panics
    /// When the decoder was not built; check [`has_decoder`](Self::has_decoder).
    pub fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let (proj, decoder) = self
            .decoder
            .as_ref()
            .expect("MiniMaxH3AudioVae::decode without a decoder (check has_decoder)");
        decoder.forward(g, proj.forward(g, z))
    }

    /// Encodes waveforms x `[T, 1, S]` (T a multiple of the hop) to the raw posterior mean
    /// `[T / hop, C, S]` (diffusers `encode(..).latent_dist.mode()`).
    ///
    /// # Panics
    /// When the encoder was not built; check [`has_encoder`](Self::has_encoder).
    pub fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (encoder, projection, mean) = self
            .encoder
            .as_ref()
            .expect("MiniMaxH3AudioVae::encode_mean without an encoder (check has_encoder)");
        let h = encoder.forward(g, x);
        // [T, D, S] → tokens [D, T, S] → [C, T, S] → [T, C, S].
        let tokens = g.cont(g.permute(h, [1, 0, 2, 3]));
        let z = projection.forward(g, tokens);
        mean.forward(g, g.cont(g.permute(z, [1, 0, 2, 3])))
    }

    fn stats(&self) -> Result<&LatentStats, RunnerError> {
        self.latent_stats()
            .ok_or_else(|| RunnerError::MissingTensor {
                key: "latents_mean".into(),
                origin: format!(
                    "{ORIGIN} (no latent statistics: neither `latents_mean` / `latents_std` \
                 tensors nor config.json entries)"
                ),
            })
    }

    /// The pipeline's audio decode: a normalised latent `[T, C, S]` (transformer space, one
    /// sequence per stereo channel) → `S` channels of `T · hop` samples in [-1, 1] at
    /// [`sample_rate`](Self::sample_rate).
    pub fn decode_latent(
        &self,
        runner: &Runner,
        z: &HostTensor,
    ) -> Result<Vec<Vec<f32>>, RunnerError> {
        if !self.has_decoder() {
            return Err(missing("decoder"));
        }
        let mut raw = z.clone();
        latent::denormalize(self.stats()?, &mut raw)?;
        let [t, c, s, _] = raw.ne;
        if t == 0 || s == 0 {
            return Err(RunnerError::InputSize {
                name: "audio latent [T, C, S] with T, S > 0".into(),
                ne: raw.ne,
                got: raw.data.len(),
            });
        }
        let out = runner.compute_one(|g| -> Result<_, RunnerError> {
            let z = g.input_f32("minimax_h3_audio.z", [t, c, s, 1], raw.data);
            Ok(self.decode(g, z))
        })?;
        let n = out.ne[0];
        Ok(out.data.chunks(n.max(1)).map(<[f32]>::to_vec).collect())
    }

    /// The pipeline's reference-audio encode: `S` channels of samples at
    /// [`sample_rate`](Self::sample_rate) (equal lengths), right-padded with zeros to a
    /// multiple of the hop → the normalised posterior mean `[⌈n / hop⌉, C, S]`.
    pub fn encode_channels(
        &self,
        runner: &Runner,
        channels: &[Vec<f32>],
    ) -> Result<HostTensor, RunnerError> {
        if !self.has_encoder() {
            return Err(missing("encoder"));
        }
        let stats = self.stats()?;
        let n = channels.first().map_or(0, Vec::len);
        if n == 0 || channels.iter().any(|ch| ch.len() != n) {
            return Err(RunnerError::InputSize {
                name: "waveform channels of one non-zero length".into(),
                ne: [n, channels.len(), 1, 1],
                got: channels.iter().map(Vec::len).sum(),
            });
        }
        let hop = self.hop_length();
        let padded = n.div_ceil(hop) * hop;
        let s = channels.len();
        let mut data = Vec::with_capacity(padded * s);
        for ch in channels {
            data.extend_from_slice(ch);
            data.resize(data.len() + padded - n, 0.0);
        }
        let mut z = runner.compute_one(|g| -> Result<_, RunnerError> {
            let x = g.input_f32("minimax_h3_audio.x", [padded, 1, s, 1], data);
            Ok(self.encode_mean(g, x))
        })?;
        latent::normalize(stats, &mut z)?;
        Ok(z)
    }
}
