//! The BigVGAN waveform decoder (diffusers `MiniMaxH3AudioBigVGANDecoder`): `[T, latent_dim,
//! N]` → `[T · hop, 1, N]`, clamped to [-1, 1].
//!
//! `conv_pre` (7 taps) to `decoder_dim`; per stage i a transposed convolution (`ups.i.0`,
//! kernel K, stride r, padding (K − r)/2) halving the width, then the mean of the stage's
//! parallel AMP blocks; finally an anti-aliased SnakeBeta and `conv_post` (7 taps, no bias)
//! to one channel. An AMP block adds, per dilation d, `conv2(act2(conv1_d(act1(x))))` to x,
//! every activation an anti-aliased SnakeBeta.

use super::config::{MiniMaxH3AudioVaeConfig, ORIGIN};
use super::encoder::{expect_channels, same_conv};
use super::snake::AntiAliased;
use crate::ggml::Tensor;
use crate::nn::{Conv1d, ConvTranspose1d};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

#[derive(Clone, Debug)]
struct AmpBlock {
    /// Per dilation: (act1, conv1 dilated, act2, conv2).
    pairs: Vec<(AntiAliased, Conv1d, AntiAliased, Conv1d)>,
}

impl AmpBlock {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        channels: usize,
        dilations: &[usize],
    ) -> Result<Self, RunnerError> {
        let mut pairs = Vec::with_capacity(dilations.len());
        for (m, &d) in dilations.iter().enumerate() {
            let (w1, w2) = (wb.pp(format!("convs1.{m}")), wb.pp(format!("convs2.{m}")));
            let conv1 = same_conv(&w1, d)?;
            expect_channels(&w1, &conv1, channels, channels)?;
            let conv2 = same_conv(&w2, 1)?;
            expect_channels(&w2, &conv2, channels, channels)?;
            pairs.push((
                AntiAliased::new(&wb.pp(format!("activations.{}", 2 * m)), channels)?,
                conv1,
                AntiAliased::new(&wb.pp(format!("activations.{}", 2 * m + 1)), channels)?,
                conv2,
            ));
        }
        Ok(Self { pairs })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, mut x: Tensor<'g>, rev: Tensor<'g>) -> Tensor<'g> {
        for (act1, conv1, act2, conv2) in &self.pairs {
            let h = conv1.forward(g, act1.forward(g, x, rev));
            let h = conv2.forward(g, act2.forward(g, h, rev));
            x = g.add(h, x);
        }
        x
    }
}

#[derive(Clone, Debug)]
struct Stage {
    up: ConvTranspose1d,
    blocks: Vec<AmpBlock>,
}

#[derive(Clone, Debug)]
pub(super) struct Decoder {
    conv_pre: Conv1d,
    stages: Vec<Stage>,
    act_post: AntiAliased,
    conv_post: Conv1d,
    /// Length of every anti-aliasing upsampling filter (one reversal serves them all).
    up_kernel: usize,
}

impl Decoder {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &MiniMaxH3AudioVaeConfig,
    ) -> Result<Self, RunnerError> {
        let wb = wb.pp("decoder");
        let wp = wb.pp("conv_pre");
        let conv_pre = same_conv(&wp, 1)?;
        expect_channels(&wp, &conv_pre, c.latent_dim, c.decoder_dim)?;
        let per_stage = c.resblock_kernels.len();
        let mut width = c.decoder_dim;
        let mut stages = Vec::with_capacity(c.decoder_rates.len());
        for (i, (&rate, &k)) in c.decoder_rates.iter().zip(&c.decoder_kernels).enumerate() {
            let wu = wb.pp(format!("ups.{i}.0"));
            let up = ConvTranspose1d::from_weights(&wu, rate, k.saturating_sub(rate) / 2, ORIGIN)?;
            if up.in_channels != width || up.out_channels != width / 2 {
                return Err(RunnerError::ShapeMismatch {
                    key: wu.key("weight"),
                    origin: ORIGIN.into(),
                    expected: [k, width / 2, width, 1],
                    found: [up.kernel, up.out_channels, up.in_channels, 1],
                });
            }
            width /= 2;
            let blocks = c
                .resblock_dilations
                .iter()
                .enumerate()
                .map(|(j, d)| {
                    AmpBlock::new(&wb.pp(format!("resblocks.{}", i * per_stage + j)), width, d)
                })
                .collect::<Result<Vec<_>, _>>()?;
            stages.push(Stage { up, blocks });
        }
        let act_post = AntiAliased::new(&wb.pp("activation_post"), width)?;
        let wo = wb.pp("conv_post");
        let conv_post = same_conv(&wo, 1)?;
        expect_channels(&wo, &conv_post, width, 1)?;
        let up_kernel = act_post.up_kernel();
        let mismatched = stages
            .iter()
            .flat_map(|s| &s.blocks)
            .flat_map(|b| &b.pairs)
            .any(|(a1, _, a2, _)| a1.up_kernel() != up_kernel || a2.up_kernel() != up_kernel);
        if mismatched {
            return Err(RunnerError::BadData {
                key: wb.key("resblocks"),
                origin: ORIGIN.into(),
                reason: format!(
                    "upsampling filters of different lengths (activation_post: {up_kernel})"
                ),
            });
        }
        Ok(Self {
            conv_pre,
            stages,
            act_post,
            conv_post,
            up_kernel,
        })
    }

    /// x: `[T, latent_dim, N]` → `[T · hop, 1, N]` in [-1, 1].
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let rev = AntiAliased::reversal(g, self.up_kernel);
        let mut x = self.conv_pre.forward(g, x);
        for (i, stage) in self.stages.iter().enumerate() {
            x = stage.up.forward(g, x);
            let mut sum: Option<Tensor<'g>> = None;
            for block in &stage.blocks {
                let y = block.forward(g, x, rev);
                sum = Some(sum.map_or(y, |s| g.add(s, y)));
            }
            x = g.scale(sum.unwrap_or(x), 1.0 / stage.blocks.len().max(1) as f32);
            x = g.cut(&format!("minimax_h3_audio.decoder.{i}"), "x", x);
        }
        let y = self.conv_post.forward(g, self.act_post.forward(g, x, rev));
        g.clamp(y, -1.0, 1.0)
    }
}
