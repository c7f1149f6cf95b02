//! The shape of a MiniMax-H3 video VAE, read from its weights (and the `config.json` beside
//! them for what shapes cannot tell).
//!
//! Sizes come from tensor shapes: widths, levels, resnets per level, latent channels, the
//! decoder's width, depth, feed-forward width, register tokens and output patch. What shapes
//! cannot tell comes from `config.json` when given, else from the released model's rules
//! (stable-diffusion.cpp hard-codes them): 32 groups, 64-wide attention heads, a rotary part of
//! 3/4 of each head with θ = 100, every downsampling level spatial, the temporal ones the
//! two after the first (4×, which the 17-frame clip geometry needs).

use serde_json::Value;

use crate::models::vae::qwen_image_2_1_vae::blocks::conv_shape;
use crate::models::vae::qwen_image_2_1_vae::LatentStats;
use crate::runner::{RunnerError, WeightBuilder};

use super::layout::MiniMaxH3VaeLayout;

/// Per-channel latent mean of the released model (24 channels; stable-diffusion.cpp
/// `minimax_h3_vae.hpp`, the `video_vae/config.json` of the release).
pub const LATENTS_MEAN: [f32; 24] = [
    0.858_090_34,
    -0.960_659_15,
    1.066_164,
    -0.509_032_55,
    -0.272_758_2,
    -1.367_541_4,
    -0.255_325_5,
    -0.269_075_54,
    -0.537_684_1,
    -0.046_409_73,
    0.665_737_03,
    0.196_901_28,
    -0.546_060_8,
    -0.403_534_2,
    -0.236_830_25,
    0.259_284_53,
    -0.301_339_45,
    0.211_341_99,
    -1.120_684_9,
    0.358_193_34,
    -0.042_251_438,
    0.260_483,
    0.228_640_93,
    0.705_603_2,
];

/// Per-channel latent standard deviation of the released model.
pub const LATENTS_STD: [f32; 24] = [
    1.222_377_4,
    1.276_726_4,
    1.683_177_5,
    1.754_945_5,
    1.563_621_6,
    2.194_143_5,
    0.965_313_8,
    1.056_988_6,
    0.841_948_9,
    0.772_995_3,
    1.895_593_8,
    0.946_841_8,
    0.799_680_95,
    0.449_889,
    0.719_74,
    0.693_629_3,
    2.961_095,
    2.769_42,
    3.049_618_5,
    2.108_805_4,
    3.276_226_3,
    3.162_735_7,
    2.281_681_3,
    2.612_784_4,
];

/// ImageNet RGB mean: the VAE's pixels are `(rgb − mean) / std` over a [0, 1] range.
pub const PIXEL_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet RGB standard deviation.
pub const PIXEL_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Head width stable-diffusion.cpp assumes (the release: 32 heads of 64).
const DEFAULT_HEAD_DIM: usize = 64;
/// Most levels / blocks probed while detecting.
const MAX_PROBE: usize = 1024;

/// Shape of a MiniMax-H3 video VAE, detected from its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct MiniMaxH3VaeConfig {
    pub layout: MiniMaxH3VaeLayout,
    /// Image channels (3: RGB) in and out.
    pub in_channels: usize,
    pub out_channels: usize,
    /// Latent channels (24).
    pub latent_channels: usize,
    /// Encoder level widths (released: 128, 256, 256, 512, 512, 1024); `conv_in` makes the
    /// first.
    pub block_out_channels: Vec<usize>,
    /// Resnets per encoder level (2).
    pub layers_per_block: usize,
    /// Per-level spatial / temporal strides of the closing downsampler (1 = none at that axis;
    /// released: 2, 2, 2, 2, 1, 1 and 1, 2, 2, 1, 1, 1).
    pub spatial_factors: Vec<usize>,
    pub temporal_factors: Vec<usize>,
    /// Encoder group norm: groups (32) and epsilon (1e-6).
    pub norm_groups: usize,
    pub norm_eps: f32,
    /// ViT decoder: width (2048), blocks (36), heads (32) of `head_dim` (64), SwiGLU inner
    /// width (8192), register tokens (4).
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub ffn_inner: usize,
    pub register_tokens: usize,
    /// Rotated channels at the start of each head (48 = 3/4 of 64), split evenly over the
    /// (t, h, w) axes, and the rotary base (100).
    pub rope_dim: usize,
    pub rope_theta: f32,
    /// Decoder RMS / layer norm epsilon (1e-5).
    pub decoder_eps: f32,
    /// Pixel frames per encoded clip (17) and latent frames dropped after encoding (3).
    pub clip_length: usize,
    pub token_drop: usize,
    /// Build the encoder / decoder (detected: their weights are present; clear one to skip
    /// loading it).
    pub encoder: bool,
    pub decoder: bool,
    /// Latent statistics: `config.json`'s, else the released ones for a 24-channel latent.
    pub latent_stats: Option<LatentStats>,
}

