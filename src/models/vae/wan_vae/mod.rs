//! The Wan 2.1 VAE, which is also the Qwen Image VAE (diffusers `AutoencoderKLQwenImage`,
//! `AutoencoderKLWan`), for single images and, when loaded with [`WanVaeConfig::video`], videos.
//!
//! A causal-3D residual autoencoder: 8× spatial compression over four levels, RGB in and out, a
//! 16-channel latent. Every resnet uses the channel RMS norm `F.normalize(x, dim=C)·√C·γ` and
//! SiLU; the middle block is resnet → single-head attention → resnet. Encoder levels end in a
//! zero-pad + stride-2 conv, decoder levels in nearest 2× + a conv to half the width. Unlike
//! the Qwen Image 2.1 VAE there are no parameter-free shortcuts, and on a single frame the
//! temporal `time_conv` weights never act (they are loaded only for video).
//!
//! The building blocks are the Qwen Image 2.1 VAE's (`qwen_image_2_1_vae::blocks`): kernels may
//! be plain 2D or causal 3D kernels folded to `[K, K, T, I·O]`, of which a single frame only
//! meets the last temporal slice. Both checkpoint layouts load (see [`WanVaeLayout`]); the
//! configuration is read from the weight names and shapes.
//!
//! Latent normalisation is the caller's: the transformer works on `(z − mean) / std`
//! ([`LatentStats::normalize`]); [`WanVae::decode`] takes the raw latent `x · std + mean` and
//! returns the decoder output clamped to [-1, 1] (diffusers `_decode`); [`WanVae::encode`]
//! takes an image in [-1, 1] and returns the raw posterior mean.
//!
//! Video: [`WanVae::decode_video`] (latent [w, h, T, z] → frames [W, H, 1 + 4(T − 1), 3]) and
//! [`WanVae::encode_video`] (frames [W, H, 1 + 4k, 3] → mean [w, h, 1 + k, z]) run chunk by
//! chunk on a [`Runner`](crate::runner::Runner), carrying each causal conv's history between
//! chunks in the runner's named cache (see `video`).

mod coder;
mod detect;
mod layout;
pub(crate) mod video;

pub use super::qwen_image_2_1_vae::LatentStats;
pub use layout::WanVaeLayout;
pub use video::ENCODE_CHUNK_FRAMES;

use crate::ggml::Tensor;
use crate::models::vae::qwen_image_2_1_vae::blocks::Conv;
use crate::models::vae::qwen_image_2_1_vae::layout::Part;
use crate::runner::{GraphCtx, Runner, RunnerError, WeightBuilder};
use crate::tensor::HostTensor;

use coder::{Decoder, Encoder};
use detect::{detect_layout, Detector};
use layout::WanNames;

/// Per-channel latent mean of the released Wan 2.1 / Qwen Image VAE (16 channels).
pub const LATENTS_MEAN: [f32; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, //
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];

/// Per-channel latent standard deviation of the released Wan 2.1 / Qwen Image VAE.
pub const LATENTS_STD: [f32; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, //
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
];

/// Latent channels of the released model, whose statistics are built in.
const RELEASED_Z_DIM: usize = 16;

/// Shape of a Wan 2.1 VAE, detected from its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct WanVaeConfig {
    pub layout: WanVaeLayout,
    /// Image channels the encoder takes (3: RGB).
    pub in_channels: usize,
    /// Image channels the decoder produces (3: RGB).
    pub out_channels: usize,
    /// Latent channels (16).
    pub z_dim: usize,
    /// Encoder widths: `conv_in`'s output, then each level's output (released: 96, 96, 192,
    /// 384, 384).
    pub encoder_channels: Vec<usize>,
    /// Decoder widths: `conv_in`'s output (the middle block), then each level's output
    /// (released: 384, 384, 384, 192, 96). Level i > 0 starts from half of level i − 1's output
    /// (its upsampler halves the width).
    pub decoder_channels: Vec<usize>,
    /// Resnets per encoder level (decoder levels have one more; released: 2).
    pub res_blocks: usize,
    /// Build the encoder (detected: its weights are present; clear it to skip loading them).
    pub encoder: bool,
    /// Build the decoder (detected: its weights are present; clear it to skip loading them).
    pub decoder: bool,
    /// Latent statistics: the released ones when `z_dim` is 16, else `None` (read them from the
    /// model's `config.json` with [`LatentStats::from_diffusers_config`]).
    pub latent_stats: Option<LatentStats>,
    /// Load the temporal weights (`time_conv`) and check the kernels are whole causal 3-D ones,
    /// for [`WanVae::decode_video`] / [`WanVae::encode_video`] (detected: false; image users
    /// skip those weights).
    pub video: bool,
}

fn bad_config(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: "Wan 2.1 VAE weights".into(),
        reason,
    }
}

