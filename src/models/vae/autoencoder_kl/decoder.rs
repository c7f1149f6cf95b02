//! The decoder: latent `[w, h, C_lat, N]` → image `[w·f, h·f, C_out, N]` (raw, about [-1, 1]).

use crate::ggml::Tensor;
use crate::nn::{Conv2d, GroupNorm};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::blocks::{Ctx, MidBlock, ResnetBlock, Upsample};
use super::layout::Part;
use super::AutoencoderKlConfig;

#[derive(Clone, Debug)]
struct UpLevel {
    resnets: Vec<ResnetBlock>,
    upsample: Option<Upsample>,
}

#[derive(Clone, Debug)]
pub(crate) struct Decoder {
    post_quant_conv: Option<Conv2d>,
    conv_in: Conv2d,
    mid: MidBlock,
    /// In execution order: deepest level first.
    levels: Vec<UpLevel>,
    norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl Decoder {
    pub fn new(
        c: &Ctx,
        wb: &WeightBuilder<'_, '_>,
        config: &AutoencoderKlConfig,
    ) -> Result<Self, RunnerError> {
        let n = &c.names;
        let ch = &config.block_out_channels;
        let last = ch.len() - 1;
        let lat = config.latent_channels;
        let post_quant_conv = if config.post_quant_conv {
            Some(Conv2d::new(
                &wb.pp("post_quant_conv"),
                lat,
                lat,
                1,
                1,
                0,
                true,
            )?)
        } else {
            None
        };
        let conv_in = Conv2d::new(
            &wb.pp(n.conv_in(Part::Decoder)),
            lat,
            ch[last],
            3,
            1,
            1,
            true,
        )?;
        let mid = MidBlock::new(c, wb, Part::Decoder, ch[last], config.mid_attention)?;
        let mut levels = Vec::with_capacity(ch.len());
        let mut width = ch[last];
        for level in (0..ch.len()).rev() {
            let out = ch[level];
            let mut resnets = Vec::with_capacity(config.layers_per_block + 1);
            for j in 0..=config.layers_per_block {
                resnets.push(ResnetBlock::new(
                    c,
                    &wb.pp(n.up_resnet(level, j)),
                    width,
                    out,
                )?);
                width = out;
            }
            let upsample = if level > 0 {
                Some(Upsample::new(&wb.pp(n.upsample(level)), out)?)
            } else {
                None
            };
            levels.push(UpLevel { resnets, upsample });
        }
        Ok(Self {
            post_quant_conv,
            conv_in,
            mid,
            levels,
            norm_out: c.group_norm(&wb.pp(n.norm_out(Part::Decoder)), ch[0])?,
            conv_out: Conv2d::new(
                &wb.pp(n.conv_out(Part::Decoder)),
                ch[0],
                config.out_channels,
                3,
                1,
                1,
                true,
            )?,
        })
    }

    /// z: [w, h, C_lat, N] (already divided by the scaling factor) → [W, H, C_out, N].
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let z = match &self.post_quant_conv {
            Some(conv) => conv.forward(g, z),
            None => z,
        };
        let mut x = self.conv_in.forward(g, z);
        x = g.cut("vae.decoder.mid", "x", self.mid.forward(g, x));
        for (i, level) in self.levels.iter().enumerate() {
            for resnet in &level.resnets {
                x = resnet.forward(g, x);
            }
            if let Some(up) = &level.upsample {
                x = up.forward(g, x);
            }
            x = g.cut(&format!("vae.decoder.up.{i}"), "x", x);
        }
        self.conv_out.forward(g, self.norm_out.forward_silu(g, x))
    }
}
