//! Wan 2.2 encoder and decoder stacks, and their single-image forward on `[W, H, C, N]` (ggml
//! order; patchified pixels in, patchified pixels out).
//!
//! Each level is one residual block: resnets, then (all levels but the last) the resampling
//! conv, plus the parameter-free shortcut from the block input (channel averaging down,
//! duplication up). On one frame the temporal convs never run (diffusers' first chunk only
//! starts their history), but the shortcuts' temporal factors still shape the result; the
//! `time_conv` weights are declared only for video (`Wan22VaeConfig::video`), whose path
//! (`super::video`) walks these same stacks frame-causally.

use crate::ggml::{ScaleMode, Tensor};
use crate::models::vae::qwen_image_2_1_vae::blocks::{ChannelNorm, Conv, MidBlock, ResidualBlock};
use crate::models::vae::qwen_image_2_1_vae::layout::{Names, Part};
use crate::models::vae::qwen_image_2_1_vae::shortcuts::Shortcut;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::{Wan22VaeConfig, ORIGIN};

/// One encoder level.
#[derive(Clone, Debug)]
pub(super) struct DownLevel {
    pub(super) resnets: Vec<ResidualBlock>,
    /// Zero-pad right/bottom + 3×3 stride-2 conv (all levels but the last).
    pub(super) resample: Option<Conv>,
    /// The `downsample3d` temporal conv, loaded for video only.
    pub(super) time_conv: Option<Conv>,
    /// `AvgDown3D` from the level input.
    pub(super) shortcut: Shortcut,
}

/// One decoder level.
#[derive(Clone, Debug)]
pub(super) struct UpLevel {
    pub(super) resnets: Vec<ResidualBlock>,
    /// Nearest 2× + 3×3 conv, and the `DupUp3D` shortcut from the level input (all levels but
    /// the last).
    pub(super) upsample: Option<(Conv, Shortcut)>,
    /// The `upsample3d` temporal conv (to twice the width), loaded for video only.
    pub(super) time_conv: Option<Conv>,
}

/// The temporal conv under `resampler` ([O, I, 3, 1, 1] in PyTorch), when video is asked for
/// and the level resamples in time.
fn time_conv(
    wb: &WeightBuilder<'_, '_>,
    config: &Wan22VaeConfig,
    temporal: bool,
    resampler: &str,
    in_ch: usize,
    out_ch: usize,
) -> Result<Option<Conv>, RunnerError> {
    if !config.video || !temporal {
        return Ok(None);
    }
    Conv::new(&wb.pp(resampler).pp("time_conv"), in_ch, out_ch, 1, 1, 0).map(Some)
}

/// The encoder: patchified image [W, H, C_in, N] → moments [W/f, H/f, 2·z, N] (before
/// `quant_conv`).
#[derive(Clone, Debug)]
pub(super) struct Encoder {
    pub(super) conv_in: Conv,
    pub(super) levels: Vec<DownLevel>,
    pub(super) mid: MidBlock,
    pub(super) norm_out: ChannelNorm,
    pub(super) conv_out: Conv,
}

impl Encoder {
    pub fn new(
        names: &Names,
        wb: &WeightBuilder<'_, '_>,
        config: &Wan22VaeConfig,
    ) -> Result<Self, RunnerError> {
        let dims = &config.encoder_channels;
        let count = dims.len() - 1;
        let mut levels = Vec::with_capacity(count);
        for i in 0..count {
            let (in_ch, out_ch) = (dims[i], dims[i + 1]);
            let down = i + 1 < count;
            let temporal = down && config.temporal_down[i];
            let resnets = ResidualBlock::stack(names, wb, config.res_blocks, in_ch, out_ch, |j| {
                names.down_resnet(i, j)
            })?;
            let (resample, time_conv) = if down {
                let path = wb.pp(names.downsampler(i)).pp("resample.1");
                (
                    Some(Conv::new(&path, out_ch, out_ch, 3, 2, 0)?),
                    time_conv(wb, config, temporal, &names.downsampler(i), out_ch, out_ch)?,
                )
            } else {
                (None, None)
            };
            let shortcut = Shortcut {
                in_ch,
                out_ch,
                factor_t: if temporal { 2 } else { 1 },
                factor_s: if down { 2 } else { 1 },
            };
            shortcut.check_down(&wb.key(&names.down_resnet(i, 0)), ORIGIN)?;
            levels.push(DownLevel {
                resnets,
                resample,
                time_conv,
                shortcut,
            });
        }
        let top = dims[count];
        let part = Part::Encoder;
        Ok(Self {
            conv_in: Conv::new(
                &wb.pp(names.conv_in(part)),
                config.in_channels,
                dims[0],
                3,
                1,
                1,
            )?,
            levels,
            mid: MidBlock::new(names, wb, part, top)?,
            norm_out: ChannelNorm::new(&wb.pp(names.norm_out(part)), top)?,
            conv_out: Conv::new(&wb.pp(names.conv_out(part)), top, 2 * config.z_dim, 3, 1, 1)?,
        })
    }

    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.conv_in.forward(g, x);
        for (i, level) in self.levels.iter().enumerate() {
            let mut h = level.resnets.iter().fold(x, |h, r| r.forward(g, h));
            if let Some(conv) = &level.resample {
                // ZeroPad2d((0, 1, 0, 1)): right and bottom only, then the stride-2 conv.
                h = conv.forward(g, g.pad(h, [(0, 1), (0, 1), (0, 0), (0, 0)]));
            }
            x = g.add(h, level.shortcut.down(g, x));
            x = g.cut(&format!("wan22_vae.encoder.down.{i}"), "x", x);
        }
        x = self.mid.forward(g, x);
        x = g.cut("wan22_vae.encoder.mid", "x", x);
        self.conv_out
            .forward(g, g.silu(self.norm_out.forward(g, x)))
    }
}

