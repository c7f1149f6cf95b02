//! The Wan 2.2 VAE (diffusers `AutoencoderKLWan` with `is_residual=True`, `patch_size=2`; the
//! original `Wan2.2_VAE.pth`), for single images and videos.
//!
//! A causal-3D residual autoencoder: RGB pixels are patchified 2×2 into 12 channels, four
//! levels halve the resolution three times (16× spatial compression in all) and, in two of
//! them, the frame rate (4× temporal), to a 48-channel latent. Its blocks are the Qwen Image 2.1
//! VAE's (`qwen_image_2_1_vae`): the channel RMS norm, resnets with causal 3×3×3 convs, the
//! single-head middle attention, and around every level the parameter-free shortcuts
//! (`AvgDown3D` folding frames and 2×2 pixels into averaged channel groups, `DupUp3D`
//! duplicating them back), whose temporal factor shapes even a single frame's result. Unlike
//! Wan 2.1 the decoder's upsamplers keep the width. Kernels may be stored as causal Conv3d
//! weights folded to `[K, K, T, I·O]` or as plain 2D kernels. The configuration is read from
//! the weight names and shapes; both checkpoint layouts load (see [`Wan22VaeLayout`]).
//!
//! Latent normalisation is the caller's: the transformer works on `(z − mean) / std`
//! ([`LatentStats::normalize`]; the statistics come from the model's `config.json` when there
//! is one, [`LatentStats::from_diffusers_config`], else [`Wan22Vae::latent_stats`]).
//! [`Wan22Vae::decode`] takes the raw latent and returns the image clamped to [−1, 1] after the
//! unpatchify (diffusers `_decode`); [`Wan22Vae::encode`] takes an image in [−1, 1] and returns
//! the raw posterior mean.
//!
//! Video: [`Wan22Vae::decode_video`] (latent [w, h, T, z] → frames [16w, 16h, 1 + 4(T − 1), 3])
//! and [`Wan22Vae::encode_video`] (frames [W, H, 1 + 4k, 3] → mean [W/16, H/16, 1 + k, z]) run
//! chunk by chunk as diffusers' `_decode` / `_encode` do, carrying each causal conv's history
//! between chunks in the runner's named cache (the Wan 2.1 VAE's machinery, `wan_vae::video`):
//! - encode: the first frame alone, then four frames per chunk, each giving one latent frame;
//!   a `downsample3d` passes the first chunk through and later convolves (stride 2) the
//!   previous chunk's last frame with the current ones; `AvgDown3D` pads zero frames in front
//!   up to a multiple of its temporal factor (one zero frame on the first chunk);
//! - decode: one latent frame per chunk; on the first (`first_chunk`) the `upsample3d` time
//!   convs only start their history and `DupUp3D` keeps only the last of its two frames, so it
//!   gives one frame; every later chunk gives four.
//!
//! A single image is the first chunk of a one-frame video: [`Wan22Vae::decode`] /
//! [`Wan22Vae::encode`] run it as 2D convs with each kernel's last temporal tap (the earlier
//! taps meet only causal zero padding) and give exactly the video path's result on one frame.
//!
//! Where stable-diffusion.cpp (`WAN::WanVAE` with `wan2_2`, the spec here) and diffusers differ:
//! - names: upstream reads only the original layout (its diffusers renaming covers the Wan 2.1
//!   layout only); both load here;
//! - 2-D checkpoints: upstream treats a file whose decoder `conv1` kernel is plain 2-D as an
//!   image VAE with every temporal factor off (the shortcuts then fold no frames), and runs
//!   video through it frame-wise ("expect poor results"); here such a file gets the same
//!   factors, so images match upstream, and video is refused;
//! - upstream computes a whole clip in one graph with the same chunk schedule; here each chunk
//!   is a graph of its own, so memory is bounded by one chunk;
//! - frame counts that are not 1 + 4k are silently truncated by both; here they are an error;
//! - the clamp to [−1, 1]: diffusers' `_decode`, upstream when converting to pixels; same
//!   pixels either way;
//! - the channel norm adds 1e-24 to the mean square (diffusers divides by max(‖x‖, 1e-12),
//!   upstream adds 1e-12): only an all-zero pixel can tell.

mod coder;
mod layout;
mod patch;
mod video;

pub use super::qwen_image_2_1_vae::LatentStats;
pub use super::wan_vae::ENCODE_CHUNK_FRAMES;
pub use layout::Wan22VaeLayout;

