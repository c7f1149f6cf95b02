//! The DAC-style waveform encoder (diffusers `MiniMaxH3AudioEncoder`): `[T, 1, N]` →
//! `[T / hop, latent_dim, N]`.
//!
//! `block.0` is a 7-tap convolution to `encoder_dim`; each `block.i` (i = 1..=n) is three
//! residual units (Snake → dilated conv → Snake → 1×1 conv, dilations 1, 3, 9) on half its
//! width, Snake, and a strided convolution (kernel 2s, padding ⌈s/2⌉) that doubles the width;
//! then Snake and a 3-tap convolution to `latent_dim`.

use super::config::{MiniMaxH3AudioVaeConfig, ENCODER_UNIT_DILATIONS, ORIGIN};
use super::snake::Snake;
use crate::ggml::Tensor;
use crate::nn::Conv1d;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

/// A 1-D convolution whose sizes come from its weight, with "same" padding for its kernel and
/// `dilation` (what every stride-1 convolution of the model uses).
pub(super) fn same_conv(
    wb: &WeightBuilder<'_, '_>,
    dilation: usize,
) -> Result<Conv1d, RunnerError> {
    let conv = Conv1d::from_weights(wb, ORIGIN)?;
    Ok(conv.with(1, (conv.kernel - 1) * dilation / 2, dilation))
}

/// Checks a convolution's channels against the widths the block structure implies.
pub(super) fn expect_channels(
    wb: &WeightBuilder<'_, '_>,
    conv: &Conv1d,
    input: usize,
    output: usize,
) -> Result<(), RunnerError> {
    if conv.in_channels != input || conv.out_channels != output {
        return Err(RunnerError::ShapeMismatch {
            key: wb.key("weight"),
            origin: ORIGIN.into(),
            expected: [conv.kernel, input, output, 1],
            found: [conv.kernel, conv.in_channels, conv.out_channels, 1],
        });
    }
    Ok(())
}

#[derive(Clone, Debug)]
struct ResidualUnit {
    act1: Snake,
    conv1: Conv1d,
    act2: Snake,
    conv2: Conv1d,
}

impl ResidualUnit {
    fn new(wb: &WeightBuilder<'_, '_>, dim: usize, dilation: usize) -> Result<Self, RunnerError> {
        let (w1, w2) = (wb.pp("block.1"), wb.pp("block.3"));
        let conv1 = same_conv(&w1, dilation)?;
        expect_channels(&w1, &conv1, dim, dim)?;
        let conv2 = same_conv(&w2, 1)?;
        expect_channels(&w2, &conv2, dim, dim)?;
        Ok(Self {
            act1: Snake::new(&wb.pp("block.0"), dim)?,
            conv1,
            act2: Snake::new(&wb.pp("block.2"), dim)?,
            conv2,
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let h = self.conv1.forward(g, self.act1.forward(g, x));
        let h = self.conv2.forward(g, self.act2.forward(g, h));
        // A convolution that shortened the sequence: centre-crop the shortcut.
        let (t, th) = (x.ne()[0], h.ne()[0]);
        let x = if t > th {
            let [_, c, n, _] = x.ne();
            let nb = x.nb();
            g.view(
                x,
                [th, c, n, 1],
                [nb[1], nb[2], nb[3]],
                (t - th) / 2 * nb[0],
            )
        } else {
            x
        };
        g.add(h, x)
    }
}

#[derive(Clone, Debug)]
struct EncoderBlock {
    units: Vec<ResidualUnit>,
    act: Snake,
    down: Conv1d,
}

#[derive(Clone, Debug)]
pub(super) struct Encoder {
    conv_in: Conv1d,
    blocks: Vec<EncoderBlock>,
    act: Snake,
    conv_out: Conv1d,
}

impl Encoder {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &MiniMaxH3AudioVaeConfig,
    ) -> Result<Self, RunnerError> {
        let wb = wb.pp("encoder");
        let w0 = wb.pp("block.0");
        let conv_in = same_conv(&w0, 1)?;
        expect_channels(&w0, &conv_in, 1, c.encoder_dim)?;
        let mut dim = c.encoder_dim;
        let mut blocks = Vec::with_capacity(c.encoder_rates.len());
        for (i, &stride) in c.encoder_rates.iter().enumerate() {
            let b = wb.pp(format!("block.{}", i + 1));
            let units = ENCODER_UNIT_DILATIONS
                .iter()
                .enumerate()
                .map(|(j, &d)| ResidualUnit::new(&b.pp(format!("block.{j}")), dim, d))
                .collect::<Result<Vec<_>, _>>()?;
            let wd = b.pp("block.4");
            let down = Conv1d::from_weights(&wd, ORIGIN)?.with(stride, stride.div_ceil(2), 1);
            expect_channels(&wd, &down, dim, 2 * dim)?;
            blocks.push(EncoderBlock {
                units,
                act: Snake::new(&b.pp("block.3"), dim)?,
                down,
            });
            dim *= 2;
        }
        let n = c.encoder_rates.len();
        let wo = wb.pp(format!("block.{}", n + 2));
        let conv_out = same_conv(&wo, 1)?;
        expect_channels(&wo, &conv_out, dim, c.latent_dim)?;
        Ok(Self {
            conv_in,
            blocks,
            act: Snake::new(&wb.pp(format!("block.{}", n + 1)), dim)?,
            conv_out,
        })
    }

    /// x: `[T, 1, N]` with T a multiple of the hop → `[T / hop, latent_dim, N]`.
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.conv_in.forward(g, x);
        for (i, block) in self.blocks.iter().enumerate() {
            for unit in &block.units {
                x = unit.forward(g, x);
            }
            x = block.down.forward(g, block.act.forward(g, x));
            x = g.cut(&format!("minimax_h3_audio.encoder.{i}"), "x", x);
        }
        self.conv_out.forward(g, self.act.forward(g, x))
    }
}
