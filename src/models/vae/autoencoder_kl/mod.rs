//! AutoencoderKL: the SD1/SDXL-style VAE (PixArt-α uses sd-vae-ft-ema, scaling factor 0.18215;
//! PixArt-Σ the SDXL VAE, 0.13025).
//!
//! Both checkpoint layouts load (see [`VaeLayout`]): diffusers names and the LDM single-file
//! names (with the `first_stage_model.` prefix already stripped by the caller's source). The
//! configuration is read from the weight shapes. Computation follows diffusers'
//! `AutoencoderKL`: GroupNorm (32 groups, eps 1e-6) and SiLU in every resnet, a single-head
//! self-attention in the mid blocks, (0,1,0,1)-padded stride-2 downsampling, nearest 2×
//! upsampling.
//!
//! The latent scaling factor and the pixel mapping are the caller's: decode
//! `z / scaling_factor` and map the output with `(x / 2 + 0.5).clamp(0, 1)`; encode an image in
//! [-1, 1] and multiply the latent by `scaling_factor`.

mod blocks;
mod decoder;
mod encoder;
mod layout;

pub use layout::VaeLayout;

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use blocks::Ctx;
use decoder::Decoder;
use encoder::Encoder;
use layout::{Names, Part};

/// Group count of every GroupNorm in the released SD/SDXL VAEs.
pub const DEFAULT_NORM_GROUPS: usize = 32;

/// Bounds diffusers clamps the posterior log-variance to.
const LOGVAR_RANGE: (f32, f32) = (-30.0, 20.0);

/// Deepest level count probed while detecting (real VAEs have 4).
const MAX_LEVELS: usize = 16;

/// Shape of an AutoencoderKL, detected from its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoencoderKlConfig {
    pub layout: VaeLayout,
    /// Image channels the encoder takes.
    pub in_channels: usize,
    /// Image channels the decoder produces.
    pub out_channels: usize,
    /// Width of each level, level 0 at full resolution (SD: 128, 256, 512, 512).
    pub block_out_channels: Vec<usize>,
    /// Resnets per encoder level (the decoder has one more per level).
    pub layers_per_block: usize,
    pub latent_channels: usize,
    /// Whether the mid blocks have their self-attention.
    pub mid_attention: bool,
    /// GroupNorm groups; not recorded in the weights, [`DEFAULT_NORM_GROUPS`] after `detect`.
    pub norm_groups: usize,
    /// Build the encoder (detected: its weights are present; clear it to skip loading them).
    pub encoder: bool,
    /// Build the decoder (detected: its weights are present; clear it to skip loading them).
    pub decoder: bool,
    /// Whether the 1×1 `quant_conv` follows the encoder.
    pub quant_conv: bool,
    /// Whether the 1×1 `post_quant_conv` precedes the decoder.
    pub post_quant_conv: bool,
}

fn bad_config(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: "VAE weights".into(),
        reason,
    }
}

impl AutoencoderKlConfig {
    /// Reads the configuration from the weight names and shapes under `wb`.
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let encoder = wb.contains("encoder.conv_in.weight");
        let decoder = wb.contains("decoder.conv_in.weight");
        let has = |layout: VaeLayout| {
            let n = Names { layout, levels: 1 };
            (encoder && wb.contains(&format!("{}.conv1.weight", n.down_resnet(0, 0))))
                || (decoder && wb.contains(&format!("{}.conv1.weight", n.up_resnet(0, 0))))
        };
        let layout = if has(VaeLayout::Diffusers) {
            VaeLayout::Diffusers
        } else if has(VaeLayout::Ldm) {
            VaeLayout::Ldm
        } else {
            let key = wb.key("decoder.conv_in.weight");
            return Err(RunnerError::MissingTensor {
                key,
                origin: "VAE weights (no AutoencoderKL encoder or decoder found)".into(),
            });
        };

        // Level and resnet counts. Decoder up-blocks are counted in diffusers' execution
        // order, which needs no level count; the channel lookup below does.
        let count = |f: &dyn Fn(usize) -> String| {
            (0..MAX_LEVELS)
                .take_while(|&i| wb.contains(&format!("{}.conv1.weight", f(i))))
                .count()
        };
        let raw = Names { layout, levels: 0 };
        let up_block = |i: usize, j: usize| match layout {
            VaeLayout::Diffusers => format!("decoder.up_blocks.{i}.resnets.{j}"),
            VaeLayout::Ldm => raw.up_resnet(i, j),
        };
        let enc_levels = count(&|i| raw.down_resnet(i, 0));
        let dec_levels = count(&|i| up_block(i, 0));
        let enc_layers = count(&|j| raw.down_resnet(0, j));
        let dec_layers = count(&|j| up_block(0, j));
        let (levels, layers) = match (encoder, decoder) {
            (true, true) => {
                if enc_levels != dec_levels || enc_layers + 1 != dec_layers {
                    return Err(bad_config(
                        wb.key("decoder"),
                        format!(
                            "encoder has {enc_levels} levels of {enc_layers} resnets but the \
                             decoder {dec_levels} levels of {dec_layers}"
                        ),
                    ));
                }
                (dec_levels, enc_layers)
            }
            (false, true) => (dec_levels, dec_layers.saturating_sub(1)),
            _ => (enc_levels, enc_layers),
        };
        if levels == 0 || layers == 0 {
            return Err(bad_config(
                wb.key(if decoder { "decoder" } else { "encoder" }),
                "no resnet blocks found".into(),
            ));
        }
        let names = Names { layout, levels };

