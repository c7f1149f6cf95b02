//! Z-Image's single-stream DiT (diffusers `ZImageTransformer2DModel`, upstream `z_image.hpp`):
//! image patches and caption states each padded to a multiple of 32 tokens with learned pad
//! tokens, refined apart (image blocks modulated by the timestep, caption blocks not), then
//! joined for the main layers; 3-axis rope (caption index, row, column) with caption tokens at
//! (1 + j, 0, 0) and image tokens at (padded caption length + 1, row, column).
//!
//! Tokens are patches with features ordered (row, column, channel) ([`patchify`]); the output
//! is the flow velocity (diffusers' pipeline negates the model's output, upstream negates it
//! inside: so do we).

mod block;
mod config;

pub use config::{default_axes, ZImageConfig, ZImageLayout, SEQ_MULTIPLE};

use crate::ggml::Tensor;
use crate::nn::{self, LayerNorm, Linear, RmsNorm};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};
use crate::tensor::HostTensor;

use super::adaln::{columns, mod_rows};
use block::{Block, Rope};
use config::{FINAL_NORM_EPS, NORM_EPS, T_SCALE};

/// Cut-group prefix of this model's graph-cut marks.
pub const CUT_PREFIX: &str = "zimage";

/// One call's inputs.
pub struct ZImageInputs<'g, 'a> {
    /// Patch tokens [p·p·C, N, B] ([`patchify`]).
    pub img: Tensor<'g>,
    /// Patch rows and columns (N = rows · columns).
    pub grid: (usize, usize),
    /// Text-encoder states [cap_dim, L, B].
    pub cap: Tensor<'g>,
    /// σ ∈ [0, 1] per batch element (the model sees 1000 · (1 − σ)).
    pub sigmas: &'a [f32],
}

#[derive(Clone, Debug)]
pub struct ZImage {
    config: ZImageConfig,
    x_embedder: Linear,
    x_pad: Param,
    cap_norm: RmsNorm,
    cap_embedder: Linear,
    cap_pad: Param,
    t_in: Linear,
    t_out: Linear,
    noise_refiner: Vec<Block>,
    context_refiner: Vec<Block>,
    layers: Vec<Block>,
    final_mod: Linear,
    final_linear: Linear,
}

