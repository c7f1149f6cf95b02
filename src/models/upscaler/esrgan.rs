//! ESRGAN / Real-ESRGAN: BasicSR's `RRDBNet` (the `.pth` files of Real-ESRGAN x4plus and
//! x4plus-anime-6B, and their safetensors/GGUF conversions).
//!
//! conv_first → N RRDBs (each three residual dense blocks of five 3×3 convolutions with dense
//! concatenation and LeakyReLU 0.2, residuals scaled by 0.2) → conv_body, plus the first
//! features → per 2× step a nearest upsample, a conv and LeakyReLU → conv_hr, LeakyReLU →
//! conv_last. The scale (1, 2 or 4) is read from the `conv_up*` present, the widths and block
//! count from the tensors (released models: 64 features, growth 32, 23 or 6 blocks). Images
//! are RGB in [0, 1] both ways.

use crate::ggml::{ScaleMode, Tensor};
use crate::nn::Conv2d;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

/// Highest `body.N` probed.
const MAX_BLOCKS: usize = 1024;
/// BasicSR's LeakyReLU slope.
const SLOPE: f32 = 0.2;
/// Scale of each residual (RDB output, RRDB output).
const RESIDUAL: f32 = 0.2;

/// Sizes read from the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EsrganConfig {
    pub scale: usize,
    pub num_block: usize,
    pub in_ch: usize,
    pub out_ch: usize,
    pub num_feat: usize,
    pub num_grow: usize,
}

impl EsrganConfig {
    /// Reads the sizes from `wb`'s tensors (BasicSR names: `conv_first`, `body.N.rdbK.convM`).
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let origin = "the upscale model";
        let first = wb.require_ne("conv_first.weight", origin)?;
        let last = wb.require_ne("conv_last.weight", origin)?;
        let num_block = (0..MAX_BLOCKS)
            .take_while(|i| wb.contains(&format!("body.{i}.rdb1.conv1.weight")))
            .count();
        let num_grow = if num_block > 0 {
            wb.require_ne("body.0.rdb1.conv1.weight", origin)?[3]
        } else {
            32
        };
        let scale = if wb.contains("conv_up2.weight") {
            4
        } else if wb.contains("conv_up1.weight") {
            2
        } else {
            1
        };
        Ok(Self {
            scale,
            num_block,
            in_ch: first[2],
            out_ch: last[3],
            num_feat: first[3],
            num_grow,
        })
    }
}

fn conv(
    wb: &WeightBuilder<'_, '_>,
    name: &str,
    c_in: usize,
    c_out: usize,
) -> Result<Conv2d, RunnerError> {
    Conv2d::new_matrix(&wb.pp(name), c_in, c_out, 3, 1, 1, true)
}

/// Five 3×3 convolutions, each seeing the input and every earlier output.
#[derive(Clone, Debug)]
struct DenseBlock {
    convs: [Conv2d; 5],
}

impl DenseBlock {
    fn new(wb: &WeightBuilder<'_, '_>, feat: usize, grow: usize) -> Result<Self, RunnerError> {
        let c = |i: usize| {
            let out = if i == 4 { feat } else { grow };
            conv(wb, &format!("conv{}", i + 1), feat + i * grow, out)
        };
        Ok(Self {
            convs: [c(0)?, c(1)?, c(2)?, c(3)?, c(4)?],
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut cat = x;
        for c in &self.convs[..4] {
            let y = g.leaky_relu(c.forward(g, cat), SLOPE);
            cat = g.concat(cat, y, 2);
        }
        let y = self.convs[4].forward(g, cat);
        g.add(g.scale(y, RESIDUAL), x)
    }
}

pub struct Esrgan {
    pub config: EsrganConfig,
    first: Conv2d,
    body: Vec<[DenseBlock; 3]>,
    conv_body: Conv2d,
    up: Vec<Conv2d>,
    hr: Conv2d,
    last: Conv2d,
}

impl Esrgan {
    pub fn new(wb: &WeightBuilder<'_, '_>, c: EsrganConfig) -> Result<Self, RunnerError> {
        let f = c.num_feat;
        let body = (0..c.num_block)
            .map(|i| {
                let b = wb.pp("body").pp(i);
                let rdb = |k: usize| DenseBlock::new(&b.pp(format!("rdb{k}")), f, c.num_grow);
                Ok([rdb(1)?, rdb(2)?, rdb(3)?])
            })
            .collect::<Result<Vec<_>, RunnerError>>()?;
        let ups = match c.scale {
            4 => 2,
            2 => 1,
            _ => 0,
        };
        Ok(Self {
            config: c,
            first: conv(wb, "conv_first", c.in_ch, f)?,
            body,
            conv_body: conv(wb, "conv_body", f, f)?,
            up: (1..=ups)
                .map(|i| conv(wb, &format!("conv_up{i}"), f, f))
                .collect::<Result<_, _>>()?,
            hr: conv(wb, "conv_hr", f, f)?,
            last: conv(wb, "conv_last", f, c.out_ch)?,
        })
    }

    /// x: [W, H, C, N] in [0, 1] → [W·s, H·s, C, N].
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let feat = g.cut("esrgan.prelude", "feat", self.first.forward(g, x));
        let mut h = feat;
        for (i, rrdb) in self.body.iter().enumerate() {
            let mut y = h;
            for rdb in rrdb {
                y = rdb.forward(g, y);
            }
            h = g.add(g.scale(y, RESIDUAL), h);
            h = g.cut(&format!("esrgan.body.{i}"), "feat", h);
        }
        let mut feat = g.add(feat, self.conv_body.forward(g, h));
        for up in &self.up {
            let [w, hgt, c, n] = feat.ne();
            let big = g.interpolate(feat, [2 * w, 2 * hgt, c, n], ScaleMode::Nearest);
            feat = g.leaky_relu(up.forward(g, big), SLOPE);
        }
        let y = g.leaky_relu(self.hr.forward(g, feat), SLOPE);
        self.last.forward(g, y)
    }
}
