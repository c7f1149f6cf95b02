//! The encoder: image `[W, H, C_in, N]` → posterior moments `[W/f, H/f, 2·C_lat, N]`.

use crate::ggml::Tensor;
use crate::nn::{Conv2d, GroupNorm};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::blocks::{Ctx, Downsample, MidBlock, ResnetBlock};
use super::layout::Part;
use super::AutoencoderKlConfig;

#[derive(Clone, Debug)]
struct DownLevel {
    resnets: Vec<ResnetBlock>,
    downsample: Option<Downsample>,
}

#[derive(Clone, Debug)]
pub(crate) struct Encoder {
    conv_in: Conv2d,
    levels: Vec<DownLevel>,
    mid: MidBlock,
    norm_out: GroupNorm,
    conv_out: Conv2d,
    quant_conv: Option<Conv2d>,
}

impl Encoder {
    pub fn new(
        c: &Ctx,
        wb: &WeightBuilder<'_, '_>,
        config: &AutoencoderKlConfig,
    ) -> Result<Self, RunnerError> {
        let n = &c.names;
        let ch = &config.block_out_channels;
        let last = ch.len() - 1;
        let moments = 2 * config.latent_channels;
        let conv_in = Conv2d::new(
            &wb.pp(n.conv_in(Part::Encoder)),
            config.in_channels,
            ch[0],
            3,
            1,
            1,
            true,
        )?;
        let mut levels = Vec::with_capacity(ch.len());
        let mut width = ch[0];
        for (level, &out) in ch.iter().enumerate() {
            let mut resnets = Vec::with_capacity(config.layers_per_block);
            for j in 0..config.layers_per_block {
                resnets.push(ResnetBlock::new(
                    c,
                    &wb.pp(n.down_resnet(level, j)),
                    width,
                    out,
                )?);
                width = out;
            }
            let downsample = if level < last {
                Some(Downsample::new(&wb.pp(n.downsample(level)), out)?)
            } else {
                None
            };
            levels.push(DownLevel {
                resnets,
                downsample,
            });
        }
        let quant_conv = if config.quant_conv {
            Some(Conv2d::new(
                &wb.pp("quant_conv"),
                moments,
                moments,
                1,
                1,
                0,
                true,
            )?)
        } else {
            None
        };
        Ok(Self {
            conv_in,
            levels,
            mid: MidBlock::new(c, wb, Part::Encoder, ch[last], config.mid_attention)?,
            norm_out: c.group_norm(&wb.pp(n.norm_out(Part::Encoder)), ch[last])?,
            conv_out: Conv2d::new(
                &wb.pp(n.conv_out(Part::Encoder)),
                ch[last],
                moments,
                3,
                1,
                1,
                true,
            )?,
            quant_conv,
        })
    }

    /// x: [W, H, C_in, N] → moments [W', H', 2·C_lat, N] (mean channels first).
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.conv_in.forward(g, x);
        for (i, level) in self.levels.iter().enumerate() {
            for resnet in &level.resnets {
                x = resnet.forward(g, x);
            }
            if let Some(down) = &level.downsample {
                x = down.forward(g, x);
            }
            x = g.cut(&format!("vae.encoder.down.{i}"), "x", x);
        }
        x = g.cut("vae.encoder.mid", "x", self.mid.forward(g, x));
        let x = self.conv_out.forward(g, self.norm_out.forward_silu(g, x));
        match &self.quant_conv {
            Some(conv) => conv.forward(g, x),
            None => x,
        }
    }
}
