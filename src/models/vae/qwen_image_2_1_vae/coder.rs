//! Encoder and decoder stacks: residual down/up blocks with their parameter-free shortcuts.

use crate::ggml::{ScaleMode, Tensor};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::blocks::{ChannelNorm, Conv, MidBlock, ResidualBlock};
use super::layout::{Names, Part};
use super::shortcuts::Shortcut;
use super::{QwenImage21VaeConfig, ORIGIN};

/// One encoder level: resnets, an optional stride-2 downsampler, and the averaging shortcut
/// from the block input.
#[derive(Clone, Debug)]
struct DownBlock {
    resnets: Vec<ResidualBlock>,
    downsampler: Option<Conv>,
    shortcut: Shortcut,
}

impl DownBlock {
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut h = x;
        for r in &self.resnets {
            h = r.forward(g, h);
        }
        if let Some(conv) = &self.downsampler {
            // Zero-pad right and bottom, then a 3×3 stride-2 conv.
            h = conv.forward(g, g.pad(h, [(0, 1), (0, 1), (0, 0), (0, 0)]));
        }
        g.add(h, self.shortcut.down(g, x))
    }
}

/// The encoder: image [W, H, C_in, N] → moments [W/f, H/f, 2·z, N] (before `quant_conv`).
#[derive(Clone, Debug)]
pub(crate) struct Encoder {
    conv_in: Conv,
    blocks: Vec<DownBlock>,
    mid: MidBlock,
    norm_out: ChannelNorm,
    conv_out: Conv,
}

impl Encoder {
    pub fn new(
        names: &Names,
        wb: &WeightBuilder<'_, '_>,
        config: &QwenImage21VaeConfig,
    ) -> Result<Self, RunnerError> {
        let dims = &config.encoder_channels;
        let levels = dims.len() - 1;
        let part = Part::Encoder;
        let mut blocks = Vec::with_capacity(levels);
        for i in 0..levels {
            let (in_ch, out_ch) = (dims[i], dims[i + 1]);
            let resnets = ResidualBlock::stack(names, wb, config.res_blocks, in_ch, out_ch, |j| {
                names.down_resnet(i, j)
            })?;
            let down = i + 1 < levels;
            let downsampler = if down {
                let path = wb.pp(names.downsampler(i)).pp("resample.1");
                Some(Conv::new(&path, out_ch, out_ch, 3, 2, 0)?)
            } else {
                None
            };
            let shortcut = Shortcut {
                in_ch,
                out_ch,
                factor_t: if down && config.temporal_down[i] {
                    2
                } else {
                    1
                },
                factor_s: if down { 2 } else { 1 },
            };
            shortcut.check_down(&wb.key(&names.down_resnet(i, 0)), ORIGIN)?;
            blocks.push(DownBlock {
                resnets,
                downsampler,
                shortcut,
            });
        }
        let top = dims[levels];
        Ok(Self {
            conv_in: Conv::new(
                &wb.pp(names.conv_in(part)),
                config.in_channels,
                dims[0],
                3,
                1,
                1,
            )?,
            blocks,
            mid: MidBlock::new(names, wb, part, top)?,
            norm_out: ChannelNorm::new(&wb.pp(names.norm_out(part)), top)?,
            conv_out: Conv::new(&wb.pp(names.conv_out(part)), top, 2 * config.z_dim, 3, 1, 1)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.conv_in.forward(g, x);
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(g, x);
            x = g.cut(&format!("qwen_vae.encoder.down.{i}"), "x", x);
        }
        x = self.mid.forward(g, x);
        x = g.cut("qwen_vae.encoder.mid", "x", x);
        self.conv_out
            .forward(g, g.silu(self.norm_out.forward(g, x)))
    }
}

/// One decoder level: resnets, then (except the last level) nearest 2× + conv and the
/// duplicating shortcut from the block input.
#[derive(Clone, Debug)]
struct UpBlock {
    resnets: Vec<ResidualBlock>,
    upsample: Option<(Conv, Shortcut)>,
}

impl UpBlock {
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, index: usize) -> Tensor<'g> {
        let mut h = x;
        for r in &self.resnets {
            h = r.forward(g, h);
        }
        match &self.upsample {
            Some((conv, shortcut)) => {
                let [w, hh, c, n] = h.ne();
                let up = g.interpolate(h, [2 * w, 2 * hh, c, n], ScaleMode::Nearest);
                let h = conv.forward(g, up);
                let name = format!("qwen_vae.decoder.up.{index}.shortcut_ids");
                g.add(h, shortcut.up(g, x, &name))
            }
            None => h,
        }
    }
}

/// The decoder: latent [w, h, z, N] (after `post_quant_conv`) → image [16w, 16h, C_out, N].
#[derive(Clone, Debug)]
pub(crate) struct Decoder {
    conv_in: Conv,
    mid: MidBlock,
    blocks: Vec<UpBlock>,
    norm_out: ChannelNorm,
    conv_out: Conv,
}

impl Decoder {
    pub fn new(
        names: &Names,
        wb: &WeightBuilder<'_, '_>,
        config: &QwenImage21VaeConfig,
    ) -> Result<Self, RunnerError> {
        let dims = &config.decoder_channels;
        let levels = dims.len() - 1;
        let part = Part::Decoder;
        let mut blocks = Vec::with_capacity(levels);
        for i in 0..levels {
            let (in_ch, out_ch) = (dims[i], dims[i + 1]);
            let resnets =
                ResidualBlock::stack(names, wb, config.res_blocks + 1, in_ch, out_ch, |j| {
                    names.up_resnet(i, j)
                })?;
            let upsample = if i + 1 < levels {
                let path = wb.pp(names.upsampler(i)).pp("resample.1");
                let conv = Conv::new(&path, out_ch, out_ch, 3, 1, 1)?;
                let shortcut = Shortcut {
                    in_ch,
                    out_ch,
                    factor_t: if config.temporal_up[i] { 2 } else { 1 },
                    factor_s: 2,
                };
                shortcut.check_up(&wb.key(&names.up_resnet(i, 0)), ORIGIN)?;
                Some((conv, shortcut))
            } else {
                None
            };
            blocks.push(UpBlock { resnets, upsample });
        }
        let last = dims[levels];
        Ok(Self {
            conv_in: Conv::new(&wb.pp(names.conv_in(part)), config.z_dim, dims[0], 3, 1, 1)?,
            mid: MidBlock::new(names, wb, part, dims[0])?,
            blocks,
            norm_out: ChannelNorm::new(&wb.pp(names.norm_out(part)), last)?,
            conv_out: Conv::new(
                &wb.pp(names.conv_out(part)),
                last,
                config.out_channels,
                3,
                1,
                1,
            )?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.conv_in.forward(g, z);
        x = self.mid.forward(g, x);
        x = g.cut("qwen_vae.decoder.mid", "x", x);
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(g, x, i);
            x = g.cut(&format!("qwen_vae.decoder.up.{i}"), "x", x);
        }
        self.conv_out
            .forward(g, g.silu(self.norm_out.forward(g, x)))
    }
}
