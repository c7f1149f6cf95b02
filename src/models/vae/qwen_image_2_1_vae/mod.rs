//! The Qwen Image 2.1 VAE (diffusers `AutoencoderKLQwenImage21`), for single images.
//!
//! A Wan-2.2-style residual autoencoder: 16× spatial compression over five levels, RGBA in and
//! out, a 64-channel latent. Every resnet uses the channel RMS norm
//! `F.normalize(x, dim=C)·√C·γ` and SiLU; each level change has a parameter-free shortcut
//! (channel averaging down, channel duplication up) whose temporal factor still shapes the
//! single-frame result (see `shortcuts`). The temporal `time_conv` weights are never used on
//! a single frame and are not loaded.
//!
//! Both checkpoint layouts load (see [`QwenVaeLayout`]); convolution kernels may be plain 2D or
//! one-frame/causal 3D kernels folded to `[K, K, T, I·O]` (only the last temporal slice acts on
//! a single frame). The configuration is read from the weight shapes.
//!
//! Latent normalisation is the caller's: the transformer works on `(z − mean) / std`
//! ([`LatentStats::normalize`]); [`QwenImage21Vae::decode`] takes the raw latent
//! `x · std + mean` ([`LatentStats::denormalize`]) and returns the raw decoder output, about
//! [-1, 1], which diffusers clamps to [-1, 1] before mapping to pixels with `x / 2 + 0.5`.
//! [`QwenImage21Vae::encode`] takes an image in [-1, 1] and returns the raw posterior mean.

pub(crate) mod blocks;
mod coder;
mod latent;
pub(crate) mod layout;
pub(crate) mod shortcuts;

pub use latent::{LatentStats, LATENTS_MEAN, LATENTS_STD};
pub use layout::QwenVaeLayout;

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use blocks::{conv_shape, Conv};
use coder::{Decoder, Encoder};
use layout::{Names, Part};

/// Deepest level count probed while detecting (the released VAE has 5).
const MAX_LEVELS: usize = 12;

/// Latent channels of the released model, whose statistics are built in.
const RELEASED_Z_DIM: usize = 64;

/// Shape of a Qwen Image 2.1 VAE, detected from its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenImage21VaeConfig {
    pub layout: QwenVaeLayout,
    /// Image channels the encoder takes (4: RGBA).
    pub in_channels: usize,
    /// Image channels the decoder produces (4: RGBA).
    pub out_channels: usize,
    /// Latent channels (64).
    pub z_dim: usize,
    /// Encoder widths: `conv_in`'s output, then each block's output (released: 96, 96, 192, 384,
    /// 768, 768).
    pub encoder_channels: Vec<usize>,
    /// Decoder widths: `conv_in`'s output (the middle block), then each block's output
    /// (released: 1152, 1152, 1152, 576, 288, 144).
    pub decoder_channels: Vec<usize>,
    /// Resnets per encoder block (decoder blocks have one more).
    pub res_blocks: usize,
    /// Per encoder block: whether its shortcut folds two frames (released: F, T, T, T, F).
    pub temporal_down: Vec<bool>,
    /// Per decoder block: whether its shortcut duplicates frames (released: T, T, T, F, F).
    pub temporal_up: Vec<bool>,
    /// Build the encoder (detected: its weights are present; clear it to skip loading them).
    pub encoder: bool,
    /// Build the decoder (detected: its weights are present; clear it to skip loading them).
    pub decoder: bool,
    /// Latent statistics: the released ones when `z_dim` is 64, else `None` (read them from the
    /// model's `config.json` with [`LatentStats::from_diffusers_config`]).
    pub latent_stats: Option<LatentStats>,
}

const ORIGIN: &str = "Qwen Image 2.1 VAE weights";

fn bad_config(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: ORIGIN.into(),
        reason,
    }
}