use crate::ggml::Tensor;
use crate::models::vae::qwen_image_2_1_vae::blocks::{conv_shape, Conv};
use crate::models::vae::qwen_image_2_1_vae::detect_shape;
use crate::models::vae::qwen_image_2_1_vae::layout::Part;
use crate::models::vae::wan_vae::posterior_mean;
use crate::runner::{GraphCtx, Runner, RunnerError, WeightBuilder};
use crate::tensor::HostTensor;

use coder::{Decoder, Encoder};
use patch::{patchify, unpatchify};

/// Per-channel latent mean of the released Wan 2.2 VAE (48 channels): `latents_mean` of the
/// diffusers Wan2.2-TI2V-5B `vae/config.json` (also Wan's `Wan2_2_VAE` and
/// stable-diffusion.cpp's `get_latents_mean_std`).
pub const LATENTS_MEAN: [f32; 48] = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, //
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825, //
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502, //
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, //
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, //
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
];

/// Per-channel latent standard deviation of the released Wan 2.2 VAE: `latents_std` of the
/// diffusers Wan2.2-TI2V-5B `vae/config.json`.
pub const LATENTS_STD: [f32; 48] = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, //
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978, //
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659, //
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, //
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887, //
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
];

/// Latent channels of the released model, whose statistics are built in.
const RELEASED_Z_DIM: usize = 48;

/// Pixel patch size: fixed at 2 for the Wan 2.2 VAE (diffusers `patch_size`, upstream's
/// `patch_size` for `wan2_2`); the weights cannot tell it.
const PATCH: usize = 2;

/// Pixel channels assumed when the encoder (decoder) is absent: RGB.
const IMAGE_CHANNELS: usize = 3;

const ORIGIN: &str = "Wan 2.2 VAE weights";

fn bad_config(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: ORIGIN.into(),
        reason,
    }
}

/// Shape of a Wan 2.2 VAE, detected from its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Wan22VaeConfig {
    pub layout: Wan22VaeLayout,
    /// Channels the encoder's first conv takes: image channels × patch² (12).
    pub in_channels: usize,
    /// Channels the decoder's last conv makes: image channels × patch² (12).
    pub out_channels: usize,
    /// Pixel patch side (2; see [`Wan22VaeConfig::image_channels`]).
    pub patch_size: usize,
    /// Latent channels (48).
    pub z_dim: usize,
    /// Encoder widths: `conv_in`'s output, then each level's output (released: 160, 160, 320,
    /// 640, 640).
    pub encoder_channels: Vec<usize>,
    /// Decoder widths: `conv_in`'s output (the middle block), then each level's output
    /// (released: 1024, 1024, 1024, 512, 256).
    pub decoder_channels: Vec<usize>,
    /// Resnets per encoder level (decoder levels have one more; released: 2).
    pub res_blocks: usize,
    /// Per encoder level: whether it halves the frame rate (its shortcut folds two frames;
    /// released: F, T, T, F).
    pub temporal_down: Vec<bool>,
    /// Per decoder level: whether it doubles the frame rate (released: T, T, F, F).
    pub temporal_up: Vec<bool>,
    /// Build the encoder (detected: its weights are present; clear it to skip loading them).
    pub encoder: bool,
    /// Build the decoder (detected: its weights are present; clear it to skip loading them).
    pub decoder: bool,
    /// Latent statistics: the released ones ([`LATENTS_MEAN`], [`LATENTS_STD`]) when `z_dim`
    /// is 48, else `None`. A `config.json` beside the weights takes precedence (read it with
    /// [`LatentStats::from_diffusers_config`]).
    pub latent_stats: Option<LatentStats>,
    /// Load the temporal weights (`time_conv`) and check the kernels are whole causal 3-D
    /// ones, for [`Wan22Vae::decode_video`] / [`Wan22Vae::encode_video`] (detected: false;
    /// image users skip those weights).
    pub video: bool,
}