/// The decoder: latent [w, h, z, N] (after `post_quant_conv`) → patchified image
/// [f·w, f·h, C_out, N].
#[derive(Clone, Debug)]
pub(super) struct Decoder {
    pub(super) conv_in: Conv,
    pub(super) mid: MidBlock,
    pub(super) levels: Vec<UpLevel>,
    pub(super) norm_out: ChannelNorm,
    pub(super) conv_out: Conv,
}

impl Decoder {
    pub fn new(
        names: &Names,
        wb: &WeightBuilder<'_, '_>,
        config: &Wan22VaeConfig,
    ) -> Result<Self, RunnerError> {
        let dims = &config.decoder_channels;
        let count = dims.len() - 1;
        let mut levels = Vec::with_capacity(count);
        for i in 0..count {
            // Unlike Wan 2.1, the upsampler keeps the width: level i starts from dims[i].
            let (in_ch, out_ch) = (dims[i], dims[i + 1]);
            let up = i + 1 < count;
            let temporal = up && config.temporal_up[i];
            let resnets =
                ResidualBlock::stack(names, wb, config.res_blocks + 1, in_ch, out_ch, |j| {
                    names.up_resnet(i, j)
                })?;
            let (upsample, time_conv) = if up {
                let path = wb.pp(names.upsampler(i)).pp("resample.1");
                let shortcut = Shortcut {
                    in_ch,
                    out_ch,
                    factor_t: if temporal { 2 } else { 1 },
                    factor_s: 2,
                };
                shortcut.check_up(&wb.key(&names.up_resnet(i, 0)), ORIGIN)?;
                (
                    Some((Conv::new(&path, out_ch, out_ch, 3, 1, 1)?, shortcut)),
                    // Twice the width: each output's halves become two frames.
                    time_conv(
                        wb,
                        config,
                        temporal,
                        &names.upsampler(i),
                        out_ch,
                        2 * out_ch,
                    )?,
                )
            } else {
                (None, None)
            };
            levels.push(UpLevel {
                resnets,
                upsample,
                time_conv,
            });
        }
        let last = dims[count];
        let part = Part::Decoder;
        Ok(Self {
            conv_in: Conv::new(&wb.pp(names.conv_in(part)), config.z_dim, dims[0], 3, 1, 1)?,
            mid: MidBlock::new(names, wb, part, dims[0])?,
            levels,
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
        x = g.cut("wan22_vae.decoder.mid", "x", x);
        for (i, level) in self.levels.iter().enumerate() {
            let mut h = level.resnets.iter().fold(x, |h, r| r.forward(g, h));
            if let Some((conv, shortcut)) = &level.upsample {
                let [w, hh, c, n] = h.ne();
                h = conv.forward(
                    g,
                    g.interpolate(h, [2 * w, 2 * hh, c, n], ScaleMode::Nearest),
                );
                h = g.add(h, shortcut.up(g, x, &shortcut_ids(i)));
            }
            x = g.cut(&format!("wan22_vae.decoder.up.{i}"), "x", h);
        }
        self.conv_out
            .forward(g, g.silu(self.norm_out.forward(g, x)))
    }
}

/// Name of the index input of decoder level `i`'s duplicating shortcut.
pub(super) fn shortcut_ids(i: usize) -> String {
    format!("wan22_vae.decoder.up.{i}.shortcut_ids")
}
