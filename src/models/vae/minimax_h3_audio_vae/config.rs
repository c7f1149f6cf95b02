//! The shape of a MiniMax-H3 audio VAE, read from its weights, then its `config.json` (what
//! the weights cannot say), then the released model's values.

use serde_json::Value;

use super::layout::{AudioVaeLayout, AudioVaeSource};
use crate::models::vae::qwen_image_2_1_vae::LatentStats;
use crate::runner::{RunnerError, WeightBuilder, WeightSource};

/// Where sizes are read from, for errors.
pub(super) const ORIGIN: &str = "MiniMax-H3 audio VAE weights";

/// Attention heads of the released `pre_block` (not visible in the weights).
pub const RELEASED_HEADS: usize = 8;
/// Dilations of each released AMP block (diffusers' `resblock_dilation_sizes` default).
pub const RELEASED_DILATIONS: [usize; 3] = [1, 3, 5];
/// The released decoder's upsampling rates and kernels (diffusers' defaults).
pub const RELEASED_DECODER_RATES: [usize; 7] = [5, 5, 2, 2, 2, 2, 2];
pub const RELEASED_DECODER_KERNELS: [usize; 7] = [9, 9, 4, 4, 4, 4, 4];
/// Waveform rate of the released model (diffusers' `sampling_rate` default).
pub const RELEASED_SAMPLE_RATE: u32 = 32_000;
/// Dilations of the three residual units of every encoder block (fixed in the architecture).
pub const ENCODER_UNIT_DILATIONS: [usize; 3] = [1, 3, 9];

/// Most blocks probed in one list while detecting.
const MAX_BLOCKS: usize = 64;

/// Shape of a MiniMax-H3 audio VAE.
#[derive(Clone, Debug, PartialEq)]
pub struct MiniMaxH3AudioVaeConfig {
    pub layout: AudioVaeLayout,
    /// Build the encoder (detected: its weights are present; clear it to skip them).
    pub encoder: bool,
    /// Build the decoder (detected: its weights are present; clear it to skip them).
    pub decoder: bool,
    /// Width of the encoder's input convolution (released: 64); doubles per block.
    pub encoder_dim: usize,
    /// Encoder strides, from each block's kernel `2·stride` (released: 2, 4, 4, 5, 5).
    pub encoder_rates: Vec<usize>,
    /// Width of the encoder trunk and the decoder input (released: 2048).
    pub latent_dim: usize,
    /// Latent channels (released: 32).
    pub latent_channels: usize,
    /// Heads of the causal attention in `pre_block` (config.json, else 8).
    pub num_heads: usize,
    /// BigVGAN's initial width (released: 1024); halves per stage.
    pub decoder_dim: usize,
    /// Decoder upsampling rates (config.json, else the released ones when the kernels are the
    /// released kernels, else `(K + 1) / 2`).
    pub decoder_rates: Vec<usize>,
    /// Transposed-convolution kernel per stage, from the weights (released: 9, 9, 4, …).
    pub decoder_kernels: Vec<usize>,
    /// Kernel of each parallel AMP block of a stage, from the weights (released: 3, 7, 11).
    pub resblock_kernels: Vec<usize>,
    /// Dilations of each AMP block (config.json, else 1, 3, 5 for blocks of three pairs).
    pub resblock_dilations: Vec<Vec<usize>>,
    /// Waveform sample rate (config.json `sampling_rate`, else 32 kHz).
    pub sample_rate: u32,
    /// Latent statistics: the `latents_mean` / `latents_std` tensors (original layout) or
    /// config.json entries (diffusers); `None` when neither is given.
    pub latent_stats: Option<LatentStats>,
}

fn bad(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: ORIGIN.into(),
        reason,
    }
}

/// `[K, IC, OC]` of the 1-D kernel `<path>.weight`.
fn kernel(wb: &WeightBuilder<'_, '_>, path: &str) -> Result<[usize; 3], RunnerError> {
    let ne = wb.require_ne(&format!("{path}.weight"), ORIGIN)?;
    Ok([ne[0], ne[1], ne[2]])
}