        let ne = |key: String| wb.require_ne(&key, "VAE weights");
        let mut block_out_channels = Vec::with_capacity(levels);
        for level in 0..levels {
            let resnet = if decoder {
                names.up_resnet(level, 0)
            } else {
                names.down_resnet(level, 0)
            };
            block_out_channels.push(ne(format!("{resnet}.conv2.weight"))?[3]);
        }
        let latent_channels = if decoder {
            ne("decoder.conv_in.weight".into())?[2]
        } else {
            ne("encoder.conv_out.weight".into())?[3] / 2
        };
        let in_channels = if encoder {
            ne("encoder.conv_in.weight".into())?[2]
        } else {
            3
        };
        let out_channels = if decoder {
            ne("decoder.conv_out.weight".into())?[3]
        } else {
            3
        };
        let part = if decoder {
            Part::Decoder
        } else {
            Part::Encoder
        };
        let q = names.attn_leaves()[1];
        let mid_attention = wb.contains(&format!("{}.{q}.weight", names.mid_attn(part)));
        let config = Self {
            layout,
            in_channels,
            out_channels,
            block_out_channels,
            layers_per_block: layers,
            latent_channels,
            mid_attention,
            norm_groups: DEFAULT_NORM_GROUPS,
            encoder,
            decoder,
            quant_conv: encoder && wb.contains("quant_conv.weight"),
            post_quant_conv: decoder && wb.contains("post_quant_conv.weight"),
        };
        log::debug!(
            "AutoencoderKL: {:?} layout, channels {:?}, {} resnets/level, {} latent channels, \
             mid attention {}, encoder {}, decoder {}",
            config.layout,
            config.block_out_channels,
            config.layers_per_block,
            config.latent_channels,
            config.mid_attention,
            config.encoder,
            config.decoder
        );
        Ok(config)
    }

    /// Pixels per latent pixel along each axis: 2^(levels - 1).
    pub fn scale_factor(&self) -> usize {
        1 << self.block_out_channels.len().saturating_sub(1)
    }
}

/// An AutoencoderKL with its encoder and/or decoder.
#[derive(Clone, Debug)]
pub struct AutoencoderKl {
    config: AutoencoderKlConfig,
    encoder: Option<Encoder>,
    decoder: Option<Decoder>,
}

impl AutoencoderKl {
    /// Declares the weights of the parts `config` asks for.
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: AutoencoderKlConfig,
    ) -> Result<Self, RunnerError> {
        if config.block_out_channels.is_empty() || config.layers_per_block == 0 {
            return Err(bad_config(
                wb.key("decoder"),
                "an AutoencoderKL needs at least one level with one resnet".into(),
            ));
        }
        let ctx = Ctx {
            names: Names {
                layout: config.layout,
                levels: config.block_out_channels.len(),
            },
            groups: config.norm_groups,
        };
        let encoder = if config.encoder {
            Some(Encoder::new(&ctx, wb, &config)?)
        } else {
            None
        };
        let decoder = if config.decoder {
            Some(Decoder::new(&ctx, wb, &config)?)
        } else {
            None
        };
        Ok(Self {
            config,
            encoder,
            decoder,
        })
    }

    pub fn config(&self) -> &AutoencoderKlConfig {
        &self.config
    }

    /// Pixels per latent pixel along each axis (8 for the SD/SDXL VAEs).
    pub fn scale_factor(&self) -> usize {
        self.config.scale_factor()
    }

    pub fn has_encoder(&self) -> bool {
        self.encoder.is_some()
    }

    pub fn has_decoder(&self) -> bool {
        self.decoder.is_some()
    }

    /// Decodes z: [w, h, C_lat, N], already divided by the scaling factor, to the raw decoder
    /// output [w·f, h·f, C_out, N] (f = [`scale_factor`](Self::scale_factor)). The output is
    /// about [-1, 1] and not clamped: map it with `(x / 2 + 0.5).clamp(0, 1)`.
    ///
    /// # Panics
    /// When the decoder was not built (`config.decoder` false); check [`has_decoder`](Self::has_decoder).
    pub fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        self.decoder
            .as_ref()
            .expect("AutoencoderKl::decode without a decoder (check has_decoder)")
            .forward(g, z)
    }

    /// Encodes x: [W, H, C_in, N] with values in [-1, 1] to the posterior (mean, logvar), each
    /// [⌈W/f⌉, ⌈H/f⌉, C_lat, N]; logvar is clamped to [-30, 20] like diffusers. The latent the
    /// pipeline uses is `mean · scaling_factor` (or [`sample`](Self::sample) · scaling_factor).
    ///
    /// # Panics
    /// When the encoder was not built (`config.encoder` false); check [`has_encoder`](Self::has_encoder).
    pub fn encode<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> (Tensor<'g>, Tensor<'g>) {
        let moments = self
            .encoder
            .as_ref()
            .expect("AutoencoderKl::encode without an encoder (check has_encoder)")
            .forward(g, x);
        let [w, h, c2, n] = moments.ne();
        let c = c2 / 2;
        let nb = moments.nb();
        let half =
            |offset: usize| g.cont(g.view(moments, [w, h, c, n], [nb[1], nb[2], nb[3]], offset));
        let mean = half(0);
        let logvar = g.clamp(half(c * nb[2]), LOGVAR_RANGE.0, LOGVAR_RANGE.1);
        (mean, logvar)
    }

    /// A posterior sample `mean + exp(logvar / 2) · noise` (noise: standard normal, same shape).
    pub fn sample<'g>(
        g: &'g GraphCtx<'g>,
        mean: Tensor<'g>,
        logvar: Tensor<'g>,
        noise: Tensor<'g>,
    ) -> Tensor<'g> {
        let std = g.exp(g.scale(logvar, 0.5));
        g.add(mean, g.mul(std, noise))
    }
}

impl super::Vae for AutoencoderKl {
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

    fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        AutoencoderKl::decode(self, g, z)
    }

    fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.encode(g, x).0
    }
}
