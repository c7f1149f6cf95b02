//! The CLIP text transformer (transformers `CLIPTextModel` / `CLIPTextModelWithProjection`) as a
//! ggml graph.
//!
//! `x = token_embedding[ids] + position_embedding[0..n]`; per layer (pre-norm, causal):
//! `x += out_proj(attn(q, k, v of LN1(x)))`, `x += fc2(act(fc1(LN2(x))))`; then the final
//! LayerNorm. Attention scales by 1/√head_dim and masks keys after the query (causal), with no
//! padding mask: stable-diffusion.cpp and transformers (as SD pipelines call it) both attend to
//! padding tokens before the query.

use crate::ggml::Tensor;
use crate::nn::{AttentionMask, LayerNorm, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::config::ClipConfig;
use super::layer::EncoderLayer;
use super::source::PROJECTION;

/// The hidden-state output of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HiddenOutput {
    /// How many layers to run (0 = the embeddings); see [`clip_skip_layers`](super::clip_skip_layers).
    pub layers: usize,
    /// Whether the final LayerNorm is applied.
    pub final_norm: bool,
}

/// The pooled output of a call: the final-LN hidden state of the last layer at one token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PooledOutput {
    /// The token whose state is pooled; see [`pooled_position`](super::pooled_position).
    pub position: usize,
    /// Through `text_projection` (identity when the file has none, as stable-diffusion.cpp).
    pub project: bool,
}

/// What one call computes; both outputs come from one graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClipOutputs {
    pub hidden: Option<HiddenOutput>,
    pub pooled: Option<PooledOutput>,
}

/// The graph tensors of [`ClipOutputs`]: hidden [hidden, n], pooled [hidden or proj, 1].
pub struct ClipTensors<'g> {
    pub hidden: Option<Tensor<'g>>,
    pub pooled: Option<Tensor<'g>>,
}

/// transformers `CLIPTextModel` (+ `text_projection` of `CLIPTextModelWithProjection`).
pub struct ClipTextModel {
    config: ClipConfig,
    token_embedding: Param,
    position_embedding: Param,
    layers: Vec<EncoderLayer>,
    final_norm: LayerNorm,
    projection: Option<Linear>,
}

