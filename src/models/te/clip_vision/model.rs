//! The CLIP vision transformer (transformers `CLIPVisionModel` /
//! `CLIPVisionModelWithProjection`) as a ggml graph.
//!
//! `x = [class_embedding; conv(pixels) per patch] + position_embedding`, then `pre_layrnorm`;
//! per layer (pre-norm, no mask): `x += out_proj(attn(q, k, v of LN1(x)))`,
//! `x += fc2(act(fc1(LN2(x))))`; the pooled output is `post_layernorm` of the class token, then
//! `visual_projection`. The patch convolution (kernel = stride = P, no bias) runs as a matmul
//! over patches. Tokens are the class token, then the patches in raster order (row by row), as
//! transformers flattens them.

use crate::ggml::Tensor;
use crate::models::te::clip::layer::EncoderLayer;
use crate::nn::{Conv2d, LayerNorm, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::config::ClipVisionConfig;
use super::source::{PROJECTION, TOWER};

/// The hidden-state output of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClipVisionHidden {
    /// How many encoder layers to run (0 = the embeddings after `pre_layrnorm`): transformers'
    /// `hidden_states[layers]`; see [`clip_skip_layers`](crate::models::te::clip::clip_skip_layers)
    /// for upstream's `clip_skip` count.
    pub layers: usize,
    /// Whether `post_layernorm` is applied to every token (transformers never does for hidden
    /// states; upstream neither, for the hidden output).
    pub post_norm: bool,
}

/// The pooled output of a call: `post_layernorm` of the class token after `layers` layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClipVisionPooled {
    /// Layers run before pooling (transformers: all; upstream applies its `clip_skip` here too).
    pub layers: usize,
    /// Through `visual_projection` (`image_embeds` of `CLIPVisionModelWithProjection`).
    pub project: bool,
}

/// What one call computes; both outputs come from one graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClipVisionOutputs {
    pub hidden: Option<ClipVisionHidden>,
    pub pooled: Option<ClipVisionPooled>,
}

/// The graph tensors of [`ClipVisionOutputs`]: hidden [hidden, 1 + patches], pooled
/// [hidden or proj, 1].
pub struct ClipVisionTensors<'g> {
    pub hidden: Option<Tensor<'g>>,
    pub pooled: Option<Tensor<'g>>,
}

/// transformers `CLIPVisionModel` (+ `visual_projection` of `CLIPVisionModelWithProjection`).
pub struct ClipVisionModel {
    config: ClipVisionConfig,
    patch: Conv2d,
    class_embedding: Param,
    position_embedding: Param,
    pre_norm: LayerNorm,
    layers: Vec<EncoderLayer>,
    post_norm: LayerNorm,
    projection: Option<Linear>,
}

impl ClipVisionModel {
    /// Declares the weights under transformers names relative to `wb` (`vision_model.*`,
    /// `visual_projection.weight` when the config has a projection; see
    /// [`ClipVisionSource`](super::ClipVisionSource)). The patch kernel is kept as a matrix
    /// in the file's type (`--type` may convert it like a linear weight).
    pub fn new(wb: &WeightBuilder<'_, '_>, config: ClipVisionConfig) -> Result<Self, RunnerError> {
        let c = &config;
        let d = c.hidden;
        let vm = wb.pp(TOWER.trim_end_matches('.'));
        let emb = vm.pp("embeddings");
        let patch = Conv2d::new_matrix(
            &emb.pp("patch_embedding"),
            c.channels,
            d,
            c.patch_size,
            c.patch_size,
            0,
            false,
        )?;
        let class_embedding = emb.get("class_embedding", [d, 1, 1, 1], Storage::F32)?;
        let position_embedding =
            emb.pp("position_embedding")
                .get("weight", [d, c.tokens(), 1, 1], Storage::F32)?;
        let pre_norm = LayerNorm::new(&vm.pp("pre_layrnorm"), d, c.eps, true)?;
        let layers = (0..c.layers)
            .map(|i| EncoderLayer::new(&vm.pp("encoder.layers").pp(i), d, c.intermediate, c.eps))
            .collect::<Result<Vec<_>, _>>()?;
        let post_norm = LayerNorm::new(&vm.pp("post_layernorm"), d, c.eps, true)?;
        let projection = match c.projection_dim {
            Some(proj) => {
                let path = PROJECTION.trim_end_matches(".weight");
                Some(Linear::new(&wb.pp(path), d, proj, false)?)
            }
            None => None,
        };
        Ok(Self {
            config,
            patch,
            class_embedding,
            position_embedding,
            pre_norm,
            layers,
            post_norm,
            projection,
        })
    }