const ORIGIN: &str = "MiniMax-H3 video VAE weights";

fn bad(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: ORIGIN.into(),
        reason,
    }
}

/// Reads optional settings from a diffusers `config.json`.
struct Json<'a>(Option<&'a Value>);

impl Json<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.and_then(|c| c.get(key)).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, RunnerError> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(key.into(), format!("config.json: {v} is not a count")))
            })
            .transpose()
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, RunnerError> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .map(|n| n as f32)
                    .ok_or_else(|| bad(key.into(), format!("config.json: {v} is not a number")))
            })
            .transpose()
    }

    fn list(&self, key: &str) -> Result<Option<Vec<usize>>, RunnerError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let err = || {
            bad(
                key.into(),
                format!("config.json: {v} is not a list of counts"),
            )
        };
        v.as_array()
            .ok_or_else(err)?
            .iter()
            .map(|n| n.as_u64().map(|n| n as usize).ok_or_else(err))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// (in, out) channels of the conv at `path` (any kernel depth), from its weight and bias.
fn conv_io(wb: &WeightBuilder<'_, '_>, path: &str) -> Result<(usize, usize), RunnerError> {
    let weight = wb.require_ne(&format!("{path}.weight"), ORIGIN)?;
    let bias = wb.require_ne(&format!("{path}.bias"), ORIGIN)?;
    conv_shape(&wb.pp(path))
        .map(|(i, o, _)| (i, o))
        .ok_or_else(|| {
            bad(
                wb.key(&format!("{path}.weight")),
                format!(
                    "kernel {weight:?} (ggml order) does not fit the {} outputs of {}",
                    bias[0],
                    wb.key(&format!("{path}.bias"))
                ),
            )
        })
}

/// (in, out) of the linear at `path`.
fn linear_io(wb: &WeightBuilder<'_, '_>, path: &str) -> Result<(usize, usize), RunnerError> {
    let ne = wb.require_ne(&format!("{path}.weight"), ORIGIN)?;
    if ne[2] != 1 || ne[3] != 1 {
        return Err(bad(
            wb.key(&format!("{path}.weight")),
            format!("shape {ne:?} (ggml order) is not a matrix"),
        ));
    }
    Ok((ne[0], ne[1]))
}

/// Released rule for the per-level factors: every downsampling level halves space; time is
/// halved at the `log2(4) = 2` downsampling levels after the first (at the first ones when
/// there are only two).
fn default_factors(has_down: &[bool]) -> (Vec<usize>, Vec<usize>) {
    let down: Vec<usize> = (0..has_down.len()).filter(|&i| has_down[i]).collect();
    let temporal_levels = down.len().min(2);
    let start = 1.min(down.len() - temporal_levels);
    let mut spatial = vec![1; has_down.len()];
    let mut temporal = vec![1; has_down.len()];
    for (k, &level) in down.iter().enumerate() {
        spatial[level] = 2;
        if (start..start + temporal_levels).contains(&k) {
            temporal[level] = 2;
        }
    }
    (spatial, temporal)
}

