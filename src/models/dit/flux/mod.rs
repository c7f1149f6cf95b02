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

pub(crate) use blocks::{DoubleBlock, Heads, Rope, StreamNames};
pub mod packing;

pub use config::{ChromaApproximator, FluxConfig, FluxLayout, NORM_EPS, ROPE_THETA, TIME_FREQ_DIM};

use crate::ggml::Tensor;
use crate::nn::{self, LayerNorm, Linear, RmsNorm};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::adaln::mod_rows;
use blocks::SingleBlock;

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
    /// Pooled CLIP embedding [pooled_dim, B] (FLUX; Chroma has none).
    pub pooled: Option<Tensor<'g>>,
    /// σ ∈ [0, 1] per batch element (×1000 inside, as the reference).
    pub timesteps: &'a [f32],
    /// Distilled guidance per batch element (dev models; ignored by schnell and Chroma).
    pub guidance: &'a [f32],
    /// Chroma's additive mask over the text keys (0 or −∞, one per text token); image keys
    /// are always attended.
    pub txt_mask: Option<&'a [f32]>,
    /// Blocks skip-layer guidance leaves out: double block i is i, single block i is
    /// (double blocks) + i, as upstream numbers them.
    pub skip_layers: &'a [usize],
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

/// Chroma's `distilled_guidance_layer`: in_proj, residual (RMS norm → MLP) layers, out_proj.
#[derive(Clone, Debug)]
struct Approximator {
    in_proj: Linear,
    norms: Vec<RmsNorm>,
    layers: Vec<Mlp>,
    out_proj: Linear,
}

impl Approximator {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        a: &ChromaApproximator,
        d: usize,
        bfl: bool,
    ) -> Result<Self, RunnerError> {
        let (mlp, norm) = if bfl {
            (("in_layer", "out_layer"), "scale")
        } else {
            (("linear_1", "linear_2"), "weight")
        };
        Ok(Self {
            in_proj: Linear::new(&wb.pp("in_proj"), a.in_dim, a.hidden, true)?,
            norms: (0..a.layers)
                .map(|i| RmsNorm::named(&wb.pp("norms").pp(i), norm, a.hidden, NORM_EPS))
                .collect::<Result<_, _>>()?,
            layers: (0..a.layers)
                .map(|i| Mlp::new(&wb.pp("layers").pp(i), mlp, a.hidden, a.hidden))
                .collect::<Result<_, _>>()?,
            out_proj: Linear::new(&wb.pp("out_proj"), a.hidden, d, true)?,
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.in_proj.forward(g, x);
        for (norm, layer) in self.norms.iter().zip(&self.layers) {
            x = g.add(x, layer.forward(g, norm.forward(g, x)));
        }
        self.out_proj.forward(g, x)
    }
}

/// The modulation of one call (see [`Flux::modulation`]).
enum Mods<'g, 'm> {
    Flux {
        vec: Tensor<'g>,
        model: &'m Flux,
    },
    Chroma {
        rows: Tensor<'g>,
        d: usize,
        singles: usize,
        doubles: usize,
    },
}

impl<'g> Mods<'g, '_> {
    /// Row `r` of Chroma's approximator output [D, rows, B] as [D, 1, B].
    fn row(g: &'g GraphCtx<'g>, rows: Tensor<'g>, d: usize, r: usize) -> Tensor<'g> {
        let [_, n, b, _] = rows.ne();
        let es = 4;
        let v = g.view(
            rows,
            [d, 1, b, 1],
            [d * es, d * n * es, d * n * b * es],
            r * d * es,
        );
        g.cont(v)
    }

    fn double(
        &self,
        g: &'g GraphCtx<'g>,
        block: &DoubleBlock,
        i: usize,
    ) -> (Vec<Tensor<'g>>, Vec<Tensor<'g>>) {
        match self {
            Mods::Flux { vec, model } => block
                .modulation(g, *vec, model.config.hidden_size)
                .expect("FLUX blocks have modulation"),
            &Mods::Chroma {
                rows,
                d,
                singles,
                doubles,
            } => {
                let img = 3 * singles + 6 * i;
                let txt = 3 * singles + 6 * doubles + 6 * i;
                (
                    (0..6).map(|k| Self::row(g, rows, d, img + k)).collect(),
                    (0..6).map(|k| Self::row(g, rows, d, txt + k)).collect(),
                )
            }
        }
    }

    fn single(&self, g: &'g GraphCtx<'g>, block: &SingleBlock, i: usize) -> Vec<Tensor<'g>> {
        match self {
            Mods::Flux { vec, model } => block
                .modulation(g, *vec, model.config.hidden_size)
                .expect("FLUX blocks have modulation"),
            &Mods::Chroma { rows, d, .. } => {
                (0..3).map(|k| Self::row(g, rows, d, 3 * i + k)).collect()
            }
        }
    }

    /// The final norm's (shift, scale).
    fn last(&self, g: &'g GraphCtx<'g>) -> (Tensor<'g>, Tensor<'g>) {
        match self {
            Mods::Flux { vec, model } => {
                let d = model.config.hidden_size;
                let lin = model.final_mod.expect("FLUX has a final modulation");
                let m = mod_rows(g, lin.forward(g, *vec), d, 2);
                match model.config.layout {
                    FluxLayout::Bfl => (m[0], m[1]),
                    FluxLayout::Diffusers => (m[1], m[0]),
                }
            }
            &Mods::Chroma { rows, d, .. } => {
                let n = rows.ne()[1];
                (Self::row(g, rows, d, n - 2), Self::row(g, rows, d, n - 1))
            }
        }
    }
}

