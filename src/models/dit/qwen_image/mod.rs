//! Qwen Image (v1) diffusion transformer (diffusers `QwenImageTransformer2DModel`): N
//! dual-stream blocks (image and text tokens with their own weights, joint attention over
//! [text…, image…]) modulated by the timestep alone — the same block as FLUX's double stream
//! under other names (`flux::DoubleBlock::split`). The text states pass an RMS norm before
//! their projection; there is no pooled vector, guidance or single-stream block.
//!
//! Positions are 3-axis rope (frame, row, column) in the interleaved-pair layout: image `k`
//! (0: the target, then references) at frame `k`, rows and columns centred on the grid as
//! upstream sd-cli counts them (`r − rows/2`, see [`image_positions`]); text token `i` at
//! (s + i) on all three axes, s = max(rows, cols)/2 of the target. Reference images
//! (editing) follow the target's tokens, numbered by upstream's `ref_index_mode`
//! ([`ref_positions`]). Edit 2511 (`zero_cond_t`) modulates reference tokens with the
//! embedding of timestep 0 and everything else with the step's.
//!
//! Tokens are packed on the host as FLUX's (`flux::packing`, 2×2 patches, channel-major
//! features); the model returns the velocity of the target tokens.

mod config;

pub use super::flux::packing::RefIndex;
pub use config::{
    QwenImageConfig, NORM_EPS, PATCH_SIZE, ROPE_THETA, TIME_FREQ_DIM, ZERO_COND_MARKER,
};

use crate::ggml::Tensor;
use crate::nn::{self, LayerNorm, Linear, RmsNorm};
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

use super::adaln::{columns, mod_rows};
use super::flux::{DoubleBlock, Heads, Rope, StreamNames};

/// Cut-group prefix of this model's graph-cut marks.
pub const CUT_PREFIX: &str = "qwen_image";

/// One transformer call's inputs (shapes in ggml order).
pub struct QwenImageInputs<'g, 'a> {
    /// Packed image tokens [in_channels, N, B]: the target's, then any reference images'.
    pub img: Tensor<'g>,
    /// Patch grid (rows, columns) of the target, then of each reference, in token order.
    pub grids: &'a [(usize, usize)],
    /// Text encoder states [text_dim, L, B].
    pub txt: Tensor<'g>,
    /// σ ∈ [0, 1] per batch element (×1000 inside, as the reference).
    pub timesteps: &'a [f32],
    /// How reference images are numbered in the frame axis.
    pub ref_index: RefIndex,
    /// Modulate reference tokens with timestep 0 (Qwen Image Edit 2511).
    pub zero_cond_t: bool,
}

/// Rope positions of reference images with patch grids `grids` (rows, cols), as upstream's
/// `gen_refs_ids` for Qwen Image: `Increase` puts reference k at frame k + 1 and `Decrease`
/// at −(k + 1), each centred like the target; `Fixed` puts all at frame 1 without centring,
/// each beside the previous ones (row or column offsets).
pub fn ref_positions(grids: &[(usize, usize)], mode: RefIndex) -> Vec<[f32; 3]> {
    if mode == RefIndex::Fixed {
        let sizes: Vec<(usize, usize)> = grids.iter().map(|&(r, c)| (2 * c, 2 * r)).collect();
        return super::flux::packing::ref_positions(&sizes, RefIndex::Fixed)
            .into_iter()
            .map(|[i, r, c]| [i, r / 2.0, c / 2.0])
            .collect();
    }
    let mut out = Vec::new();
    for (k, &(rows, cols)) in grids.iter().enumerate() {
        let frame = match mode {
            RefIndex::Decrease => -(k as f32) - 1.0,
            _ => k as f32 + 1.0,
        };
        out.extend(
            image_positions(rows, cols, 0)
                .into_iter()
                .map(|[_, r, c]| [frame, r, c]),
        );
    }
    out
}