fn usize_list(v: &Value) -> Option<Vec<usize>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
        .collect()
}

fn f32_list(config: Option<&Value>, key: &str) -> Option<Result<Vec<f32>, RunnerError>> {
    let values = config?.get(key)?.as_array()?;
    Some(
        values
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| bad(key.into(), format!("config.json holds a non-number {v}")))
            })
            .collect(),
    )
}

impl MiniMaxH3AudioVaeConfig {
    /// Reads the configuration from the weights under `wb` (built over an [`AudioVaeSource`],
    /// which `source` is) and the model's `config.json`, when there is one.
    pub fn detect(
        wb: &WeightBuilder<'_, '_>,
        source: &AudioVaeSource<'_>,
        config: Option<&Value>,
    ) -> Result<Self, RunnerError> {
        let layout = source.layout().ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key("decoder.conv_pre.weight"),
            origin: format!("{ORIGIN} (no encoder or decoder input convolution)"),
        })?;
        let encoder = wb.contains("encoder.block.0.weight");
        let decoder = wb.contains("decoder.conv_pre.weight");
        let mut c = Self {
            layout,
            encoder,
            decoder,
            encoder_dim: 0,
            encoder_rates: Vec::new(),
            latent_dim: 0,
            latent_channels: 0,
            num_heads: RELEASED_HEADS,
            decoder_dim: 0,
            decoder_rates: Vec::new(),
            decoder_kernels: Vec::new(),
            resblock_kernels: Vec::new(),
            resblock_dilations: Vec::new(),
            sample_rate: RELEASED_SAMPLE_RATE,
            latent_stats: None,
        };
        if encoder {
            c.detect_encoder(wb)?;
        }
        if decoder {
            c.detect_decoder(wb)?;
        }
        c.read_config_json(wb, config)?;
        if decoder {
            c.decoder_hparams(wb, config)?;
        }
        c.latent_stats = Self::stats(source, config, c.latent_channels)?;
        c.validate(wb)?;
        log::debug!(
            "MiniMax-H3 audio VAE: {:?} layout, encoder {} (dim {}, rates {:?}), latent {} → {} \
             channels, {} heads, decoder {} (dim {}, rates {:?}, kernels {:?}, AMP kernels {:?}, \
             dilations {:?}), {} Hz, statistics {}",
            c.layout,
            c.encoder,
            c.encoder_dim,
            c.encoder_rates,
            c.latent_dim,
            c.latent_channels,
            c.num_heads,
            c.decoder,
            c.decoder_dim,
            c.decoder_rates,
            c.decoder_kernels,
            c.resblock_kernels,
            c.resblock_dilations,
            c.sample_rate,
            if c.latent_stats.is_some() {
                "present"
            } else {
                "absent"
            },
        );
        Ok(c)
    }

    fn detect_encoder(&mut self, wb: &WeightBuilder<'_, '_>) -> Result<(), RunnerError> {
        let [_, in_ch, dim] = kernel(wb, "encoder.block.0")?;
        if in_ch != 1 {
            return Err(bad(
                wb.key("encoder.block.0.weight"),
                format!("{in_ch} input channels; the encoder takes a mono waveform"),
            ));
        }
        self.encoder_dim = dim;
        let mut i = 1;
        while i < MAX_BLOCKS && wb.contains(&format!("encoder.block.{i}.block.4.weight")) {
            let [k, _, _] = kernel(wb, &format!("encoder.block.{i}.block.4"))?;
            if k < 2 || !k.is_multiple_of(2) {
                return Err(bad(
                    wb.key(&format!("encoder.block.{i}.block.4.weight")),
                    format!("kernel {k}; a strided encoder convolution has kernel 2·stride"),
                ));
            }
            self.encoder_rates.push(k / 2);
            i += 1;
        }
        // After the blocks: Snake at `block.{n+1}`, the output convolution at `block.{n+2}`.
        let [_, _, latent_dim] = kernel(wb, &format!("encoder.block.{}", i + 1))?;
        self.latent_dim = latent_dim;
        let proj = wb.require_ne("pre_block.proj.weight", ORIGIN)?;
        self.latent_channels = proj[1];
        Ok(())
    }

    fn detect_decoder(&mut self, wb: &WeightBuilder<'_, '_>) -> Result<(), RunnerError> {
        let [_, latent_dim, dim] = kernel(wb, "decoder.conv_pre")?;
        let [_, latent_channels, proj_out] = kernel(wb, "dec_in_proj")?;
        if proj_out != latent_dim {
            return Err(bad(
                wb.key("dec_in_proj.weight"),
                format!("{proj_out} outputs; decoder.conv_pre takes {latent_dim}"),
            ));
        }
        for (what, have, got) in [
            ("latent_dim", self.latent_dim, latent_dim),
            ("latent channels", self.latent_channels, latent_channels),
        ] {
            if self.encoder && have != got {
                return Err(bad(
                    wb.key("dec_in_proj.weight"),
                    format!("decoder {what} {got}, encoder {have}"),
                ));
            }
        }
        self.latent_dim = latent_dim;
        self.latent_channels = latent_channels;
        self.decoder_dim = dim;
        let mut i = 0;
        while i < MAX_BLOCKS && wb.contains(&format!("decoder.ups.{i}.0.weight")) {
            self.decoder_kernels
                .push(kernel(wb, &format!("decoder.ups.{i}.0"))?[0]);
            i += 1;
        }
        let stages = self.decoder_kernels.len();
        let mut blocks = 0;
        while blocks < MAX_BLOCKS * 4
            && wb.contains(&format!("decoder.resblocks.{blocks}.convs1.0.weight"))
        {
            blocks += 1;
        }
        if stages == 0 || blocks == 0 || blocks % stages != 0 {
            return Err(bad(
                wb.key("decoder.resblocks"),
                format!("{blocks} AMP blocks for {stages} upsampling stages"),
            ));
        }
        for j in 0..blocks / stages {
            self.resblock_kernels
                .push(kernel(wb, &format!("decoder.resblocks.{j}.convs1.0"))?[0]);
        }
        Ok(())
    }

    /// Hyper-parameters the weights do not hold: heads and sample rate.
    fn read_config_json(
        &mut self,
        wb: &WeightBuilder<'_, '_>,
        config: Option<&Value>,
    ) -> Result<(), RunnerError> {
        let Some(cfg) = config else { return Ok(()) };
        if let Some(h) = cfg.get("num_attention_heads") {
            self.num_heads = h
                .as_u64()
                .and_then(|h| usize::try_from(h).ok())
                .filter(|&h| h > 0)
                .ok_or_else(|| {
                    bad(
                        wb.key("num_attention_heads"),
                        format!("config.json says {h}"),
                    )
                })?;
        }
        if let Some(r) = cfg.get("sampling_rate") {
            self.sample_rate = r
                .as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .filter(|&r| r > 0)
                .ok_or_else(|| bad(wb.key("sampling_rate"), format!("config.json says {r}")))?;
        }
        Ok(())
    }

    /// Decoder rates and AMP dilations: config.json, else the released values where the
    /// weights match them.
    fn decoder_hparams(
        &mut self,
        wb: &WeightBuilder<'_, '_>,
        config: Option<&Value>,
    ) -> Result<(), RunnerError> {
        let stages = self.decoder_kernels.len();
        let per_stage = self.resblock_kernels.len();
        let rates = config.and_then(|c| c.get("decoder_rates"));
        self.decoder_rates = match rates {
            Some(v) => usize_list(v).filter(|r| r.len() == stages).ok_or_else(|| {
                bad(
                    wb.key("decoder_rates"),
                    format!("config.json says {v}; the weights have {stages} stages"),
                )
            })?,
            None if self.decoder_kernels == RELEASED_DECODER_KERNELS => {
                RELEASED_DECODER_RATES.to_vec()
            }
            // BigVGAN pairs a rate r with a kernel of 2r or 2r − 1.
            None => self.decoder_kernels.iter().map(|k| k.div_ceil(2)).collect(),
        };
        let dilations = config.and_then(|c| c.get("resblock_dilation_sizes"));
        self.resblock_dilations = match dilations {
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(usize_list).collect::<Option<Vec<_>>>())
                .filter(|d| d.len() == per_stage)
                .ok_or_else(|| {
                    bad(
                        wb.key("resblock_dilation_sizes"),
                        format!("config.json says {v}; the weights have {per_stage} AMP blocks"),
                    )
                })?,
            None => (0..per_stage)
                .map(|_| RELEASED_DILATIONS.to_vec())
                .collect(),
        };
        // Each block must hold one (dilated, plain) pair per dilation.
        for (j, d) in self.resblock_dilations.iter().enumerate() {
            let convs = (0..MAX_BLOCKS)
                .take_while(|&m| wb.contains(&format!("decoder.resblocks.{j}.convs1.{m}.weight")))
                .count();
            if convs != d.len() || d.contains(&0) {
                return Err(bad(
                    wb.key(&format!("decoder.resblocks.{j}.convs1")),
                    format!(
                        "{convs} dilated convolutions but dilations {d:?} (config.json \
                         `resblock_dilation_sizes`, else the released 1, 3, 5)"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn stats(
        source: &AudioVaeSource<'_>,
        config: Option<&Value>,
        channels: usize,
    ) -> Result<Option<LatentStats>, RunnerError> {
        let tensor = |name: &str| {
            source.read_f32(name).map(|r| {
                r.map_err(|reason| RunnerError::BadData {
                    key: name.into(),
                    origin: source.describe(),
                    reason,
                })
            })
        };
        let pair = match (tensor("latents_mean"), tensor("latents_std")) {
            (Some(m), Some(s)) => Some((m?, s?)),
            _ => match (
                f32_list(config, "latents_mean"),
                f32_list(config, "latents_std"),
            ) {
                (Some(m), Some(s)) => Some((m?, s?)),
                _ => None,
            },
        };
        let Some((mean, std)) = pair else {
            return Ok(None);
        };
        if mean.len() != channels {
            return Err(bad(
                "latents_mean".into(),
                format!("{} values for {channels} latent channels", mean.len()),
            ));
        }
        LatentStats::new(mean, std).map(Some)
    }

    fn validate(&self, wb: &WeightBuilder<'_, '_>) -> Result<(), RunnerError> {
        if self.latent_channels == 0 || self.latent_dim == 0 {
            return Err(bad(wb.key("pre_block"), "zero latent width".into()));
        }
        if self.encoder {
            if !self.latent_dim.is_multiple_of(self.num_heads) {
                return Err(bad(
                    wb.key("pre_block.attn.qkv.weight"),
                    format!(
                        "width {} does not split into {} heads",
                        self.latent_dim, self.num_heads
                    ),
                ));
            }
            if self.encoder_rates.is_empty() {
                return Err(bad(wb.key("encoder.block.1"), "no encoder blocks".into()));
            }
        }
        if self.decoder {
            let stages = self.decoder_kernels.len();
            if self.decoder_dim >> stages == 0 || !self.decoder_dim.is_multiple_of(1 << stages) {
                return Err(bad(
                    wb.key("decoder.conv_pre.weight"),
                    format!("width {} does not halve {stages} times", self.decoder_dim),
                ));
            }
            if self.decoder_rates.contains(&0) {
                return Err(bad(wb.key("decoder.ups"), "a zero upsampling rate".into()));
            }
        }
        if self.encoder && self.decoder && self.hop_length() != self.decoder_hop() {
            return Err(bad(
                wb.key("decoder.ups"),
                format!(
                    "decoder upsamples by {} (rates {:?}) but the encoder hops {}; give \
                     `decoder_rates` in config.json",
                    self.decoder_hop(),
                    self.decoder_rates,
                    self.hop_length()
                ),
            ));
        }
        Ok(())
    }

    /// Waveform samples per latent frame (released: 800, i.e. 40 latents/s at 32 kHz).
    pub fn hop_length(&self) -> usize {
        if self.encoder {
            self.encoder_rates.iter().product()
        } else {
            self.decoder_hop()
        }
    }

    fn decoder_hop(&self) -> usize {
        self.decoder_rates.iter().product()
    }
}