impl WanVaeConfig {
    /// Reads the configuration from the weight names and shapes under `wb`.
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let layout = detect_layout(wb).ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key("decoder.conv_in.weight"),
            origin: "VAE weights (no Wan 2.1 VAE encoder or decoder found)".into(),
        })?;
        let raw = WanNames {
            layout,
            res_blocks: 0,
        };
        let shared = raw.shared();
        let d = Detector { wb, names: raw };
        let conv1 = shared.resnet_leaves().conv1;
        let encoder = wb.contains(&format!("{}.weight", shared.conv_in(Part::Encoder)));
        let decoder = wb.contains(&format!("{}.weight", shared.conv_in(Part::Decoder)));

        let enc = if encoder {
            Some(d.levels(&d.flat(|k| raw.down_entry(k))?, "encoder")?)
        } else {
            None
        };
        let dec = if decoder {
            let entries = match layout {
                WanVaeLayout::Diffusers => d.nested_decoder(),
                WanVaeLayout::Original => d.flat(WanNames::original_up_entry)?,
            };
            let (levels, n) = d.levels(&entries, "decoder")?;
            if n < 2 {
                return Err(bad_config(
                    wb.key("decoder"),
                    "decoder levels need at least two resnets".into(),
                ));
            }
            Some((levels, n - 1))
        } else {
            None
        };
        let (levels, res_blocks) = match (enc, dec) {
            (Some(e), Some(dd)) if e != dd => {
                return Err(bad_config(
                    wb.key("decoder"),
                    format!(
                        "encoder has {} levels of {} resnets but the decoder {} levels of {}",
                        e.0,
                        e.1,
                        dd.0,
                        dd.1 + 1
                    ),
                ));
            }
            (Some(e), _) => e,
            (None, Some(dd)) => dd,
            (None, None) => {
                return Err(RunnerError::MissingTensor {
                    key: wb.key(&format!("{}.weight", shared.conv_in(Part::Decoder))),
                    origin: "Wan 2.1 VAE weights (blocks without an encoder or decoder input conv)"
                        .into(),
                })
            }
        };
        let names = WanNames { layout, res_blocks };
        let d = Detector { wb, names };

        let mut config = Self {
            layout,
            in_channels: 3,
            out_channels: 3,
            z_dim: 0,
            encoder_channels: Vec::new(),
            decoder_channels: Vec::new(),
            res_blocks,
            encoder,
            decoder,
            latent_stats: None,
            video: false,
        };
        if encoder {
            let (in_ch, width) = d.conv(&shared.conv_in(Part::Encoder))?;
            config.in_channels = in_ch;
            config.encoder_channels.push(width);
            for i in 0..levels {
                let (_, out) = d.conv(&format!("{}.{conv1}", names.down_resnet(i, 0)))?;
                config.encoder_channels.push(out);
            }
            let (_, moments) = d.conv(&shared.conv_out(Part::Encoder))?;
            if moments % 2 != 0 {
                return Err(bad_config(
                    wb.key(&format!("{}.weight", shared.conv_out(Part::Encoder))),
                    format!("{moments} output channels; expected mean and log-variance halves"),
                ));
            }
            config.z_dim = moments / 2;
        }
        if decoder {
            let (z, width) = d.conv(&shared.conv_in(Part::Decoder))?;
            if encoder && z != config.z_dim {
                return Err(bad_config(
                    wb.key(&format!("{}.weight", shared.conv_in(Part::Decoder))),
                    format!(
                        "decoder takes {z} latent channels, the encoder makes {}",
                        config.z_dim
                    ),
                ));
            }
            config.z_dim = z;
            config.decoder_channels.push(width);
            for i in 0..levels {
                let (_, out) = d.conv(&format!("{}.{conv1}", names.up_resnet(i, 0)))?;
                config.decoder_channels.push(out);
            }
            config.out_channels = d.conv(&shared.conv_out(Part::Decoder))?.1;
        }
        if config.z_dim == RELEASED_Z_DIM {
            config.latent_stats = Some(LatentStats::new(
                LATENTS_MEAN.to_vec(),
                LATENTS_STD.to_vec(),
            )?);
        }
        log::debug!(
            "Wan 2.1 VAE: {:?} layout, encoder {:?}, decoder {:?}, {} resnets/level, z {}",
            config.layout,
            config.encoder_channels,
            config.decoder_channels,
            config.res_blocks,
            config.z_dim,
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

    /// Pixels per latent pixel along each axis: 2^(levels − 1) (8).
    pub fn scale_factor(&self) -> usize {
        1 << self.levels().saturating_sub(1)
    }
}

/// A Wan 2.1 VAE with its encoder and/or decoder.
#[derive(Clone, Debug)]
pub struct WanVae {
    config: WanVaeConfig,
    encoder: Option<(Encoder, Conv)>,
    decoder: Option<(Conv, Decoder)>,
}

