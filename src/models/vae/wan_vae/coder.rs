//! Wan 2.1 encoder and decoder stacks on single images `[W, H, C, N]` (ggml order).
//!
//! On one frame the temporal convs of `downsample3d` / `upsample3d` never run (diffusers' first
//! chunk only fills the cache), so every level is spatial: resnets, then a zero-pad + stride-2
//! conv (encoder) or nearest 2× + conv to half the width (decoder). Their `time_conv` weights
//! are declared only for video (`WanVaeConfig::video`); the video path (`super::video`) walks
//! these same stacks frame-causally.

use crate::ggml::{ScaleMode, Tensor};
use crate::models::vae::qwen_image_2_1_vae::blocks::{ChannelNorm, Conv, MidBlock, ResidualBlock};
use crate::models::vae::qwen_image_2_1_vae::layout::Part;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::layout::WanNames;
use super::WanVaeConfig;

/// One level: resnets, then the resampling conv (all levels but the last).
#[derive(Clone, Debug)]
pub(super) struct Level {
    pub(super) resnets: Vec<ResidualBlock>,
    pub(super) resample: Option<Conv>,
    /// The temporal conv of a `downsample3d` / `upsample3d` resampler, loaded for video only.
    pub(super) time_conv: Option<Conv>,
}

impl Level {
    fn resnets<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.resnets.iter().fold(x, |h, r| r.forward(g, h))
    }
}

/// The `time_conv` under `resampler` ([O, I, 3, 1, 1] in PyTorch), when video is asked for and
/// the level resamples in time (the weight is present: diffusers' `temperal_downsample`).
fn time_conv(
    wb: &WeightBuilder<'_, '_>,
    config: &WanVaeConfig,
    resampler: &str,
    in_ch: usize,
    out_ch: usize,
) -> Result<Option<Conv>, RunnerError> {
    let wb = wb.pp(resampler).pp("time_conv");
    if !config.video || !wb.contains("weight") {
        return Ok(None);
    }
    Conv::new(&wb, in_ch, out_ch, 1, 1, 0).map(Some)
}

/// The encoder: image [W, H, C_in, N] → moments [W/f, H/f, 2·z, N] (before `quant_conv`).
#[derive(Clone, Debug)]
pub(crate) struct Encoder {
    pub(super) conv_in: Conv,
    pub(super) levels: Vec<Level>,
    pub(super) mid: MidBlock,
    pub(super) norm_out: ChannelNorm,
    pub(super) conv_out: Conv,
}

impl Encoder {
    pub fn new(
        names: &WanNames,
        wb: &WeightBuilder<'_, '_>,
        config: &WanVaeConfig,
    ) -> Result<Self, RunnerError> {
        let shared = names.shared();
        let dims = &config.encoder_channels;
        let count = dims.len() - 1;
        let mut levels = Vec::with_capacity(count);
        for i in 0..count {
            let (in_ch, out_ch) = (dims[i], dims[i + 1]);
            let resnets =
                ResidualBlock::stack(&shared, wb, config.res_blocks, in_ch, out_ch, |j| {
                    names.down_resnet(i, j)
                })?;
            let (resample, time_conv) = if i + 1 < count {
                let path = wb.pp(names.downsampler(i)).pp("resample.1");
                (
                    Some(Conv::new(&path, out_ch, out_ch, 3, 2, 0)?),
                    time_conv(wb, config, &names.downsampler(i), out_ch, out_ch)?,
                )
            } else {
                (None, None)
            };
            levels.push(Level {
                resnets,
                resample,
                time_conv,
            });
        }
        let top = dims[count];
        let part = Part::Encoder;
        Ok(Self {
            conv_in: Conv::new(
                &wb.pp(shared.conv_in(part)),
                config.in_channels,
                dims[0],
                3,
                1,
                1,
            )?,
            levels,
            mid: MidBlock::new(&shared, wb, part, top)?,
            norm_out: ChannelNorm::new(&wb.pp(shared.norm_out(part)), top)?,
            conv_out: Conv::new(
                &wb.pp(shared.conv_out(part)),
                top,
                2 * config.z_dim,
                3,
                1,
                1,
            )?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.conv_in.forward(g, x);
        for (i, level) in self.levels.iter().enumerate() {
            x = level.resnets(g, x);
            if let Some(conv) = &level.resample {
                // ZeroPad2d((0, 1, 0, 1)): right and bottom only, then the stride-2 conv.
                x = conv.forward(g, g.pad(x, [(0, 1), (0, 1), (0, 0), (0, 0)]));
            }
            x = g.cut(&format!("wan_vae.encoder.down.{i}"), "x", x);
        }
        x = self.mid.forward(g, x);
        x = g.cut("wan_vae.encoder.mid", "x", x);
        self.conv_out
            .forward(g, g.silu(self.norm_out.forward(g, x)))
    }
}

/// The decoder: latent [w, h, z, N] (after `post_quant_conv`) → image [f·w, f·h, C_out, N].
#[derive(Clone, Debug)]
pub(crate) struct Decoder {
    pub(super) conv_in: Conv,
    pub(super) mid: MidBlock,
    pub(super) levels: Vec<Level>,
    pub(super) norm_out: ChannelNorm,
    pub(super) conv_out: Conv,
}

impl Decoder {
    pub fn new(
        names: &WanNames,
        wb: &WeightBuilder<'_, '_>,
        config: &WanVaeConfig,
    ) -> Result<Self, RunnerError> {
        let shared = names.shared();
        let dims = &config.decoder_channels;
        let count = dims.len() - 1;
        let mut levels = Vec::with_capacity(count);
        for i in 0..count {
            // Each upsampler halves the width, so later levels start from half the previous.
            let in_ch = if i == 0 { dims[0] } else { dims[i] / 2 };
            let out_ch = dims[i + 1];
            let resnets =
                ResidualBlock::stack(&shared, wb, config.res_blocks + 1, in_ch, out_ch, |j| {
                    names.up_resnet(i, j)
                })?;
            let (resample, time_conv) = if i + 1 < count {
                let path = wb.pp(names.upsampler(i)).pp("resample.1");
                (
                    Some(Conv::new(&path, out_ch, out_ch / 2, 3, 1, 1)?),
                    // Twice the width: each output's halves become two frames.
                    time_conv(wb, config, &names.upsampler(i), out_ch, 2 * out_ch)?,
                )
            } else {
                (None, None)
            };
            levels.push(Level {
                resnets,
                resample,
                time_conv,
            });
        }
        let last = dims[count];
        let part = Part::Decoder;
        Ok(Self {
            conv_in: Conv::new(&wb.pp(shared.conv_in(part)), config.z_dim, dims[0], 3, 1, 1)?,
            mid: MidBlock::new(&shared, wb, part, dims[0])?,
            levels,
            norm_out: ChannelNorm::new(&wb.pp(shared.norm_out(part)), last)?,
            conv_out: Conv::new(
                &wb.pp(shared.conv_out(part)),
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
        x = g.cut("wan_vae.decoder.mid", "x", x);
        for (i, level) in self.levels.iter().enumerate() {
            x = level.resnets(g, x);
            if let Some(conv) = &level.resample {
                let [w, h, c, n] = x.ne();
                let up = g.interpolate(x, [2 * w, 2 * h, c, n], ScaleMode::Nearest);
                x = conv.forward(g, up);
            }
            x = g.cut(&format!("wan_vae.decoder.up.{i}"), "x", x);
        }
        self.conv_out
            .forward(g, g.silu(self.norm_out.forward(g, x)))
    }
}
