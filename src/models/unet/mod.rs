//! The Stable Diffusion UNet (diffusers `UNet2DConditionModel`, LDM `UNetModel`): SD1.x,
//! SD2.x, SDXL base and refiner, and distilled variants (SSD-1B, Vega: dropped blocks, uneven
//! transformer depths, no mid-block transformer).
//!
//! conv_in → down levels of (resnet, transformer) blocks with a stride-2 conv between levels
//! → mid block → up levels whose blocks each take one skip tensor (concatenated on channels)
//! with a nearest-2× upsampler between levels → GroupNorm, SiLU, conv_out. Every resnet adds
//! the timestep embedding (a sinusoid of width `model_channels` through an MLP, plus SDXL's
//! vector conditioning `y` through its own MLP); every transformer cross-attends to the text
//! context.
//!
//! Both checkpoint layouts load ([`UNetLayout`]); the structure comes from the tensors present
//! ([`UNetConfig::detect`]). The arithmetic is diffusers': resnet and output GroupNorms with eps
//! 1e-5 (`norm_eps`), the exact (erf) GELU in the GEGLU; stable-diffusion.cpp's kernels use
//! 1e-6 and the tanh GELU, differences at the level of rounding. Upstream requires latent sizes
//! that halve evenly at every level; other sizes follow diffusers' `upsample_size` (each
//! up-sampler resizes to its skip tensor).

mod blocks;
mod conditioning;
mod config;
mod layout;
mod transformer;

pub use conditioning::{refiner_time_ids, sdxl_time_ids};
pub use config::{
    AttentionConfig, BlockConfig, LevelConfig, MidConfig, UNetConfig, UNetHparams,
    CONV_PROJECTION_HEADS, DEFAULT_NORM_EPS, DEFAULT_NORM_GROUPS, LINEAR_PROJECTION_HEAD_DIM,
};
pub use layout::UNetLayout;

use crate::ggml::Tensor;
use crate::nn::{Conv2d, GroupNorm, Linear};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};
use crate::tensor::Ne;

use blocks::{Ctx, Downsample, ResBlock, Upsample};
use transformer::SpatialTransformer;

/// Period of the timestep sinusoid.
const MAX_PERIOD: i32 = 10_000;

/// `Linear → SiLU → Linear` (the timestep and vector-conditioning embedders).
#[derive(Clone, Copy, Debug)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        names: [&str; 2],
        d_in: usize,
        d_out: usize,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            fc1: Linear::new(&wb.pp(names[0]), d_in, d_out, true)?,
            fc2: Linear::new(&wb.pp(names[1]), d_out, d_out, true)?,
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.fc2.forward(g, g.silu(self.fc1.forward(g, x)))
    }
}

/// A resnet and its optional transformer.
#[derive(Clone, Debug)]
struct Block {
    resnet: ResBlock,
    attention: Option<SpatialTransformer>,
}

impl Block {
    fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        emb_act: Tensor<'g>,
        context: Tensor<'g>,
    ) -> Tensor<'g> {
        let h = self.resnet.forward(g, x, emb_act);
        match &self.attention {
            Some(attn) => attn.forward(g, h, context),
            None => h,
        }
    }
}

#[derive(Clone, Debug)]
struct DownLevel {
    blocks: Vec<Block>,
    downsample: Option<Downsample>,
}

#[derive(Clone, Debug)]
struct UpLevel {
    blocks: Vec<Block>,
    upsample: Option<Upsample>,
}

#[derive(Clone, Debug)]
struct Mid {
    resnet: ResBlock,
    stages: Vec<(SpatialTransformer, ResBlock)>,
}

/// A UNet: weight handles and sizes.
#[derive(Clone, Debug)]
pub struct UNet {
    config: UNetConfig,
    time_embed: Mlp,
    /// SDXL's vector-conditioning embedder.
    label_embed: Option<Mlp>,
    conv_in: Conv2d,
    down: Vec<DownLevel>,
    mid: Option<Mid>,
    /// Execution order.
    up: Vec<UpLevel>,
    norm_out: GroupNorm,
    conv_out: Conv2d,
}

fn input_error(name: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: name.into(),
        origin: "UNet inputs".into(),
        reason,
    }
}