impl QwenImage21VaeConfig {
    /// Reads the configuration from the weight names and shapes under `wb`.
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let layout = detect_layout(wb).ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key("decoder.conv_in.weight"),
            origin: "VAE weights (no Qwen Image 2.1 VAE encoder or decoder found)".into(),
        })?;
        let mut config = detect_shape(wb, layout, ORIGIN, 4)?;
        if config.z_dim == RELEASED_Z_DIM {
            config.latent_stats = Some(LatentStats::released());
        }
        log::debug!(
            "Qwen Image 2.1 VAE: {:?} layout, encoder {:?}, decoder {:?}, {} resnets/block, \
             z {}, temporal down {:?} up {:?}",
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

    /// Pixels per latent pixel along each axis: 2^(blocks − 1) (16).
    pub fn scale_factor(&self) -> usize {
        let levels = self
            .encoder_channels
            .len()
            .max(self.decoder_channels.len())
            .saturating_sub(1);
        1 << levels.saturating_sub(1)
    }
}

/// Reads everything of a residual (Wan-2.2-style) VAE's [`QwenImage21VaeConfig`] but its
/// statistics from the weight names and shapes under `wb` in `layout`: block counts, widths,
/// channels (`channels` in and out when a part is absent) and temporal flags. `origin` names
/// the weights in errors. Shared with the Wan 2.2 VAE.
pub(crate) fn detect_shape(
    wb: &WeightBuilder<'_, '_>,
    layout: QwenVaeLayout,
    origin: &str,
    channels: usize,
) -> Result<QwenImage21VaeConfig, RunnerError> {
    let bad_config = |key: String, reason: String| RunnerError::BadData {
        key,
        origin: origin.into(),
        reason,
    };
    let raw = Names {
        layout,
        res_blocks: 0,
    };
    let conv1 = raw.resnet_leaves().conv1;
    let has_conv = |path: &str| wb.contains(&format!("{path}.weight"));
    let encoder = has_conv(&raw.conv_in(Part::Encoder));
    let decoder = has_conv(&raw.conv_in(Part::Decoder));
    let count = |f: &dyn Fn(usize) -> String| {
        (0..MAX_LEVELS)
            .take_while(|&i| has_conv(&format!("{}.{conv1}", f(i))))
            .count()
    };
    let enc_levels = count(&|i| raw.down_resnet(i, 0));
    let dec_levels = count(&|i| raw.up_resnet(i, 0));
    let enc_res = count(&|j| raw.down_resnet(0, j));
    let dec_res = count(&|j| raw.up_resnet(0, j));
    let (levels, res_blocks) = match (encoder, decoder) {
        (true, true) => {
            if enc_levels != dec_levels || enc_res + 1 != dec_res {
                return Err(bad_config(
                    wb.key("decoder"),
                    format!(
                        "encoder has {enc_levels} blocks of {enc_res} resnets but the \
                         decoder {dec_levels} blocks of {dec_res}"
                    ),
                ));
            }
            (enc_levels, enc_res)
        }
        (false, true) => (dec_levels, dec_res.saturating_sub(1)),
        _ => (enc_levels, enc_res),
    };
    if levels == 0 || res_blocks == 0 {
        return Err(bad_config(
            wb.key(if decoder { "decoder" } else { "encoder" }),
            "no residual blocks found".into(),
        ));
    }
    let names = Names { layout, res_blocks };

    let shape = |path: String| {
        conv_shape(&wb.pp(&path)).ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key(&format!("{path}.weight")),
            origin: format!("{origin} (a convolution with its bias)"),
        })
    };
    let mut config = QwenImage21VaeConfig {
        layout,
        in_channels: channels,
        out_channels: channels,
        z_dim: 0,
        encoder_channels: Vec::new(),
        decoder_channels: Vec::new(),
        res_blocks,
        temporal_down: Vec::new(),
        temporal_up: Vec::new(),
        encoder,
        decoder,
        latent_stats: None,
    };
    let time_conv = |path: String| wb.contains(&format!("{path}.time_conv.weight"));
    let mut down_found = None;
    let mut up_found = None;
    if encoder {
        let (in_ch, width, _) = shape(names.conv_in(Part::Encoder))?;
        config.in_channels = in_ch;
        config.encoder_channels.push(width);
        for i in 0..levels {
            config
                .encoder_channels
                .push(shape(format!("{}.{conv1}", names.down_resnet(i, 0)))?.1);
        }
        config.z_dim = shape(names.conv_out(Part::Encoder))?.1 / 2;
        let flags: Vec<bool> = (0..levels)
            .map(|i| i + 1 < levels && time_conv(names.downsampler(i)))
            .collect();
        down_found = flags.iter().any(|&f| f).then_some(flags);
    }
    if decoder {
        let (z, width, _) = shape(names.conv_in(Part::Decoder))?;
        if encoder && z != config.z_dim {
            return Err(bad_config(
                wb.key(&format!("{}.weight", names.conv_in(Part::Decoder))),
                format!(
                    "decoder takes {z} latent channels, the encoder makes {}",
                    config.z_dim
                ),
            ));
        }
        config.z_dim = z;
        config.decoder_channels.push(width);
        for i in 0..levels {
            config
                .decoder_channels
                .push(shape(format!("{}.{conv1}", names.up_resnet(i, 0)))?.1);
        }
        config.out_channels = shape(names.conv_out(Part::Decoder))?.1;
        let flags: Vec<bool> = (0..levels)
            .map(|i| i + 1 < levels && time_conv(names.upsampler(i)))
            .collect();
        up_found = flags.iter().any(|&f| f).then_some(flags);
    }
    let (down, up) = temporal_flags(levels, down_found, up_found);
    config.temporal_down = down;
    config.temporal_up = up;
    Ok(config)
}