impl WanVae {
    /// Declares the weights of the parts `config` asks for.
    pub fn new(wb: &WeightBuilder<'_, '_>, config: WanVaeConfig) -> Result<Self, RunnerError> {
        let levels = config.levels();
        let ok = |dims: &[usize], on: bool| !on || (dims.len() == levels + 1);
        let widths_ok = config
            .encoder_channels
            .iter()
            .chain(&config.decoder_channels)
            .all(|&c| c > 0);
        if levels == 0
            || config.res_blocks == 0
            || config.z_dim == 0
            || !widths_ok
            || !(config.encoder || config.decoder)
            || !ok(&config.encoder_channels, config.encoder)
            || !ok(&config.decoder_channels, config.decoder)
        {
            return Err(bad_config(
                wb.key("decoder"),
                "inconsistent Wan 2.1 VAE configuration (level counts or widths)".into(),
            ));
        }
        let names = WanNames {
            layout: config.layout,
            res_blocks: config.res_blocks,
        };
        let shared = names.shared();
        let z2 = 2 * config.z_dim;
        let encoder = if config.encoder {
            let encoder = Encoder::new(&names, wb, &config)?;
            if config.video {
                video::check::encoder(wb, &names, &encoder)?;
            }
            Some((
                encoder,
                Conv::new(&wb.pp(shared.quant_conv()), z2, z2, 1, 1, 0)?,
            ))
        } else {
            None
        };
        let decoder = if config.decoder {
            let z = config.z_dim;
            let decoder = Decoder::new(&names, wb, &config)?;
            if config.video {
                video::check::decoder(wb, &names, &decoder)?;
            }
            Some((
                Conv::new(&wb.pp(shared.post_quant_conv()), z, z, 1, 1, 0)?,
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

    pub fn config(&self) -> &WanVaeConfig {
        &self.config
    }

    /// Pixels per latent pixel along each axis (8).
    pub fn scale_factor(&self) -> usize {
        self.config.scale_factor()
    }

    /// The latent statistics, when known (see [`WanVaeConfig::latent_stats`]).
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
    /// multiples of [`scale_factor`](Self::scale_factor). (Each stride-2 level floors odd sizes,
    /// so other sizes would silently lose their last pixels; pad or crop first.)
    pub fn check_encode_size(&self, width: usize, height: usize) -> Result<(), RunnerError> {
        super::check_multiple_of(width, height, self.scale_factor(), "Wan 2.1 VAE encode")
    }

    /// Decodes the raw latent z: [w, h, z_dim, N] (already `x · std + mean`) to the image
    /// [f·w, f·h, C_out, N], clamped to [-1, 1] as diffusers does.
    ///
    /// # Panics
    /// When the decoder was not built (`config.decoder` false); check [`has_decoder`](Self::has_decoder).
    pub fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let (post_quant, decoder) = self
            .decoder
            .as_ref()
            .expect("WanVae::decode without a decoder (check has_decoder)");
        g.clamp(decoder.forward(g, post_quant.forward(g, z)), -1.0, 1.0)
    }

    /// Encodes x: [W, H, C_in, N] with values in [-1, 1] (W, H multiples of the scale factor,
    /// see [`check_encode_size`](Self::check_encode_size)) to the posterior mean
    /// [W/f, H/f, z_dim, N] (raw latent; normalise it with [`LatentStats::normalize`]).
    ///
    /// # Panics
    /// When the encoder was not built (`config.encoder` false); check [`has_encoder`](Self::has_encoder).
    pub fn encode<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (encoder, quant) = self
            .encoder
            .as_ref()
            .expect("WanVae::encode without an encoder (check has_encoder)");
        posterior_mean(
            g,
            quant.forward(g, encoder.forward(g, x)),
            self.config.z_dim,
        )
    }
}

/// The posterior mean of moments [W, H, 2·z, N]: the first z channels (the log-variance
/// follows).
pub(crate) fn posterior_mean<'g>(g: &'g GraphCtx<'g>, moments: Tensor<'g>, z: usize) -> Tensor<'g> {
    let [w, h, _, n] = moments.ne();
    let nb = moments.nb();
    g.cont(g.view(moments, [w, h, z, n], [nb[1], nb[2], nb[3]], 0))
}

impl crate::models::vae::Vae for WanVae {
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
        WanVae::check_encode_size(self, width, height)
    }

    fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        WanVae::decode(self, g, z)
    }

    fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.encode(g, x)
    }

    fn decode_video(
        &self,
        runner: &Runner,
        z: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        Some(WanVae::decode_video(self, runner, z))
    }

    fn encode_video(
        &self,
        runner: &Runner,
        x: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        Some(WanVae::encode_video(self, runner, x))
    }
}