/// Rope positions (frame, row, column) of an image's `rows × cols` tokens at frame `frame`,
/// centred as upstream: row `r` at `r − rows/2` (diffusers puts odd grids one lower,
/// `r − ⌈rows/2⌉`; the same for even grids).
pub fn image_positions(rows: usize, cols: usize, frame: usize) -> Vec<[f32; 3]> {
    let (r0, c0) = ((rows / 2) as f32, (cols / 2) as f32);
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            out.push([frame as f32, r as f32 - r0, c as f32 - c0]);
        }
    }
    out
}

/// diffusers' `TimestepEmbedding`: linear_1 → SiLU → linear_2.
#[derive(Clone, Copy, Debug)]
struct TimeEmbedder {
    a: Linear,
    b: Linear,
}

/// A Qwen Image transformer: weight handles and sizes.
#[derive(Clone, Debug)]
pub struct QwenImage {
    config: QwenImageConfig,
    img_in: Linear,
    txt_norm: RmsNorm,
    txt_in: Linear,
    time: TimeEmbedder,
    blocks: Vec<DoubleBlock>,
    /// `norm_out.linear`: (scale, shift) rows.
    norm_out: Linear,
    proj_out: Linear,
}

impl QwenImage {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: QwenImageConfig) -> Result<Self, RunnerError> {
        let c = &config;
        let d = c.hidden_size;
        if c.layers == 0 {
            return Err(RunnerError::MissingTensor {
                key: wb.key("transformer_blocks.0.img_mod.1.weight"),
                origin: "the Qwen Image transformer weights".into(),
            });
        }
        let img = StreamNames {
            modulation: Some("img_mod.1"),
            q: "attn.to_q",
            k: "attn.to_k",
            v: "attn.to_v",
            norm_q: "attn.norm_q",
            norm_k: "attn.norm_k",
            proj: "attn.to_out.0",
            mlp: "img_mlp",
        };
        let txt = StreamNames {
            modulation: Some("txt_mod.1"),
            q: "attn.add_q_proj",
            k: "attn.add_k_proj",
            v: "attn.add_v_proj",
            norm_q: "attn.norm_added_q",
            norm_k: "attn.norm_added_k",
            proj: "attn.to_add_out",
            mlp: "txt_mlp",
        };
        let blocks = (0..c.layers)
            .map(|i| {
                DoubleBlock::split(
                    &wb.pp("transformer_blocks").pp(i),
                    [&img, &txt],
                    (d, c.head_dim, c.mlp_hidden),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let te = wb.pp("time_text_embed").pp("timestep_embedder");
        Ok(Self {
            img_in: Linear::new(&wb.pp("img_in"), c.in_channels, d, true)?,
            txt_norm: RmsNorm::new(&wb.pp("txt_norm"), c.text_dim, NORM_EPS)?,
            txt_in: Linear::new(&wb.pp("txt_in"), c.text_dim, d, true)?,
            time: TimeEmbedder {
                a: Linear::new(&te.pp("linear_1"), TIME_FREQ_DIM, d, true)?,
                b: Linear::new(&te.pp("linear_2"), d, d, true)?,
            },
            blocks,
            norm_out: Linear::new(&wb.pp("norm_out").pp("linear"), d, 2 * d, true)?,
            proj_out: Linear::new(&wb.pp("proj_out"), d, c.out_channels, true)?,
            config,
        })
    }

    pub fn config(&self) -> &QwenImageConfig {
        &self.config
    }

    /// The velocity of the target tokens, [out_channels, rows·cols of `grids[0]`, B].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &QwenImageInputs<'g, '_>,
    ) -> Result<Tensor<'g>, RunnerError> {
        let c = &self.config;
        let d = c.hidden_size;
        let [ch, n, b, _] = inputs.img.ne();
        let [td, l, tb, _] = inputs.txt.ne();
        let bad = |what: String| Err(RunnerError::Internal(format!("Qwen Image inputs: {what}")));
        let tokens: usize = inputs.grids.iter().map(|(r, c)| r * c).sum();
        if ch != c.in_channels || td != c.text_dim || tb != b || inputs.timesteps.len() != b {
            return bad(format!(
                "image {:?}, text {:?}, {} timesteps; the model takes {} and {} channels",
                inputs.img.ne(),
                inputs.txt.ne(),
                inputs.timesteps.len(),
                c.in_channels,
                c.text_dim
            ));
        }
        let Some(&(rows, cols)) = inputs.grids.first() else {
            return bad("no image grid".into());
        };
        if tokens != n {
            return bad(format!("grids {:?} for {n} tokens", inputs.grids));
        }

        // Rope over [text …, image …].
        let start = (rows.max(cols) / 2) as f32;
        let mut positions: Vec<Vec<f32>> = (0..l).map(|i| vec![start + i as f32; 3]).collect();
        positions.extend(image_positions(rows, cols, 0).iter().map(|p| p.to_vec()));
        positions.extend(
            ref_positions(&inputs.grids[1..], inputs.ref_index)
                .iter()
                .map(|p| p.to_vec()),
        );
        let (cos, sin) = nn::rope_table(&positions, &c.axes_dims, ROPE_THETA);
        let half = c.head_dim / 2;
        let rope = Rope {
            cos: g.input_f32("qwen_image.rope_cos", [half, l + n, 1, 1], cos),
            sin: g.input_f32("qwen_image.rope_sin", [half, l + n, 1, 1], sin),
        };

        let embed = |t: &[f32], name: &str| {
            let f = nn::timestep_embedding(t, TIME_FREQ_DIM, true, 0.0, 1000.0, 10_000.0);
            let f = g.input_f32(name, [TIME_FREQ_DIM, b, 1, 1], f);
            g.silu(self.time.b.forward(g, g.silu(self.time.a.forward(g, f))))
        };
        let vec = embed(inputs.timesteps, "qwen_image.t_freq");
        let targets = rows * cols;
        let zero_vec =
            (inputs.zero_cond_t && n > targets).then(|| embed(&vec![0.0; b], "qwen_image.t0_freq"));

        let prelude = format!("{CUT_PREFIX}.prelude");
        let mut x = g.cut(&prelude, "img", self.img_in.forward(g, inputs.img));
        let txt = self.txt_norm.forward(g, inputs.txt);
        let mut t = g.cut(&prelude, "txt", self.txt_in.forward(g, txt));
        let heads = Heads {
            heads: c.heads,
            head_dim: c.head_dim,
        };
        for (i, block) in self.blocks.iter().enumerate() {
            let missing = || RunnerError::Internal("Qwen Image block without modulation".into());
            let (mut im, tm) = block.modulation(g, vec, d).ok_or_else(missing)?;
            if let Some(v0) = zero_vec {
                // Target tokens take the step's rows, reference tokens timestep 0's.
                let (im0, _) = block.modulation(g, v0, d).ok_or_else(missing)?;
                let tgt = columns(g, x, 0, targets);
                let refs = columns(g, x, targets, n - targets);
                im = im
                    .iter()
                    .zip(&im0)
                    .map(|(&a, &z)| g.concat(g.repeat(a, tgt), g.repeat(z, refs), 1))
                    .collect();
            }
            let (xi, ti) = block.forward(g, x, t, (&im, &tm), rope, None, heads);
            let group = format!("{CUT_PREFIX}.transformer_blocks.{i}");
            x = g.cut(&group, "img", xi);
            t = g.cut(&group, "txt", ti);
        }
        let es = 4;
        let img = g.cont(g.view(
            x,
            [d, targets, b, 1],
            [d * es, d * n * es, d * n * b * es],
            0,
        ));
        let m = mod_rows(g, self.norm_out.forward(g, vec), d, 2);
        let (scale, shift) = (m[0], m[1]);
        let y = LayerNorm::plain(NORM_EPS).forward(g, img);
        let y = g.add(g.mul(y, g.scale_bias(scale, 1.0, 1.0)), shift);
        Ok(self.proj_out.forward(g, y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_centre_the_grid_as_upstream() {
        let p = image_positions(3, 4, 1);
        assert_eq!(p[0], [1.0, -1.0, -2.0]);
        assert_eq!(p[11], [1.0, 1.0, 1.0]);
    }
}
