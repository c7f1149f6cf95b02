//! UNet configuration: the block structure and sizes read from the weights, and the few
//! hyper-parameters the weights do not record (heads, norm groups) from a diffusers
//! `config.json`, explicit overrides, or stable-diffusion.cpp's rules.

use serde_json::Value;

use super::layout::{scan, LevelNames, Skeleton, UNetLayout};
use crate::runner::{RunnerError, WeightBuilder};

const ORIGIN: &str = "UNet weights";

/// GroupNorm groups of every released SD UNet (LDM's `GroupNorm32`).
pub const DEFAULT_NORM_GROUPS: usize = 32;

/// Epsilon of the resnet and output GroupNorms: diffusers' and LDM's 1e-5 (1e-6 only in the
/// transformers' input norm). stable-diffusion.cpp uses 1e-6 everywhere, a difference of
/// numerical noise rather than behaviour; the reference the images are checked against is
/// diffusers.
pub const DEFAULT_NORM_EPS: f32 = 1e-5;

/// Heads per transformer of a UNet whose transformers project with 1×1 convs (SD1.x), by
/// upstream's rule (`num_heads = 8`).
pub const CONV_PROJECTION_HEADS: usize = 8;

/// Head size of a UNet whose transformers project with linears (SD2.x, SDXL), by upstream's
/// rule (`num_head_channels = 64`).
pub const LINEAR_PROJECTION_HEAD_DIM: usize = 64;

/// What the weights do not say. Every field is optional; [`UNetConfig::detect`] fills the gaps
/// with stable-diffusion.cpp's rules.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UNetHparams {
    /// Attention heads per level, down order (diffusers' `attention_head_dim` /
    /// `num_attention_heads`, which for this model count heads): up levels use their mirror
    /// level's entry, the mid block the last. One entry applies to every level.
    pub heads: Option<Vec<usize>>,
    /// A fixed head size instead (heads = width / head_dim); `heads` wins.
    pub head_dim: Option<usize>,
    /// GroupNorm groups (diffusers' `norm_num_groups`).
    pub norm_groups: Option<usize>,
    /// Epsilon of the resnet and output GroupNorms (default [`DEFAULT_NORM_EPS`]).
    pub norm_eps: Option<f32>,
}

fn bad_json(key: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: "the UNet config.json".into(),
        reason,
    }
}

impl UNetHparams {
    /// Reads `num_attention_heads` (when set) or `attention_head_dim` (an int or a per-level
    /// list; for `UNet2DConditionModel` both count heads) and `norm_num_groups` from a
    /// diffusers `config.json`, and `norm_eps`.
    pub fn from_diffusers_config(config: &Value) -> Result<Self, RunnerError> {
        let heads_key = ["num_attention_heads", "attention_head_dim"]
            .into_iter()
            .find(|k| config.get(k).is_some_and(|v| !v.is_null()));
        let heads = match heads_key {
            None => None,
            Some(key) => {
                let v = &config[key];
                let one = |x: &Value| {
                    x.as_u64()
                        .filter(|&n| n > 0)
                        .map(|n| n as usize)
                        .ok_or_else(|| bad_json(key, format!("{x} is not a positive head count")))
                };
                Some(match v.as_array() {
                    Some(list) => list.iter().map(one).collect::<Result<Vec<_>, _>>()?,
                    None => vec![one(v)?],
                })
            }
        };
        let norm_groups =
            match config.get("norm_num_groups") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    bad_json("norm_num_groups", format!("{v} is not a group count"))
                })? as usize),
            };
        let norm_eps = match config.get("norm_eps") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|e| e.is_finite() && *e > 0.0)
                    .ok_or_else(|| bad_json("norm_eps", format!("{v} is not a positive epsilon")))?
                    as f32,
            ),
        };
        Ok(Self {
            heads,
            head_dim: None,
            norm_groups,
            norm_eps,
        })
    }

    /// These values where set, `fallback`'s elsewhere (explicit overrides over `config.json`).
    pub fn or(self, fallback: UNetHparams) -> UNetHparams {
        UNetHparams {
            heads: self.heads.or(fallback.heads),
            head_dim: self.head_dim.or(fallback.head_dim),
            norm_groups: self.norm_groups.or(fallback.norm_groups),
            norm_eps: self.norm_eps.or(fallback.norm_eps),
        }
    }
}