impl ZImage {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: ZImageConfig) -> Result<Self, RunnerError> {
        let c = &config;
        let d = c.dim;
        let (x_name, final_name) = match c.layout {
            ZImageLayout::Original => ("x_embedder".to_string(), "final_layer".to_string()),
            ZImageLayout::Diffusers => {
                let pf = format!("{}-{}", c.patch_size, c.frame_patch);
                (
                    format!("all_x_embedder.{pf}"),
                    format!("all_final_layer.{pf}"),
                )
            }
        };
        let blocks = |name: &str, n: usize, modulated: bool| {
            (0..n)
                .map(|i| Block::new(&wb.pp(name).pp(i), c, modulated))
                .collect::<Result<Vec<_>, _>>()
        };
        let pad = |name: &str| wb.get(name, [d, 1, 1, 1], Storage::F32);
        let fin = wb.pp(&final_name);
        Ok(Self {
            x_embedder: Linear::new(&wb.pp(&x_name), c.patch_features(c.in_channels), d, true)?,
            x_pad: pad("x_pad_token")?,
            cap_norm: RmsNorm::new(&wb.pp("cap_embedder").pp(0), c.cap_dim, NORM_EPS)?,
            cap_embedder: Linear::new(&wb.pp("cap_embedder").pp(1), c.cap_dim, d, true)?,
            cap_pad: pad("cap_pad_token")?,
            t_in: Linear::new(
                &wb.pp("t_embedder").pp("mlp").pp(0),
                c.t_freq_dim,
                t_hidden(wb)?,
                true,
            )?,
            t_out: Linear::new(
                &wb.pp("t_embedder").pp("mlp").pp(2),
                t_hidden(wb)?,
                c.adaln_dim,
                true,
            )?,
            noise_refiner: blocks("noise_refiner", c.refiner_layers, true)?,
            context_refiner: blocks("context_refiner", c.refiner_layers, false)?,
            layers: blocks("layers", c.layers, true)?,
            final_mod: Linear::new(&fin.pp("adaLN_modulation").pp(1), c.adaln_dim, d, true)?,
            final_linear: Linear::new(
                &fin.pp("linear"),
                d,
                c.patch_features(c.out_channels),
                true,
            )?,
            config,
        })
    }

    pub fn config(&self) -> &ZImageConfig {
        &self.config
    }

    /// The velocity tokens [p·p·C_out, N, B].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &ZImageInputs<'g, '_>,
    ) -> Result<Tensor<'g>, RunnerError> {
        let c = &self.config;
        let d = c.dim;
        let [feat, n, b, _] = inputs.img.ne();
        let [cap_feat, l, cap_b, _] = inputs.cap.ne();
        let (rows_, cols) = inputs.grid;
        if feat != c.patch_features(c.in_channels)
            || n != rows_ * cols
            || n == 0
            || cap_feat != c.cap_dim
            || cap_b != b
            || l == 0
            || inputs.sigmas.len() != b
        {
            return Err(RunnerError::Internal(format!(
                "Z-Image inputs: image {:?} for a {rows_}×{cols} grid, caption {:?}, {} sigmas",
                inputs.img.ne(),
                inputs.cap.ne(),
                inputs.sigmas.len()
            )));
        }
        let n_pad = n.next_multiple_of(SEQ_MULTIPLE);
        let l_pad = l.next_multiple_of(SEQ_MULTIPLE);

        let ts: Vec<f32> = inputs.sigmas.iter().map(|s| T_SCALE * (1.0 - s)).collect();
        let freqs = nn::timestep_embedding(&ts, c.t_freq_dim, true, 0.0, 1.0, 10_000.0);
        let t = g.input_f32("zimage.t_freq", [c.t_freq_dim, b, 1, 1], freqs);
        let adaln = self.t_out.forward(g, g.silu(self.t_in.forward(g, t)));

        // Pad rows gathered from the one-row pad token (a graph input, not a shape-only
        // tensor, so graph-cut segments hand it over like any other).
        let padded = |t: Tensor<'g>, pad: Param, name: &str, len: usize, to: usize| {
            if to == len {
                return t;
            }
            let rows = g.input_i32(name, [(to - len) * b, 1, 1, 1], vec![0; (to - len) * b]);
            let pads = g.reshape(g.get_rows(g.param(pad), rows), [d, to - len, b, 1]);
            g.concat(t, pads, 1)
        };
        let prelude = format!("{CUT_PREFIX}.prelude");
        let x = self.x_embedder.forward(g, inputs.img);
        let x = padded(x, self.x_pad, "zimage.x_pad_rows", n, n_pad);
        let mut x = g.cut(&prelude, "img", x);
        let cap = self
            .cap_embedder
            .forward(g, self.cap_norm.forward(g, inputs.cap));
        let cap = padded(cap, self.cap_pad, "zimage.cap_pad_rows", l, l_pad);
        let mut cap = g.cut(&prelude, "cap", cap);

        // Positions: captions (1 + j, 0, 0), pads included; image (L' + 1, row, column), its
        // pads at the origin.
        let cap_pos: Vec<Vec<f32>> = (0..l_pad).map(|j| vec![1.0 + j as f32, 0.0, 0.0]).collect();
        let img_pos: Vec<Vec<f32>> = (0..n_pad)
            .map(|i| {
                if i < n {
                    vec![(l_pad + 1) as f32, (i / cols) as f32, (i % cols) as f32]
                } else {
                    vec![0.0; 3]
                }
            })
            .collect();
        let rope = |name: &str, pos: &[Vec<f32>]| {
            let (cos, sin) = nn::rope_table(pos, &c.axes_dims, c.rope_theta);
            let ne = [c.head_dim / 2, 1, pos.len(), 1];
            Rope {
                cos: g.input_f32(&format!("zimage.{name}.cos"), ne, cos),
                sin: g.input_f32(&format!("zimage.{name}.sin"), ne, sin),
            }
        };
        let img_rope = rope("img", &img_pos);
        for (i, block) in self.noise_refiner.iter().enumerate() {
            let xi = block.forward(g, x, adaln, img_rope, c);
            x = g.cut(&format!("{CUT_PREFIX}.noise_refiner.{i}"), "img", xi);
        }
        let cap_rope = rope("cap", &cap_pos);
        for (i, block) in self.context_refiner.iter().enumerate() {
            let ci = block.forward(g, cap, adaln, cap_rope, c);
            cap = g.cut(&format!("{CUT_PREFIX}.context_refiner.{i}"), "cap", ci);
        }
        // The joint sequence in diffusers' order: image, then caption.
        let joint_pos: Vec<Vec<f32>> = img_pos.into_iter().chain(cap_pos).collect();
        let joint_rope = rope("joint", &joint_pos);
        let mut u = g.concat(x, cap, 1);
        for (i, block) in self.layers.iter().enumerate() {
            let ui = block.forward(g, u, adaln, joint_rope, c);
            u = g.cut(&format!("{CUT_PREFIX}.layers.{i}"), "x", ui);
        }
        let img = columns(g, u, 0, n);
        let scale = mod_rows(g, self.final_mod.forward(g, g.silu(adaln)), d, 1)[0];
        let y = LayerNorm::plain(FINAL_NORM_EPS).forward(g, img);
        let y = g.mul(y, g.scale_bias(scale, 1.0, 1.0));
        Ok(g.neg(self.final_linear.forward(g, y)))
    }
}

/// Width of the timestep MLP's hidden layer.
fn t_hidden(wb: &WeightBuilder<'_, '_>) -> Result<usize, RunnerError> {
    Ok(wb.require_ne("t_embedder.mlp.0.weight", "the Z-Image transformer weights")?[1])
}

/// Patch tokens [p·p·C, (H/p)(W/p)] of a latent [W, H, C]: row-major patches, features
/// (row in patch, column in patch, channel) with the channel fastest.
pub fn patchify(latent: &HostTensor, p: usize) -> HostTensor {
    let [w, h, c, _] = latent.ne;
    let (pw, ph) = (w / p, h / p);
    let f = p * p * c;
    let mut data = vec![0f32; f * pw * ph];
    for ch in 0..c {
        for y in 0..ph * p {
            for x in 0..pw * p {
                let token = (y / p) * pw + x / p;
                data[token * f + ((y % p) * p + x % p) * c + ch] =
                    latent.data[x + w * (y + h * ch)];
            }
        }
    }
    HostTensor {
        ne: [f, pw * ph, 1, 1],
        data,
    }
}