impl UNet {
    /// Declares the weights `config` describes (see [`UNetConfig::detect`]).
    pub fn new(wb: &WeightBuilder<'_, '_>, config: UNetConfig) -> Result<Self, RunnerError> {
        let l = config.layout;
        let c = Ctx {
            layout: l,
            groups: config.norm_groups,
            eps: config.norm_eps,
            time_embed_dim: config.time_embed_dim,
        };
        let transformer = |a: &AttentionConfig, channels: usize| {
            SpatialTransformer::new(
                &wb.pp(&a.name),
                a,
                channels,
                config.context_dim,
                config.linear_projection,
                config.norm_groups,
            )
        };
        let block = |b: &BlockConfig, in_ch: usize| -> Result<Block, RunnerError> {
            Ok(Block {
                resnet: ResBlock::new(&c, &wb.pp(&b.resnet), in_ch, b.channels)?,
                attention: b
                    .attention
                    .as_ref()
                    .map(|a| transformer(a, b.channels))
                    .transpose()?,
            })
        };

        // Widths of the skip tensors, in the order the down path makes them.
        let mut width = config.model_channels;
        let mut skips = vec![width];
        let mut down = Vec::with_capacity(config.down.len());
        for level in &config.down {
            let mut blocks = Vec::with_capacity(level.blocks.len());
            for b in &level.blocks {
                blocks.push(block(b, width)?);
                width = b.channels;
                skips.push(width);
            }
            let downsample = match &level.resample {
                Some(path) => {
                    let conv = wb.pp(path).pp(l.downsample_conv());
                    skips.push(width);
                    Some(Downsample::new(&conv, width)?)
                }
                None => None,
            };
            down.push(DownLevel { blocks, downsample });
        }

        let mid = match &config.mid {
            None => None,
            Some(m) => {
                let resnet = ResBlock::new(&c, &wb.pp(&m.resnet), width, width)?;
                let stages = m
                    .stages
                    .iter()
                    .map(|(a, r)| {
                        Ok((
                            transformer(a, width)?,
                            ResBlock::new(&c, &wb.pp(r), width, width)?,
                        ))
                    })
                    .collect::<Result<Vec<_>, RunnerError>>()?;
                Some(Mid { resnet, stages })
            }
        };

        let mut up = Vec::with_capacity(config.up.len());
        for level in &config.up {
            let mut blocks = Vec::with_capacity(level.blocks.len());
            for b in &level.blocks {
                let skip = skips.pop().ok_or_else(|| {
                    wb.bad_data(
                        &b.resnet,
                        "UNet config",
                        "no skip tensor left for this block".into(),
                    )
                })?;
                blocks.push(block(b, width + skip)?);
                width = b.channels;
            }
            let upsample = match &level.resample {
                Some(path) => Some(Upsample::new(&wb.pp(path).pp("conv"), width)?),
                None => None,
            };
            up.push(UpLevel { blocks, upsample });
        }

        let label_embed = match config.adm_in_channels {
            Some(adm) => Some(Mlp::new(wb, l.label_embed(), adm, config.time_embed_dim)?),
            None => None,
        };
        Ok(Self {
            time_embed: Mlp::new(
                wb,
                l.time_embed(),
                config.model_channels,
                config.time_embed_dim,
            )?,
            label_embed,
            conv_in: Conv2d::new_matrix(
                &wb.pp(l.conv_in()),
                config.in_channels,
                config.model_channels,
                3,
                1,
                1,
                true,
            )?,
            down,
            mid,
            up,
            norm_out: c.group_norm(&wb.pp(l.norm_out()), width, config.norm_eps)?,
            conv_out: Conv2d::new_matrix(
                &wb.pp(l.conv_out()),
                width,
                config.out_channels,
                3,
                1,
                1,
                true,
            )?,
            config,
        })
    }

    pub fn config(&self) -> &UNetConfig {
        &self.config
    }