/// A FLUX.1 (or Chroma) transformer: weight handles and sizes.
#[derive(Clone, Debug)]
pub struct Flux {
    config: FluxConfig,
    img_in: Linear,
    txt_in: Linear,
    /// FLUX's embedders (absent in Chroma).
    time_in: Option<Mlp>,
    vector_in: Option<Mlp>,
    guidance_in: Option<Mlp>,
    /// Chroma's modulation approximator.
    approximator: Option<Approximator>,
    double: Vec<DoubleBlock>,
    single: Vec<SingleBlock>,
    /// Final adaptive norm: (shift, scale) rows in BFL's order, (scale, shift) in diffusers';
    /// Chroma takes its last two approximator rows instead.
    final_mod: Option<Linear>,
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
        let flux = c.chroma.is_none();
        let approximator = match &c.chroma {
            Some(a) => Some(Approximator::new(
                &wb.pp("distilled_guidance_layer"),
                a,
                d,
                bfl,
            )?),
            None => None,
        };
        let time_in = flux
            .then(|| {
                Mlp::new(
                    &emb.pp(pick("time_in", "timestep_embedder")),
                    mlp,
                    TIME_FREQ_DIM,
                    d,
                )
            })
            .transpose()?;
        let vector_in = flux
            .then(|| {
                Mlp::new(
                    &emb.pp(pick("vector_in", "text_embedder")),
                    mlp,
                    c.pooled_dim,
                    d,
                )
            })
            .transpose()?;
        let final_mod = flux
            .then(|| {
                let w = if bfl {
                    wb.pp("final_layer").pp("adaLN_modulation").pp(1)
                } else {
                    wb.pp("norm_out").pp("linear")
                };
                Linear::new(&w, d, 2 * d, true)
            })
            .transpose()?;
        Ok(Self {
            img_in: Linear::new(&wb.pp(pick("img_in", "x_embedder")), c.in_channels, d, true)?,
            txt_in: Linear::new(
                &wb.pp(pick("txt_in", "context_embedder")),
                c.text_dim,
                d,
                true,
            )?,
            time_in,
            vector_in,
            guidance_in,
            approximator,
            double,
            single,
            final_mod,
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

    /// Where every block's modulation comes from: SiLU(time + guidance + pooled) through each
    /// block's own linear (FLUX), or rows of Chroma's approximator output.
    fn modulation<'g, 'm>(
        &'m self,
        g: &'g GraphCtx<'g>,
        inputs: &FluxInputs<'g, '_>,
    ) -> Result<Mods<'g, 'm>, RunnerError> {
        let c = &self.config;
        let b = inputs.img.ne()[2];
        let freqs = |v: &[f32], dim: usize, name: &str| {
            let f = nn::timestep_embedding(v, dim, true, 0.0, 1000.0, 10_000.0);
            g.input_f32(name, [dim, v.len(), 1, 1], f)
        };
        if let (Some(approx), Some(a)) = (&self.approximator, &c.chroma) {
            // Per row r and batch element: [timestep (16), guidance 0 (16), index r (32)].
            let rows = c.chroma_rows();
            let q = a.in_dim / 4;
            let mut data = Vec::with_capacity(a.in_dim * rows * b);
            for &t in inputs.timesteps {
                let te = nn::timestep_embedding(&[t], q, true, 0.0, 1000.0, 10_000.0);
                let ge = nn::timestep_embedding(&[0.0], q, true, 0.0, 1000.0, 10_000.0);
                for r in 0..rows {
                    data.extend(&te);
                    data.extend(&ge);
                    data.extend(nn::timestep_embedding(
                        &[r as f32],
                        a.in_dim - 2 * q,
                        true,
                        0.0,
                        1000.0,
                        10_000.0,
                    ));
                }
            }
            let x = g.input_f32("chroma.mod_in", [a.in_dim, rows, b, 1], data);
            return Ok(Mods::Chroma {
                rows: approx.forward(g, x),
                d: c.hidden_size,
                singles: c.single_blocks,
                doubles: c.double_blocks,
            });
        }
        let (Some(time_in), Some(vector_in)) = (&self.time_in, &self.vector_in) else {
            return Err(RunnerError::Internal("FLUX embedders missing".into()));
        };
        let mut vec = time_in.forward(g, freqs(inputs.timesteps, TIME_FREQ_DIM, "flux.t_freq"));
        if let Some(gi) = &self.guidance_in {
            let gv: Vec<f32> = (0..b)
                .map(|i| inputs.guidance.get(i).copied().unwrap_or(0.0))
                .collect();
            vec = g.add(vec, gi.forward(g, freqs(&gv, TIME_FREQ_DIM, "flux.g_freq")));
        }
        let pooled = inputs
            .pooled
            .ok_or_else(|| RunnerError::Internal("FLUX needs the pooled text vector".into()))?;
        vec = g.add(
            vec,
            vector_in.forward(g, g.reshape(pooled, [c.pooled_dim, b, 1, 1])),
        );
        Ok(Mods::Flux {
            vec: g.silu(vec),
            model: self,
        })
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

        let mods = self.modulation(g, inputs)?;

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

        // Chroma: text keys past the prompt (and its pad allowance) are masked for every query.
        let mask = inputs.txt_mask.map(|m| {
            let row: Vec<f32> = m
                .iter()
                .copied()
                .chain(std::iter::repeat_n(0.0, n))
                .collect();
            let full: Vec<f32> = (0..l + n).flat_map(|_| row.iter().copied()).collect();
            g.input_f32("flux.mask", [l + n, l + n, 1, 1], full)
        });

        let prelude = format!("{CUT_PREFIX}.prelude");
        let mut x = g.cut(&prelude, "img", self.img_in.forward(g, inputs.img));
        let mut t = g.cut(&prelude, "txt", self.txt_in.forward(g, inputs.txt));
        let doubles = self.double.len();
        for (i, block) in self.double.iter().enumerate() {
            if inputs.skip_layers.contains(&i) {
                continue;
            }
            let (im, tm) = mods.double(g, block, i);
            let (xi, ti) = block.forward(g, x, t, (&im, &tm), rope, mask, c.into());
            let group = format!("{CUT_PREFIX}.double_blocks.{i}");
            x = g.cut(&group, "img", xi);
            t = g.cut(&group, "txt", ti);
        }
        let mut joint = g.concat(t, x, 1);
        for (i, block) in self.single.iter().enumerate() {
            if inputs.skip_layers.contains(&(doubles + i)) {
                continue;
            }
            let group = format!("{CUT_PREFIX}.single_blocks.{i}");
            let m = mods.single(g, block, i);
            joint = g.cut(&group, "x", block.forward(g, joint, &m, rope, mask, c));
        }
        let es = 4;
        let img = g.cont(g.view(
            joint,
            [d, inputs.targets, b, 1],
            [d * es, d * (l + n) * es, d * (l + n) * b * es],
            l * d * es,
        ));
        let (shift, scale) = mods.last(g);
        let y = LayerNorm::plain(NORM_EPS).forward(g, img);
        let y = g.add(g.mul(y, g.scale_bias(scale, 1.0, 1.0)), shift);
        Ok(self.final_linear.forward(g, y))
    }
}