impl MiniMaxH3VaeConfig {
    /// Reads the configuration from the weight names and shapes under `wb`, and from the
    /// diffusers `config.json` beside them when `json` is given.
    pub fn detect(wb: &WeightBuilder<'_, '_>, json: Option<&Value>) -> Result<Self, RunnerError> {
        let layout = MiniMaxH3VaeLayout::detect(|k| wb.contains(k)).ok_or_else(|| {
            RunnerError::MissingTensor {
                key: wb.key("decoder.proj_in.weight"),
                origin: format!("{ORIGIN} (no MiniMax-H3 encoder or decoder found)"),
            }
        })?;
        let json = Json(json);
        if let Some(mode) = json.get("spatial_padding_mode") {
            if mode.as_str() != Some("reflect") {
                return Err(bad(
                    "spatial_padding_mode".into(),
                    format!("config.json: {mode}; only \"reflect\" is supported"),
                ));
            }
        }
        let encoder = wb.contains("encoder.conv_in.weight");
        let decoder = wb.contains(&format!("{}.weight", layout.proj_in()));
        let mut c = Self {
            layout,
            in_channels: 3,
            out_channels: json.usize("out_channels")?.unwrap_or(3),
            latent_channels: 0,
            block_out_channels: Vec::new(),
            layers_per_block: 0,
            spatial_factors: Vec::new(),
            temporal_factors: Vec::new(),
            norm_groups: json.usize("norm_num_groups")?.unwrap_or(32),
            norm_eps: json.f32("norm_eps")?.unwrap_or(1e-6),
            dim: 0,
            layers: 0,
            heads: 0,
            head_dim: 0,
            ffn_inner: 0,
            register_tokens: 0,
            rope_dim: 0,
            rope_theta: json.f32("decoder_rope_theta")?.unwrap_or(100.0),
            decoder_eps: json.f32("decoder_norm_eps")?.unwrap_or(1e-5),
            clip_length: json.usize("clip_length")?.unwrap_or(17),
            token_drop: json.usize("token_drop")?.unwrap_or(3),
            encoder,
            decoder,
            latent_stats: None,
        };
        if encoder {
            c.detect_encoder(wb, &json)?;
        }
        if decoder {
            c.detect_decoder(wb, &json)?;
        }
        if !encoder && !decoder {
            return Err(RunnerError::MissingTensor {
                key: wb.key("encoder.conv_in.weight"),
                origin: format!("{ORIGIN} (blocks without an encoder input or decoder projection)"),
            });
        }
        c.latent_stats = match json.0.and_then(LatentStats::from_diffusers_config) {
            Some(stats) => Some(stats?),
            None if c.latent_channels == LATENTS_MEAN.len() => Some(LatentStats::new(
                LATENTS_MEAN.to_vec(),
                LATENTS_STD.to_vec(),
            )?),
            None => None,
        };
        if let Some(s) = &c.latent_stats {
            if s.channels() != c.latent_channels {
                return Err(bad(
                    "latents_mean".into(),
                    format!(
                        "config.json has statistics of {} channels for a {}-channel latent",
                        s.channels(),
                        c.latent_channels
                    ),
                ));
            }
        }
        c.check(wb)?;
        log::debug!(
            "MiniMax-H3 video VAE: {:?} layout, encoder {:?} ({} resnets/level, space {:?}, \
             time {:?}), decoder {} wide, {} blocks, {}x{} heads, latent {}",
            c.layout,
            c.block_out_channels,
            c.layers_per_block,
            c.spatial_factors,
            c.temporal_factors,
            c.dim,
            c.layers,
            c.heads,
            c.head_dim,
            c.latent_channels,
        );
        Ok(c)
    }