/// A spatial transformer: where its weights are, how many blocks and heads it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    /// Its path in the checkpoint (`down_blocks.1.attentions.0`, `input_blocks.4.1`).
    pub name: String,
    /// Transformer blocks (SDXL: 2 at level 1, 10 at level 2; SSD-1B / Vega vary per block).
    pub depth: usize,
    pub heads: usize,
    /// Width inside the transformer (`proj_in`'s output; the level width in released models).
    pub inner_dim: usize,
}

/// A resnet and its optional transformer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockConfig {
    /// The resnet's path (`down_blocks.1.resnets.0`, `input_blocks.4.0`).
    pub resnet: String,
    /// Output width of the resnet (and of the block).
    pub channels: usize,
    pub attention: Option<AttentionConfig>,
}

/// One resolution level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelConfig {
    pub blocks: Vec<BlockConfig>,
    /// The path of the resampler (a down-sampler after a down level, an up-sampler after an up
    /// level) closing it; `None` on the deepest down level and the last up level.
    pub resample: Option<String>,
}

impl LevelConfig {
    /// The level's width (its last block's).
    pub fn channels(&self) -> usize {
        self.blocks.last().map_or(0, |b| b.channels)
    }
}

/// The mid block: a resnet, then (transformer, resnet) pairs (one pair in SD/SDXL, none in
/// SSD-1B and Vega).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MidConfig {
    pub resnet: String,
    pub stages: Vec<(AttentionConfig, String)>,
}

/// Shape of a `UNet2DConditionModel`, detected from its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct UNetConfig {
    pub layout: UNetLayout,
    /// Latent channels in (4; 9 for inpainting, 8 for instruct-pix2pix).
    pub in_channels: usize,
    pub out_channels: usize,
    /// `conv_in`'s width, also the width of the sinusoidal timestep features (SD: 320).
    pub model_channels: usize,
    /// Width of the timestep embedding every resnet reads (4 × model channels).
    pub time_embed_dim: usize,
    /// Width of the vector conditioning `y` (SDXL: 2816, refiner: 2560); `None` without one.
    pub adm_in_channels: Option<usize>,
    /// Width of the cross-attention context (SD1: 768, SD2: 1024, SDXL: 2048).
    pub context_dim: usize,
    /// Transformers project with linears (SD2, SDXL) rather than 1×1 convs (SD1).
    pub linear_projection: bool,
    /// Level 0 (full resolution) first.
    pub down: Vec<LevelConfig>,
    /// `None` in tiny UNets without a mid block.
    pub mid: Option<MidConfig>,
    /// In execution order (deepest level first); each has one more block than its down level.
    pub up: Vec<LevelConfig>,
    pub norm_groups: usize,
    /// Epsilon of the resnet and output GroupNorms.
    pub norm_eps: f32,
}

fn missing(key: String, what: &str) -> RunnerError {
    RunnerError::MissingTensor {
        key,
        origin: format!("{ORIGIN} ({what})"),
    }
}

fn bad(key: String, reason: String) -> RunnerError {
    RunnerError::BadData {
        key,
        origin: ORIGIN.into(),
        reason,
    }
}

fn bad_hparam(key: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: "UNet hyper-parameters".into(),
        reason,
    }
}

/// How heads are chosen for a transformer of a given width.
enum HeadRule {
    /// Per level, down order.
    PerLevel(Vec<usize>),
    HeadDim(usize),
}

impl HeadRule {
    fn heads(&self, level: usize, inner: usize) -> usize {
        match self {
            HeadRule::PerLevel(list) => list[level.min(list.len() - 1)],
            HeadRule::HeadDim(d) => (inner / d).max(1),
        }
    }
}

