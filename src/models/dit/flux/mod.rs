//! FLUX.1 diffusion transformer (BFL's `Flux`, diffusers `FluxTransformer2DModel`): N
//! double-stream blocks (image and text tokens with their own weights, joint attention), then
//! M single-stream blocks over the joint sequence [text…, image…], modulated by
//! `vec = time(t) + guidance(g) (dev) + vector(pooled CLIP)`. Positions are 3-axis rope
//! (index, row, column) in the interleaved-pair layout: text at (0, 0, 0), the target image's
//! 2×2 patches at (0, row, column), Kontext reference images at (1, row, column).
//!
//! Tokens are packed on the host ([`packing`]); the model maps packed image tokens
//! [in_channels, N, B] to the velocity of the first `targets` of them.

mod blocks;
mod config;
pub mod packing;

pub use config::{FluxConfig, FluxLayout, NORM_EPS, ROPE_THETA, TIME_FREQ_DIM};

use crate::ggml::Tensor;
use crate::nn::{self, LayerNorm, Linear};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use blocks::{mod_rows, DoubleBlock, Rope, SingleBlock};

/// Cut-group prefix of this model's graph-cut marks.
pub const CUT_PREFIX: &str = "flux";

/// One transformer call's inputs (shapes in ggml order).
pub struct FluxInputs<'g, 'a> {
    /// Packed image tokens [in_channels, N, B]: the target's, then any reference images'.
    pub img: Tensor<'g>,
    /// Rope position (index, row, column) of each image token.
    pub img_pos: &'a [[f32; 3]],
    /// How many leading image tokens are the target (the output's length).
    pub targets: usize,
    /// T5 hidden states [text_dim, L, B].
    pub txt: Tensor<'g>,
    /// Pooled CLIP embedding [pooled_dim, B].
    pub pooled: Tensor<'g>,
    /// σ ∈ [0, 1] per batch element (×1000 inside, as the reference).
    pub timesteps: &'a [f32],
    /// Distilled guidance per batch element (dev models; ignored by schnell).
    pub guidance: &'a [f32],
}

/// BFL's `MLPEmbedder` / diffusers' `TimestepEmbedding`: in → SiLU → out.
#[derive(Clone, Copy, Debug)]
struct Mlp {
    a: Linear,
    b: Linear,
}