    /// Checks the shapes (ggml order) of one call's inputs, so that [`UNet::forward`] builds
    /// a valid graph: x [W, H, in_channels, B] (W, H ≥ 1), `timesteps` B values, context
    /// [context_dim, n ≥ 1, B or 1], y [adm_in_channels, B or 1] when given (only for a UNet
    /// with vector conditioning; without `y` such a UNet runs on the timestep alone, as
    /// upstream does).
    pub fn check_inputs(
        &self,
        x: Ne,
        timesteps: usize,
        context: Ne,
        y: Option<Ne>,
    ) -> Result<(), RunnerError> {
        let c = &self.config;
        let [w, h, ch, b] = x;
        if w == 0 || h == 0 || b == 0 || ch != c.in_channels {
            return Err(input_error(
                "x",
                format!("shape {x:?}; expected [W, H, {}, B]", c.in_channels),
            ));
        }
        if timesteps != b {
            return Err(input_error(
                "timesteps",
                format!("{timesteps} timesteps for a batch of {b}"),
            ));
        }
        let [cd, n, cb, c3] = context;
        if (cd != c.context_dim && c.context_dim != 0) || n == 0 || (cb != b && cb != 1) || c3 != 1
        {
            return Err(input_error(
                "context",
                format!(
                    "shape {context:?}; expected [{}, n, {b} or 1]",
                    c.context_dim
                ),
            ));
        }
        match (y, c.adm_in_channels) {
            (None, _) => Ok(()),
            (Some(_), None) => Err(input_error(
                "y",
                "this UNet takes no vector conditioning".into(),
            )),
            (Some(ne), Some(adm)) => {
                if ne[0] != adm || (ne[1] != b && ne[1] != 1) || ne[2] != 1 || ne[3] != 1 {
                    Err(input_error(
                        "y",
                        format!("shape {ne:?}; expected [{adm}, {b} or 1]"),
                    ))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The prediction (ε or v, as the model was trained) [W, H, out_channels, B] for
    /// x [W, H, in_channels, B], f32 DDPM `timesteps` [B], text `context` [context_dim, n, B]
    /// and SDXL's vector conditioning `y` [adm_in_channels, B] (see
    /// [`UNetConfig::adm_vector`]). A context or `y` with batch 1 is shared by the whole batch.
    /// Check the shapes with [`UNet::check_inputs`] first. Marks a graph cut after conv_in,
    /// every down block, the mid block and every up block (`unet.down.{level}.{block}`, ...).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        timesteps: Tensor<'g>,
        context: Tensor<'g>,
        y: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        let batch = x.ne()[3];
        let context = broadcast_batch(g, context, 2, batch);

        let t = g.reshape(g.cont(timesteps), [batch, 1, 1, 1]);
        let t = g.timestep_embedding(t, self.config.model_channels, MAX_PERIOD);
        let mut emb = self.time_embed.forward(g, t);
        if let (Some(label), Some(y)) = (&self.label_embed, y) {
            emb = g.add(emb, label.forward(g, broadcast_batch(g, y, 1, batch)));
        }
        // Every resnet projects SiLU(emb): computed once.
        let emb_act = g.silu(emb);

        let mut h = g.cut("unet.conv_in", "h", self.conv_in.forward(g, x));
        let mut skips = vec![h];
        for (i, level) in self.down.iter().enumerate() {
            for (j, block) in level.blocks.iter().enumerate() {
                h = block.forward(g, h, emb_act, context);
                h = g.cut(&format!("unet.down.{i}.{j}"), "h", h);
                skips.push(h);
            }
            if let Some(down) = &level.downsample {
                h = down.forward(g, h);
                skips.push(h);
            }
        }
        if let Some(mid) = &self.mid {
            h = mid.resnet.forward(g, h, emb_act);
            for (attn, resnet) in &mid.stages {
                h = resnet.forward(g, attn.forward(g, h, context), emb_act);
            }
            h = g.cut("unet.mid", "h", h);
        }
        for (i, level) in self.up.iter().enumerate() {
            let last = level.blocks.len() - 1;
            for (j, block) in level.blocks.iter().enumerate() {
                let skip = skips.pop().expect("the skeleton check balances skips");
                h = block.forward(g, g.concat(h, skip, 2), emb_act, context);
                if j == last {
                    if let (Some(up), Some(next)) = (&level.upsample, skips.last()) {
                        let [w, hh, _, _] = next.ne();
                        h = up.forward(g, h, (w, hh));
                    }
                }
                h = g.cut(&format!("unet.up.{i}.{j}"), "h", h);
            }
        }
        self.conv_out.forward(g, self.norm_out.forward_silu(g, h))
    }
}

/// `t` repeated along axis `axis` (its batch axis) to `batch` when it has batch 1.
fn broadcast_batch<'g>(
    g: &'g GraphCtx<'g>,
    t: Tensor<'g>,
    axis: usize,
    batch: usize,
) -> Tensor<'g> {
    let mut ne = t.ne();
    if ne[axis] == batch {
        return t;
    }
    ne[axis] = batch;
    g.repeat(t, g.new_tensor(crate::dtype::DType::F32, ne))
}