    fn detect_encoder(
        &mut self,
        wb: &WeightBuilder<'_, '_>,
        json: &Json,
    ) -> Result<(), RunnerError> {
        let l = self.layout;
        let (in_ch, _) = conv_io(wb, "encoder.conv_in")?;
        self.in_channels = in_ch;
        let levels = (0..MAX_PROBE)
            .take_while(|&i| wb.contains(&format!("{}.conv1.weight", l.resnet(i, 0))))
            .count();
        let per = (0..MAX_PROBE)
            .take_while(|&j| wb.contains(&format!("{}.conv1.weight", l.resnet(0, j))))
            .count();
        if levels == 0 || per == 0 {
            return Err(RunnerError::MissingTensor {
                key: wb.key(&format!("{}.conv1.weight", l.resnet(0, 0))),
                origin: ORIGIN.into(),
            });
        }
        self.layers_per_block = per;
        let mut has_down = Vec::new();
        for i in 0..levels {
            self.block_out_channels
                .push(conv_io(wb, &format!("{}.conv1", l.resnet(i, 0)))?.1);
            has_down.push(wb.contains(&format!("{}.weight", l.downsampler(i))));
        }
        let (_, moments) = conv_io(wb, "encoder.conv_out")?;
        if !moments.is_multiple_of(2) {
            return Err(bad(
                wb.key("encoder.conv_out.weight"),
                format!("{moments} output channels; expected mean and log-variance halves"),
            ));
        }
        self.latent_channels = moments / 2;
        let (spatial, temporal) = match (
            json.list("spatial_downsample_factors")?,
            json.list("temporal_downsample_factors")?,
        ) {
            (Some(s), Some(t)) => (s, t),
            _ => default_factors(&has_down),
        };
        if spatial.len() != levels || temporal.len() != levels {
            return Err(bad(
                "spatial_downsample_factors".into(),
                format!(
                    "config.json lists {} / {} factors for {levels} encoder levels",
                    spatial.len(),
                    temporal.len()
                ),
            ));
        }
        for i in 0..levels {
            let (s, t) = (spatial[i], temporal[i]);
            if !(1..=2).contains(&s) || !(1..=2).contains(&t) || (s * t > 1) != has_down[i] {
                return Err(bad(
                    wb.key(&l.downsampler(i)),
                    format!(
                        "level {i}: factors {s}x{t} (space x time) do not match the weights \
                         (downsampler {})",
                        if has_down[i] { "present" } else { "absent" }
                    ),
                ));
            }
        }
        self.spatial_factors = spatial;
        self.temporal_factors = temporal;
        Ok(())
    }

    fn detect_decoder(
        &mut self,
        wb: &WeightBuilder<'_, '_>,
        json: &Json,
    ) -> Result<(), RunnerError> {
        let l = self.layout;
        let (latent, dim) = linear_io(wb, l.proj_in())?;
        if self.encoder && latent != self.latent_channels {
            return Err(bad(
                wb.key(&format!("{}.weight", l.proj_in())),
                format!(
                    "the decoder takes {latent} latent channels, the encoder makes {}",
                    self.latent_channels
                ),
            ));
        }
        self.latent_channels = latent;
        self.dim = dim;
        self.layers = (0..MAX_PROBE)
            .take_while(|&i| wb.contains(&format!("{}.norm1.weight", l.block(i))))
            .count();
        if self.layers == 0 {
            return Err(RunnerError::MissingTensor {
                key: wb.key(&format!("{}.norm1.weight", l.block(0))),
                origin: ORIGIN.into(),
            });
        }
        let (w1, _, _) = l.ff();
        let (_, fused) = linear_io(wb, &format!("{}.{w1}", l.block(0)))?;
        if !fused.is_multiple_of(2) {
            return Err(bad(
                wb.key(&format!("{}.{w1}.weight", l.block(0))),
                format!("{fused} outputs; expected the two SwiGLU halves"),
            ));
        }
        self.ffn_inner = fused / 2;
        let reg = wb.require_ne("decoder.register_tokens", ORIGIN)?;
        let reg_count: usize = reg.iter().product();
        if reg[0] != dim || !reg_count.is_multiple_of(dim) {
            return Err(bad(
                wb.key("decoder.register_tokens"),
                format!("shape {reg:?} (ggml order) is not [{dim}, tokens]"),
            ));
        }
        self.register_tokens = reg_count / dim;

        let heads = match json.usize("decoder_num_attention_heads")? {
            Some(h) => h,
            None => dim / DEFAULT_HEAD_DIM,
        };
        if heads == 0 || !dim.is_multiple_of(heads) {
            return Err(bad(
                wb.key(&format!("{}.weight", l.proj_in())),
                format!("width {dim} does not split into {heads} attention heads"),
            ));
        }
        self.heads = heads;
        self.head_dim = dim / heads;
        if let Some(hd) = json.usize("decoder_attention_head_dim")? {
            if hd != self.head_dim {
                return Err(bad(
                    "decoder_attention_head_dim".into(),
                    format!("config.json says {hd}, the weights {dim} / {heads} heads"),
                ));
            }
        }
        let ratio = json.f32("decoder_rope_dim_ratio")?.unwrap_or(0.75);
        // int(attention_head_dim * rope_dim_ratio), as diffusers computes it.
        self.rope_dim = (self.head_dim as f64 * f64::from(ratio)) as usize;
        if !self.rope_dim.is_multiple_of(6) || self.rope_dim > self.head_dim {
            return Err(bad(
                "decoder_rope_dim_ratio".into(),
                format!(
                    "{} rotated channels of a {}-wide head; they must be a multiple of 6 \
                     (cos/sin pairs over three axes)",
                    self.rope_dim, self.head_dim
                ),
            ));
        }

        // The output patch: out_channels · pt · p · p values per token.
        let (_, patch_values) = linear_io(wb, "decoder.proj_out")?;
        if !self.encoder {
            let pt: usize = json
                .list("temporal_downsample_factors")?
                .map_or(4, |f| f.iter().product());
            let per_pixel = self.out_channels * pt;
            let p = (1..=64).find(|p| p * p * per_pixel == patch_values);
            let Some(p) = p else {
                return Err(bad(
                    wb.key("decoder.proj_out.weight"),
                    format!(
                        "{patch_values} outputs per token are not {} channels x {pt} frames x \
                         a square patch",
                        self.out_channels
                    ),
                ));
            };
            self.spatial_factors = factor_levels(p);
            self.temporal_factors = factor_levels(pt);
        }
        let want = self.out_channels * self.temporal_factor() * self.scale_factor().pow(2);
        if patch_values != want {
            return Err(bad(
                wb.key("decoder.proj_out.weight"),
                format!(
                    "{patch_values} outputs per token; expected {} channels x {} frames x {}x{} \
                     pixels",
                    self.out_channels,
                    self.temporal_factor(),
                    self.scale_factor(),
                    self.scale_factor()
                ),
            ));
        }
        Ok(())
    }