impl Wan22VaeConfig {
    /// Reads the configuration from the weight names and shapes under `wb`.
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let layout = detect_layout(wb).ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key("decoder.conv_in.weight"),
            origin: "VAE weights (no Wan 2.2 VAE encoder or decoder found)".into(),
        })?;
        let shape = detect_shape(wb, layout.qwen(), ORIGIN, IMAGE_CHANNELS * PATCH * PATCH)?;
        let mut config = Self {
            layout,
            in_channels: shape.in_channels,
            out_channels: shape.out_channels,
            patch_size: PATCH,
            z_dim: shape.z_dim,
            encoder_channels: shape.encoder_channels,
            decoder_channels: shape.decoder_channels,
            res_blocks: shape.res_blocks,
            temporal_down: shape.temporal_down,
            temporal_up: shape.temporal_up,
            encoder: shape.encoder,
            decoder: shape.decoder,
            latent_stats: None,
            video: false,
        };
        // Upstream's 2-D checkpoints: a plain 2D first decoder (else encoder) kernel switches
        // every temporal factor off.
        let part = if config.decoder {
            Part::Decoder
        } else {
            Part::Encoder
        };
        let conv_in = layout.names(config.res_blocks).conv_in(part);
        if conv_shape(&wb.pp(conv_in)).is_some_and(|(_, _, frames)| frames == 0) {
            config.temporal_down.fill(false);
            config.temporal_up.fill(false);
        }
        if config.z_dim == RELEASED_Z_DIM {
            config.latent_stats = Some(LatentStats::new(
                LATENTS_MEAN.to_vec(),
                LATENTS_STD.to_vec(),
            )?);
        }
        log::debug!(
            "Wan 2.2 VAE: {:?} layout, encoder {:?}, decoder {:?}, {} resnets/level, z {}, \
             temporal down {:?} up {:?}",
            config.layout,
            config.encoder_channels,
            config.decoder_channels,
            config.res_blocks,
            config.z_dim,
            config.temporal_down,
            config.temporal_up
        );
        Ok(config)
    }

    /// Resolution levels (the released model has 4).
    fn levels(&self) -> usize {
        self.encoder_channels
            .len()
            .max(self.decoder_channels.len())
            .saturating_sub(1)
    }

    /// Pixels per latent pixel along each axis: patch · 2^(levels − 1) (16).
    pub fn scale_factor(&self) -> usize {
        self.patch_size.max(1) << self.levels().saturating_sub(1)
    }

    /// Pixel channels of the images (3: RGB): the encoder's input channels over patch².
    pub fn image_channels(&self) -> usize {
        let c = if self.encoder {
            self.in_channels
        } else {
            self.out_channels
        };
        c / (self.patch_size * self.patch_size).max(1)
    }
}

/// The layout whose names are present, if either. Both spellings differ from Wan 2.1's: its
/// diffusers encoder list is flat and its decoder resamplers are `upsamplers.0`; its original
/// lists are flat (`encoder.downsamples.K.residual`).
fn detect_layout(wb: &WeightBuilder<'_, '_>) -> Option<Wan22VaeLayout> {
    [Wan22VaeLayout::Diffusers, Wan22VaeLayout::Original]
        .into_iter()
        .find(|&layout| {
            let names = layout.names(0);
            let conv1 = names.resnet_leaves().conv1;
            let encoder = format!("{}.{conv1}.weight", names.down_resnet(0, 0));
            let decoder = match layout {
                Wan22VaeLayout::Diffusers => format!("{}.resample.1.weight", names.upsampler(0)),
                Wan22VaeLayout::Original => format!("{}.{conv1}.weight", names.up_resnet(0, 0)),
            };
            wb.contains(&encoder) || wb.contains(&decoder)
        })
}

/// A Wan 2.2 VAE with its encoder and/or decoder.
#[derive(Clone, Debug)]
pub struct Wan22Vae {
    config: Wan22VaeConfig,
    encoder: Option<(Encoder, Conv)>,
    decoder: Option<(Conv, Decoder)>,
}

impl Wan22Vae {
    /// Declares the weights of the parts `config` asks for.
    pub fn new(wb: &WeightBuilder<'_, '_>, config: Wan22VaeConfig) -> Result<Self, RunnerError> {
        check_config(wb, &config)?;
        let names = config.layout.names(config.res_blocks);
        let z2 = 2 * config.z_dim;
        let encoder = if config.encoder {
            let encoder = Encoder::new(&names, wb, &config)?;
            if config.video {
                video::check_encoder(wb, &names, &encoder)?;
            }
            Some((
                encoder,
                Conv::new(&wb.pp(names.quant_conv()), z2, z2, 1, 1, 0)?,
            ))
        } else {
            None
        };
        let decoder = if config.decoder {
            let z = config.z_dim;
            let decoder = Decoder::new(&names, wb, &config)?;
            if config.video {
                video::check_decoder(wb, &names, &decoder)?;
            }
            Some((
                Conv::new(&wb.pp(names.post_quant_conv()), z, z, 1, 1, 0)?,
                decoder,
            ))
        } else {
            None
        };
        Ok(Self {
            config,
            encoder,
            decoder,
        })
    }

    pub fn config(&self) -> &Wan22VaeConfig {
        &self.config
    }

    /// Pixels per latent pixel along each axis (16).
    pub fn scale_factor(&self) -> usize {
        self.config.scale_factor()
    }