impl UNetConfig {
    /// Reads the layout, structure and sizes from `wb`'s tensors; heads and norm groups from
    /// `hparams` where given, else stable-diffusion.cpp's rules: 1×1-conv projections (SD1) →
    /// 8 heads per transformer; linear projections (SD2/SDXL) → head size 64 (heads = width /
    /// 64, at least 1); 32 norm groups.
    pub fn detect(wb: &WeightBuilder<'_, '_>, hparams: &UNetHparams) -> Result<Self, RunnerError> {
        let layout = if wb.contains(&format!("{}.weight", UNetLayout::Diffusers.conv_in())) {
            UNetLayout::Diffusers
        } else if wb.contains(&format!("{}.weight", UNetLayout::Ldm.conv_in())) {
            UNetLayout::Ldm
        } else {
            return Err(missing(
                wb.key(&format!("{}.weight", UNetLayout::Diffusers.conv_in())),
                "neither the diffusers conv_in nor the LDM input_blocks.0.0",
            ));
        };
        let skeleton = scan(wb, layout)?;
        let ne = |name: String| wb.require_ne(&name, ORIGIN);

        let [k0, k1, in_channels, model_channels] = ne(format!("{}.weight", layout.conv_in()))?;
        if k0 != 3 || k1 != 3 {
            return Err(bad(
                wb.key(&format!("{}.weight", layout.conv_in())),
                format!("a {k0}x{k1} input conv; the UNet's is 3x3"),
            ));
        }
        let out_channels = ne(format!("{}.weight", layout.conv_out()))?[3];
        let [t_in, time_embed_dim, ..] = ne(format!("{}.weight", layout.time_embed()[0]))?;
        if t_in != model_channels {
            return Err(bad(
                wb.key(&format!("{}.weight", layout.time_embed()[0])),
                format!("timestep features of width {t_in}, but conv_in makes {model_channels} channels"),
            ));
        }
        let label = format!("{}.weight", layout.label_embed()[0]);
        let adm_in_channels = wb.source_ne(&label).map(|n| n[0]);

        let first_attention = skeleton
            .down
            .iter()
            .chain(&skeleton.up)
            .flat_map(|l| &l.blocks)
            .find_map(|b| b.attention.clone())
            .or_else(|| {
                skeleton
                    .mid
                    .as_ref()
                    .and_then(|m| m.stages.first().map(|s| s.0.clone()))
            });
        let (context_dim, linear_projection) = match &first_attention {
            None => (0, true),
            Some(attn) => {
                let k = ne(format!("{attn}.transformer_blocks.0.attn2.to_k.weight"))?;
                let p = ne(format!("{attn}.proj_in.weight"))?;
                (k[0], !(p[0] == 1 && p[1] == 1))
            }
        };

        let levels = skeleton.down.len();
        let rule = match (&hparams.heads, hparams.head_dim) {
            (Some(list), _) => {
                if list.len() != 1 && list.len() != levels {
                    return Err(bad_hparam(
                        "heads",
                        format!("{} head counts given for {levels} levels", list.len()),
                    ));
                }
                if list.contains(&0) {
                    return Err(bad_hparam("heads", "a head count of 0".into()));
                }
                HeadRule::PerLevel(list.clone())
            }
            (None, Some(0)) => {
                return Err(bad_hparam("head_dim", "a head size of 0".into()));
            }
            (None, Some(d)) => HeadRule::HeadDim(d),
            (None, None) if linear_projection => HeadRule::HeadDim(LINEAR_PROJECTION_HEAD_DIM),
            (None, None) => HeadRule::PerLevel(vec![CONV_PROJECTION_HEADS]),
        };

        let attention = |name: &str, level: usize| -> Result<AttentionConfig, RunnerError> {
            let p = ne(format!("{name}.proj_in.weight"))?;
            let inner_dim = if linear_projection { p[1] } else { p[3] };
            let depth = (0..)
                .take_while(|k| {
                    wb.contains(&format!("{name}.transformer_blocks.{k}.attn1.to_q.weight"))
                })
                .count();
            if depth == 0 {
                return Err(missing(
                    wb.key(&format!("{name}.transformer_blocks.0.attn1.to_q.weight")),
                    "a transformer without blocks",
                ));
            }
            let heads = rule.heads(level, inner_dim);
            if inner_dim == 0 || !inner_dim.is_multiple_of(heads) {
                return Err(bad(
                    wb.key(&format!("{name}.proj_in.weight")),
                    format!("width {inner_dim} does not split into {heads} heads"),
                ));
            }
            Ok(AttentionConfig {
                name: name.to_string(),
                depth,
                heads,
                inner_dim,
            })
        };
        let resnet_channels = |name: &str| -> Result<usize, RunnerError> {
            Ok(ne(format!("{name}.{}.weight", layout.resnet().conv1))?[3])
        };
        let level_config = |names: &LevelNames, level: usize| -> Result<LevelConfig, RunnerError> {
            let blocks = names
                .blocks
                .iter()
                .map(|b| {
                    Ok(BlockConfig {
                        resnet: b.resnet.clone(),
                        channels: resnet_channels(&b.resnet)?,
                        attention: b
                            .attention
                            .as_deref()
                            .map(|a| attention(a, level))
                            .transpose()?,
                    })
                })
                .collect::<Result<Vec<_>, RunnerError>>()?;
            Ok(LevelConfig {
                blocks,
                resample: names.resample.clone(),
            })
        };
        let Skeleton { down, mid, up } = &skeleton;
        let down = down
            .iter()
            .enumerate()
            .map(|(i, l)| level_config(l, i))
            .collect::<Result<Vec<_>, _>>()?;
        let up = up
            .iter()
            .enumerate()
            .map(|(i, l)| level_config(l, levels - 1 - i))
            .collect::<Result<Vec<_>, _>>()?;
        let mid = match mid {
            None => None,
            Some(m) => Some(MidConfig {
                resnet: m.resnet.clone(),
                stages: m
                    .stages
                    .iter()
                    .map(|(a, r)| Ok((attention(a, levels - 1)?, r.clone())))
                    .collect::<Result<Vec<_>, RunnerError>>()?,
            }),
        };
        let config = Self {
            layout,
            in_channels,
            out_channels,
            model_channels,
            time_embed_dim,
            adm_in_channels,
            context_dim,
            linear_projection,
            down,
            mid,
            up,
            norm_groups: hparams.norm_groups.unwrap_or(DEFAULT_NORM_GROUPS),
            norm_eps: hparams.norm_eps.unwrap_or(DEFAULT_NORM_EPS),
        };
        log::debug!(
            "unet: {:?} layout, in {} out {}, channels {:?}, resnets/level {:?}, depths {:?}, \
             context {}, adm {:?}, linear projection {}, mid block {}",
            config.layout,
            config.in_channels,
            config.out_channels,
            config.block_channels(),
            config
                .down
                .iter()
                .map(|l| l.blocks.len())
                .collect::<Vec<_>>(),
            config.transformer_depths(),
            config.context_dim,
            config.adm_in_channels,
            config.linear_projection,
            config.mid.is_some()
        );
        Ok(config)
    }

    /// Width of each level, level 0 first (SD: 320, 640, 1280, 1280).
    pub fn block_channels(&self) -> Vec<usize> {
        self.down.iter().map(LevelConfig::channels).collect()
    }

    /// Transformer depth of each down block, level 0 first (0: no transformer).
    pub fn transformer_depths(&self) -> Vec<Vec<usize>> {
        let depths = |l: &LevelConfig| {
            l.blocks
                .iter()
                .map(|b| b.attention.as_ref().map_or(0, |a| a.depth))
                .collect()
        };
        self.down.iter().map(depths).collect()
    }

    /// Transformer depth of each up block, execution order.
    pub fn up_transformer_depths(&self) -> Vec<Vec<usize>> {
        self.up
            .iter()
            .map(|l| {
                l.blocks
                    .iter()
                    .map(|b| b.attention.as_ref().map_or(0, |a| a.depth))
                    .collect()
            })
            .collect()
    }

    /// Latent pixels per deepest-level pixel along each axis: 2^(levels − 1). Latent sizes
    /// that are multiples of it keep every level's size exact.
    pub fn downscale_factor(&self) -> usize {
        1 << self.down.len().saturating_sub(1)
    }
}