impl Mlp {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        names: (&str, &str),
        i: usize,
        d: usize,
    ) -> Result<Self, RunnerError> {
        Ok(Self {
            a: Linear::new(&wb.pp(names.0), i, d, true)?,
            b: Linear::new(&wb.pp(names.1), d, d, true)?,
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        self.b.forward(g, g.silu(self.a.forward(g, x)))
    }
}

/// A FLUX.1 transformer: weight handles and sizes.
#[derive(Clone, Debug)]
pub struct Flux {
    config: FluxConfig,
    img_in: Linear,
    txt_in: Linear,
    time_in: Mlp,
    vector_in: Mlp,
    guidance_in: Option<Mlp>,
    double: Vec<DoubleBlock>,
    single: Vec<SingleBlock>,
    /// Final adaptive norm: (shift, scale) rows in BFL's order, (scale, shift) in diffusers'.
    final_mod: Linear,
    final_linear: Linear,
}

impl Flux {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: FluxConfig) -> Result<Self, RunnerError> {
        let c = &config;
        let d = c.hidden_size;
        let bfl = c.layout == FluxLayout::Bfl;
        let (mlp, emb) = if bfl {
            (("in_layer", "out_layer"), wb.clone())
        } else {
            (("linear_1", "linear_2"), wb.pp("time_text_embed"))
        };
        let pick = |b: &'static str, df: &'static str| if bfl { b } else { df };
        let double = (0..c.double_blocks)
            .map(|i| DoubleBlock::new(&wb.pp(pick("double_blocks", "transformer_blocks")).pp(i), c))
            .collect::<Result<Vec<_>, _>>()?;
        let single = (0..c.single_blocks)
            .map(|i| {
                SingleBlock::new(
                    &wb.pp(pick("single_blocks", "single_transformer_blocks"))
                        .pp(i),
                    c,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let guidance_in = if c.guidance_embed {
            Some(Mlp::new(
                &emb.pp(pick("guidance_in", "guidance_embedder")),
                mlp,
                TIME_FREQ_DIM,
                d,
            )?)
        } else {
            None
        };
        Ok(Self {
            img_in: Linear::new(&wb.pp(pick("img_in", "x_embedder")), c.in_channels, d, true)?,
            txt_in: Linear::new(
                &wb.pp(pick("txt_in", "context_embedder")),
                c.text_dim,
                d,
                true,
            )?,
            time_in: Mlp::new(
                &emb.pp(pick("time_in", "timestep_embedder")),
                mlp,
                TIME_FREQ_DIM,
                d,
            )?,
            vector_in: Mlp::new(
                &emb.pp(pick("vector_in", "text_embedder")),
                mlp,
                c.pooled_dim,
                d,
            )?,
            guidance_in,
            double,
            single,
            final_mod: Linear::new(
                &if bfl {
                    wb.pp("final_layer").pp("adaLN_modulation").pp(1)
                } else {
                    wb.pp("norm_out").pp("linear")
                },
                d,
                2 * d,
                true,
            )?,
            final_linear: Linear::new(
                &if bfl {
                    wb.pp("final_layer").pp("linear")
                } else {
                    wb.pp("proj_out")
                },
                d,
                c.out_channels,
                true,
            )?,
            config,
        })
    }

    pub fn config(&self) -> &FluxConfig {
        &self.config
    }

    /// The velocity of the target tokens, [out_channels, targets, B].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &FluxInputs<'g, '_>,
    ) -> Result<Tensor<'g>, RunnerError> {
        let c = &self.config;
        let d = c.hidden_size;
        let [ch, n, b, _] = inputs.img.ne();
        let [td, l, tb, _] = inputs.txt.ne();
        let bad = |what: String| Err(RunnerError::Internal(format!("FLUX inputs: {what}")));
        if ch != c.in_channels || td != c.text_dim || tb != b {
            return bad(format!(
                "image {:?}, text {:?}; the model takes {} and {} channels",
                inputs.img.ne(),
                inputs.txt.ne(),
                c.in_channels,
                c.text_dim
            ));
        }
        if inputs.img_pos.len() != n || inputs.targets > n || inputs.timesteps.len() != b {
            return bad(format!(
                "{} positions and {} targets for {n} tokens, {} timesteps for {b}",
                inputs.img_pos.len(),
                inputs.targets,
                inputs.timesteps.len()
            ));
        }

        // vec = time(t) + guidance(g) + vector(pooled), modulating every block as SiLU(vec).
        let freqs = |v: &[f32], name: &str| {
            let f = nn::timestep_embedding(v, TIME_FREQ_DIM, true, 0.0, 1000.0, 10_000.0);
            g.input_f32(name, [TIME_FREQ_DIM, v.len(), 1, 1], f)
        };
        let mut vec = self
            .time_in
            .forward(g, freqs(inputs.timesteps, "flux.t_freq"));
        if let Some(gi) = &self.guidance_in {
            let gv: Vec<f32> = (0..b)
                .map(|i| inputs.guidance.get(i).copied().unwrap_or(0.0))
                .collect();
            vec = g.add(vec, gi.forward(g, freqs(&gv, "flux.g_freq")));
        }
        vec = g.add(
            vec,
            self.vector_in
                .forward(g, g.reshape(inputs.pooled, [c.pooled_dim, b, 1, 1])),
        );
        let vec = g.silu(vec);

        // Rope over [text (0, 0, 0) …, image …].
        let positions: Vec<Vec<f32>> = std::iter::repeat_n(vec![0.0; 3], l)
            .chain(inputs.img_pos.iter().map(|p| p.to_vec()))
            .collect();
        let (cos, sin) = nn::rope_table(&positions, &c.axes_dims, ROPE_THETA);
        let half = c.head_dim / 2;
        let rope = Rope {
            cos: g.input_f32("flux.rope_cos", [half, l + n, 1, 1], cos),
            sin: g.input_f32("flux.rope_sin", [half, l + n, 1, 1], sin),
        };

        let prelude = format!("{CUT_PREFIX}.prelude");
        let mut x = g.cut(&prelude, "img", self.img_in.forward(g, inputs.img));
        let mut t = g.cut(&prelude, "txt", self.txt_in.forward(g, inputs.txt));
        for (i, block) in self.double.iter().enumerate() {
            let (xi, ti) = block.forward(g, x, t, vec, rope, c);
            let group = format!("{CUT_PREFIX}.double_blocks.{i}");
            x = g.cut(&group, "img", xi);
            t = g.cut(&group, "txt", ti);
        }
        let mut joint = g.concat(t, x, 1);
        for (i, block) in self.single.iter().enumerate() {
            let group = format!("{CUT_PREFIX}.single_blocks.{i}");
            joint = g.cut(&group, "x", block.forward(g, joint, vec, rope, c));
        }
        let es = 4;
        let img = g.cont(g.view(
            joint,
            [d, inputs.targets, b, 1],
            [d * es, d * (l + n) * es, d * (l + n) * b * es],
            l * d * es,
        ));
        let m = mod_rows(g, self.final_mod.forward(g, vec), d, 2);
        let (shift, scale) = match c.layout {
            FluxLayout::Bfl => (m[0], m[1]),
            FluxLayout::Diffusers => (m[1], m[0]),
        };
        let y = LayerNorm::plain(NORM_EPS).forward(g, img);
        let y = g.add(g.mul(y, g.scale_bias(scale, 1.0, 1.0)), shift);
        Ok(self.final_linear.forward(g, y))
    }
}