impl ClipTextModel {
    /// Declares the weights under transformers names relative to `wb` (`text_model.*`,
    /// `text_projection.weight` when the config has a projection). The token table keeps the
    /// file's type (ggml's `get_rows` reads quantized rows; `--type` may convert it).
    pub fn new(wb: &WeightBuilder<'_, '_>, config: ClipConfig) -> Result<Self, RunnerError> {
        let c = &config;
        let tm = wb.pp("text_model");
        let emb = tm.pp("embeddings");
        let token_embedding =
            emb.pp("token_embedding")
                .get("weight", [c.hidden, c.vocab, 1, 1], Storage::Any)?;
        let position_embedding = emb.pp("position_embedding").get(
            "weight",
            [c.hidden, c.max_positions, 1, 1],
            Storage::F32,
        )?;
        let layers = (0..c.layers)
            .map(|i| {
                EncoderLayer::new(
                    &tm.pp("encoder.layers").pp(i),
                    c.hidden,
                    c.intermediate,
                    c.eps,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = LayerNorm::new(&tm.pp("final_layer_norm"), c.hidden, c.eps, true)?;
        let projection = match c.projection_dim {
            Some(proj) => {
                let path = PROJECTION.trim_end_matches(".weight");
                Some(Linear::new(&wb.pp(path), c.hidden, proj, false)?)
            }
            None => None,
        };
        Ok(Self {
            config,
            token_embedding,
            position_embedding,
            layers,
            final_norm,
            projection,
        })
    }

    pub fn config(&self) -> &ClipConfig {
        &self.config
    }

    /// Whether the file has a `text_projection`.
    pub fn has_projection(&self) -> bool {
        self.projection.is_some()
    }

    /// Runs the tower on `ids` (checked by the caller: `0 <= id < vocab + extra rows`,
    /// `1 <= n <= max_positions`; out-of-range layer counts and positions are clamped).
    /// `extra`: textual-inversion rows [hidden, k] (f32) that ids `vocab..vocab + k` select.
    /// The pooled output always runs every layer, whatever the hidden output's depth.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        ids: &[i32],
        extra: Option<Tensor<'g>>,
        want: &ClipOutputs,
    ) -> ClipTensors<'g> {
        let c = &self.config;
        let n = ids.len();
        let hidden_layers = want.hidden.map(|h| h.layers.min(c.layers));
        let depth = if want.pooled.is_some() {
            c.layers
        } else {
            hidden_layers.unwrap_or(0)
        };

        let positions: Vec<i32> = (0..n as i32).collect();
        let positions = g.input_i32("clip.position_ids", [n, 1, 1, 1], positions);
        let mut x = g.add(
            self.embed(g, ids, extra),
            g.get_rows(g.param(self.position_embedding), positions),
        );
        let mask: Vec<f32> = (0..n)
            .flat_map(|q| (0..n).map(move |k| if k <= q { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let mask = AttentionMask(g.input_f32("clip.causal_mask", [n, n, 1, 1], mask));

        let mut hidden = (hidden_layers == Some(0)).then_some(x);
        for (i, layer) in self.layers[..depth].iter().enumerate() {
            x = layer.forward(g, x, c.heads, c.act, Some(&mask));
            x = g.cut(&format!("clip.layers.{i}"), "x", x);
            if hidden_layers == Some(i + 1) {
                hidden = Some(x);
            }
        }
        let hidden = match (hidden, want.hidden) {
            (
                Some(h),
                Some(HiddenOutput {
                    final_norm: true, ..
                }),
            ) => Some(self.final_norm.forward(g, h)),
            (h, _) => h,
        };
        let pooled = want.pooled.map(|p| {
            let last = self.final_norm.forward(g, x);
            let at = g.input_i32(
                "clip.pooled_position",
                [1, 1, 1, 1],
                vec![p.position.min(n - 1) as i32],
            );
            let pooled = g.get_rows(last, at);
            match (&self.projection, p.project) {
                (Some(proj), true) => proj.forward(g, pooled),
                _ => pooled,
            }
        });
        ClipTensors { hidden, pooled }
    }

    /// Token rows [hidden, n]: ids below the vocabulary from the token table, the others from
    /// `extra` (both gathered, then put in sequence order by one more gather).
    fn embed<'g>(&self, g: &'g GraphCtx<'g>, ids: &[i32], extra: Option<Tensor<'g>>) -> Tensor<'g> {
        let vocab = self.config.vocab;
        let table = g.param(self.token_embedding);
        let n = ids.len();
        let in_vocab = |id: i32| (id as usize) < vocab;
        let extra = match extra {
            Some(e) if ids.iter().any(|&id| !in_vocab(id)) => e,
            _ => {
                return g.get_rows(
                    table,
                    g.input_i32("clip.input_ids", [n, 1, 1, 1], ids.to_vec()),
                )
            }
        };
        let base: Vec<i32> = ids.iter().copied().filter(|&id| in_vocab(id)).collect();
        let added: Vec<i32> = ids
            .iter()
            .filter(|&&id| !in_vocab(id))
            .map(|&id| id - vocab as i32)
            .collect();
        let (mut next_base, mut next_added) = (0i32, base.len() as i32);
        let order: Vec<i32> = ids
            .iter()
            .map(|&id| {
                let slot = if in_vocab(id) {
                    &mut next_base
                } else {
                    &mut next_added
                };
                *slot += 1;
                *slot - 1
            })
            .collect();
        let added_rows = g.get_rows(
            extra,
            g.input_i32("clip.extra_ids", [added.len(), 1, 1, 1], added),
        );
        let rows = if base.is_empty() {
            added_rows
        } else {
            let base_rows = g.get_rows(
                table,
                g.input_i32("clip.input_ids", [base.len(), 1, 1, 1], base),
            );
            g.concat(base_rows, added_rows, 1)
        };
        g.get_rows(rows, g.input_i32("clip.token_order", [n, 1, 1, 1], order))
    }
}