    pub fn config(&self) -> &ClipVisionConfig {
        &self.config
    }

    /// Whether the file has a `visual_projection`.
    pub fn has_projection(&self) -> bool {
        self.projection.is_some()
    }

    /// Runs the tower on `pixels` [image, image, channels, 1] (ggml order; PyTorch
    /// [1, C, H, W]), checked by the caller ([`encode`](super::encode) does). Layer counts
    /// beyond the depth are clamped; a projection asked of a file without one is skipped.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        pixels: Tensor<'g>,
        want: &ClipVisionOutputs,
    ) -> ClipVisionTensors<'g> {
        let c = &self.config;
        let hidden_layers = want.hidden.map(|h| h.layers.min(c.layers));
        let pooled_layers = want.pooled.map(|p| p.layers.min(c.layers));
        let depth = hidden_layers.unwrap_or(0).max(pooled_layers.unwrap_or(0));

        let mut x = self.pre_norm.forward(g, self.embed(g, pixels));
        x = g.cut("clip_vision.prelude", "x", x);
        let mut hidden = (hidden_layers == Some(0)).then_some(x);
        let mut pooled = (pooled_layers == Some(0)).then_some(x);
        for (i, layer) in self.layers[..depth].iter().enumerate() {
            // No mask: every token attends to every other.
            x = layer.forward(g, x, c.heads, c.act, None);
            x = g.cut(&format!("clip_vision.layers.{i}"), "x", x);
            if hidden_layers == Some(i + 1) {
                hidden = Some(x);
            }
            if pooled_layers == Some(i + 1) {
                pooled = Some(x);
            }
        }
        let hidden = match (hidden, want.hidden) {
            (
                Some(h),
                Some(ClipVisionHidden {
                    post_norm: true, ..
                }),
            ) => Some(self.post_norm.forward(g, h)),
            (h, _) => h,
        };
        let pooled = match (pooled, want.pooled) {
            (Some(p), Some(spec)) => {
                let nb1 = p.nb()[1];
                let class = g.view(p, [c.hidden, 1, 1, 1], [nb1, nb1, nb1], 0);
                let class = self.post_norm.forward(g, g.cont(class));
                Some(match (&self.projection, spec.project) {
                    (Some(proj), true) => proj.forward(g, class),
                    _ => class,
                })
            }
            _ => None,
        };
        ClipVisionTensors { hidden, pooled }
    }

    /// pixels [S, S, C, 1] → tokens [hidden, 1 + (S/P)²] with positions added.
    fn embed<'g>(&self, g: &'g GraphCtx<'g>, pixels: Tensor<'g>) -> Tensor<'g> {
        let c = &self.config;
        let n = c.grid() * c.grid();
        // [G, G, hidden, 1] → [G·G, hidden] → [hidden, G·G]: patch p = row·G + column.
        let patches = self.patch.forward(g, pixels);
        let patches = g.reshape(patches, [n, c.hidden, 1, 1]);
        let patches = g.cont(g.permute(patches, [1, 0, 2, 3]));
        let class = g.reshape(g.param(self.class_embedding), [c.hidden, 1, 1, 1]);
        let tokens = g.concat(class, patches, 1);
        g.add(tokens, g.param(self.position_embedding))
    }
}