/// The layout whose names are present, if either.
fn detect_layout(wb: &WeightBuilder<'_, '_>) -> Option<QwenVaeLayout> {
    let has = |k: &str| wb.contains(k);
    let diffusers = ["encoder", "decoder"]
        .iter()
        .any(|p| has(&format!("{p}.conv_in.weight")) && has(&format!("{p}.norm_out.gamma")));
    let original = has("encoder.downsamples.0.downsamples.0.residual.0.gamma")
        || has("decoder.upsamples.0.upsamples.0.residual.0.gamma");
    if diffusers {
        Some(QwenVaeLayout::Diffusers)
    } else if original {
        Some(QwenVaeLayout::Original)
    } else {
        None
    }
}

/// Temporal flags per encoder and decoder block. Each comes from the presence of the block's
/// `time_conv`; a part without any (weights stripped) mirrors the other part, or falls back to
/// the released pattern (no temporal folding in the full-resolution encoder block only).
pub(crate) fn temporal_flags(
    levels: usize,
    down: Option<Vec<bool>>,
    up: Option<Vec<bool>>,
) -> (Vec<bool>, Vec<bool>) {
    // Decoder block i mirrors encoder block levels − 2 − i; the last block of each has none.
    let mirror = |flags: &[bool]| -> Vec<bool> {
        (0..levels)
            .map(|i| i + 1 < levels && flags[levels - 2 - i])
            .collect()
    };
    match (down, up) {
        (Some(d), Some(u)) => (d, u),
        (Some(d), None) => {
            let u = mirror(&d);
            (d, u)
        }
        (None, Some(u)) => {
            let d = mirror(&u);
            (d, u)
        }
        (None, None) => {
            let d: Vec<bool> = (0..levels).map(|i| i > 0 && i + 1 < levels).collect();
            let u = mirror(&d);
            (d, u)
        }
    }
}

/// A Qwen Image 2.1 VAE with its encoder and/or decoder.
#[derive(Clone, Debug)]
pub struct QwenImage21Vae {
    config: QwenImage21VaeConfig,
    encoder: Option<(Encoder, Conv)>,
    decoder: Option<(Conv, Decoder)>,
}