    fn check(&self, wb: &WeightBuilder<'_, '_>) -> Result<(), RunnerError> {
        let tf = self.temporal_factor();
        if self.clip_length == 0 || tf == 0 || self.token_drop >= self.clip_length.div_ceil(tf) {
            return Err(bad(
                "clip_length".into(),
                format!(
                    "clips of {} frames at {tf}x in time cannot drop {} latent frames",
                    self.clip_length, self.token_drop
                ),
            ));
        }
        if self.encoder {
            if let Some(&w) = self
                .block_out_channels
                .iter()
                .find(|&&w| self.norm_groups == 0 || !w.is_multiple_of(self.norm_groups))
            {
                return Err(bad(
                    wb.key("encoder.norm_out.weight"),
                    format!("width {w} does not split into {} groups", self.norm_groups),
                ));
            }
        }
        Ok(())
    }

    /// Pixels per latent pixel along each axis (16).
    pub fn scale_factor(&self) -> usize {
        self.spatial_factors.iter().product()
    }

    /// Pixel frames per latent frame inside a clip (4).
    pub fn temporal_factor(&self) -> usize {
        self.temporal_factors.iter().product()
    }
}

/// Per-level factors of 2 whose product is `f` (a power of two), for a decoder-only file.
fn factor_levels(f: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut rest = f;
    while rest > 1 && rest.is_multiple_of(2) {
        out.push(2);
        rest /= 2;
    }
    if rest > 1 {
        out.push(rest);
    }
    if out.is_empty() {
        out.push(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_factor_rule() {
        let released = [true, true, true, true, false, false];
        assert_eq!(
            default_factors(&released),
            (vec![2, 2, 2, 2, 1, 1], vec![1, 2, 2, 1, 1, 1])
        );
        assert_eq!(default_factors(&[true, true]), (vec![2, 2], vec![2, 2]));
        assert_eq!(default_factors(&[true, false]), (vec![2, 1], vec![2, 1]));
    }

    #[test]
    fn decoder_only_factors() {
        assert_eq!(factor_levels(16), vec![2, 2, 2, 2]);
        assert_eq!(factor_levels(4).iter().product::<usize>(), 4);
        assert_eq!(factor_levels(1), vec![1]);
    }
}