    /// The built-in latent statistics, when known (see [`Wan22VaeConfig::latent_stats`]).
    pub fn latent_stats(&self) -> Option<&LatentStats> {
        self.config.latent_stats.as_ref()
    }

    pub fn has_encoder(&self) -> bool {
        self.encoder.is_some()
    }

    pub fn has_decoder(&self) -> bool {
        self.decoder.is_some()
    }

    /// Checks that an image of `width × height` pixels can be encoded: both must be positive
    /// multiples of [`scale_factor`](Self::scale_factor) (16; the patch and every level fold
    /// 2×2 blocks). Pad or crop before encoding otherwise.
    pub fn check_encode_size(&self, width: usize, height: usize) -> Result<(), RunnerError> {
        super::check_multiple_of(width, height, self.scale_factor(), "Wan 2.2 VAE encode")
    }

    /// Decodes the raw latent z: [w, h, z_dim, N] (already `x · std + mean`) to the image
    /// [f·w, f·h, 3, N], clamped to [-1, 1] as diffusers does. Each of the N latents is one
    /// frame (the first chunk of a video: see the module docs).
    ///
    /// # Panics
    /// When the decoder was not built (`config.decoder` false); check [`has_decoder`](Self::has_decoder).
    pub fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let (post_quant, decoder) = self
            .decoder
            .as_ref()
            .expect("Wan22Vae::decode without a decoder (check has_decoder)");
        let y = decoder.forward(g, post_quant.forward(g, z));
        g.clamp(unpatchify(g, y, self.config.patch_size), -1.0, 1.0)
    }

    /// Encodes x: [W, H, 3, N] with values in [-1, 1] (W, H multiples of the scale factor, see
    /// [`check_encode_size`](Self::check_encode_size)) to the posterior mean
    /// [W/f, H/f, z_dim, N] (raw latent; normalise it with [`LatentStats::normalize`]).
    ///
    /// # Panics
    /// When the encoder was not built (`config.encoder` false); check [`has_encoder`](Self::has_encoder).
    pub fn encode<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (encoder, quant) = self
            .encoder
            .as_ref()
            .expect("Wan22Vae::encode without an encoder (check has_encoder)");
        let x = patchify(g, x, self.config.patch_size);
        posterior_mean(
            g,
            quant.forward(g, encoder.forward(g, x)),
            self.config.z_dim,
        )
    }
}

/// Refuses configurations the stacks cannot be built from.
fn check_config(wb: &WeightBuilder<'_, '_>, config: &Wan22VaeConfig) -> Result<(), RunnerError> {
    let levels = config.levels();
    let part_ok = |dims: &[usize], channels: usize, on: bool| {
        let p2 = config.patch_size * config.patch_size;
        !on || (dims.len() == levels + 1 && channels > 0 && channels.is_multiple_of(p2))
    };
    let widths_ok = config
        .encoder_channels
        .iter()
        .chain(&config.decoder_channels)
        .all(|&c| c > 0);
    let ok = levels > 0
        && config.patch_size > 0
        && config.res_blocks > 0
        && config.z_dim > 0
        && widths_ok
        && (config.encoder || config.decoder)
        && config.temporal_down.len() == levels
        && config.temporal_up.len() == levels
        && part_ok(&config.encoder_channels, config.in_channels, config.encoder)
        && part_ok(
            &config.decoder_channels,
            config.out_channels,
            config.decoder,
        );
    if ok {
        return Ok(());
    }
    Err(bad_config(
        wb.key("decoder"),
        format!(
            "inconsistent Wan 2.2 VAE configuration (levels {levels}, encoder widths {:?}, \
             decoder widths {:?}, channels {} / {} with patch {}, temporal flags {:?} / {:?})",
            config.encoder_channels,
            config.decoder_channels,
            config.in_channels,
            config.out_channels,
            config.patch_size,
            config.temporal_down,
            config.temporal_up
        ),
    ))
}

impl crate::models::vae::Vae for Wan22Vae {
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
        self.config.image_channels()
    }

    fn check_encode_size(&self, width: usize, height: usize) -> Result<(), RunnerError> {
        Wan22Vae::check_encode_size(self, width, height)
    }

    fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        Wan22Vae::decode(self, g, z)
    }

    fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.encode(g, x)
    }

    fn decode_video(
        &self,
        runner: &Runner,
        z: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        Some(Wan22Vae::decode_video(self, runner, z))
    }

    fn encode_video(
        &self,
        runner: &Runner,
        x: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        Some(Wan22Vae::encode_video(self, runner, x))
    }
}