impl QwenImage21Vae {
    /// Declares the weights of the parts `config` asks for.
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: QwenImage21VaeConfig,
    ) -> Result<Self, RunnerError> {
        let levels = config
            .encoder_channels
            .len()
            .max(config.decoder_channels.len());
        let ok = |dims: &[usize], flags: &[bool], on: bool| {
            !on || (dims.len() == levels && flags.len() + 1 == levels)
        };
        if levels < 2
            || config.res_blocks == 0
            || config.z_dim == 0
            || !ok(
                &config.encoder_channels,
                &config.temporal_down,
                config.encoder,
            )
            || !ok(
                &config.decoder_channels,
                &config.temporal_up,
                config.decoder,
            )
        {
            return Err(bad_config(
                wb.key("decoder"),
                "inconsistent Qwen Image 2.1 VAE configuration (block counts, widths or \
                 temporal flags)"
                    .into(),
            ));
        }
        let names = Names {
            layout: config.layout,
            res_blocks: config.res_blocks,
        };
        let z2 = 2 * config.z_dim;
        let encoder = if config.encoder {
            Some((
                Encoder::new(&names, wb, &config)?,
                Conv::new(&wb.pp(names.quant_conv()), z2, z2, 1, 1, 0)?,
            ))
        } else {
            None
        };
        let decoder = if config.decoder {
            let z = config.z_dim;
            Some((
                Conv::new(&wb.pp(names.post_quant_conv()), z, z, 1, 1, 0)?,
                Decoder::new(&names, wb, &config)?,
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

    pub fn config(&self) -> &QwenImage21VaeConfig {
        &self.config
    }

    /// Pixels per latent pixel along each axis (16).
    pub fn scale_factor(&self) -> usize {
        self.config.scale_factor()
    }

    /// The latent statistics, when known (see [`QwenImage21VaeConfig::latent_stats`]).
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
    /// multiples of [`scale_factor`](Self::scale_factor) (the shortcuts fold 2×2 blocks at
    /// every level). Pad or crop before encoding otherwise.
    pub fn check_encode_size(&self, width: usize, height: usize) -> Result<(), RunnerError> {
        super::check_multiple_of(
            width,
            height,
            self.scale_factor(),
            "Qwen Image 2.1 VAE encode",
        )
    }

    /// Decodes the raw latent z: [w, h, z_dim, N] (already `x · std + mean`) to the raw decoder
    /// output [16w, 16h, C_out, N], before diffusers' clamp to [-1, 1].
    ///
    /// # Panics
    /// When the decoder was not built (`config.decoder` false); check [`has_decoder`](Self::has_decoder).
    pub fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let (post_quant, decoder) = self
            .decoder
            .as_ref()
            .expect("QwenImage21Vae::decode without a decoder (check has_decoder)");
        decoder.forward(g, post_quant.forward(g, z))
    }

    /// Encodes x: [W, H, C_in, N] with values in [-1, 1] (W, H multiples of 16, see
    /// [`check_encode_size`](Self::check_encode_size)) to the posterior mean
    /// [W/16, H/16, z_dim, N] (raw latent; normalise it with [`LatentStats::normalize`]).
    ///
    /// # Panics
    /// When the encoder was not built (`config.encoder` false); check [`has_encoder`](Self::has_encoder).
    pub fn encode<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (encoder, quant) = self
            .encoder
            .as_ref()
            .expect("QwenImage21Vae::encode without an encoder (check has_encoder)");
        let moments = quant.forward(g, encoder.forward(g, x));
        let [w, h, _, n] = moments.ne();
        let nb = moments.nb();
        g.cont(g.view(
            moments,
            [w, h, self.config.z_dim, n],
            [nb[1], nb[2], nb[3]],
            0,
        ))
    }
}

impl crate::models::vae::Vae for QwenImage21Vae {
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
        QwenImage21Vae::check_encode_size(self, width, height)
    }

    fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        QwenImage21Vae::decode(self, g, z)
    }

    fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.encode(g, x)
    }
}
