//! FLUX.1 transformer sizes and checkpoint layout, detected from the weights.

use crate::runner::{RunnerError, WeightBuilder};

/// Sinusoidal features of the timestep and guidance embedders.
pub const TIME_FREQ_DIM: usize = 256;
/// Rope base of every position axis.
pub const ROPE_THETA: f32 = 10_000.0;
/// Epsilon of the layer norms and the q/k RMS norms.
pub const NORM_EPS: f32 = 1e-6;

/// How a checkpoint names (and fuses) the transformer's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FluxLayout {
    /// Black Forest Labs' own names (`flux1-dev.safetensors`, ComfyUI, most GGUFs):
    /// `double_blocks.N.img_attn.qkv`, `single_blocks.N.linear1` (q, k, v and the MLP input
    /// fused), `final_layer.adaLN_modulation.1` as (shift, scale).
    Bfl,
    /// diffusers `FluxTransformer2DModel`: split projections, `norm_out.linear` as
    /// (scale, shift).
    Diffusers,
}

/// Chroma's modulation approximator (`distilled_guidance_layer`), which replaces FLUX's
/// per-block modulation, timestep, guidance and pooled-text embedders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChromaApproximator {
    /// Input width (timestep, guidance and modulation-index features: 64).
    pub in_dim: usize,
    pub hidden: usize,
    pub layers: usize,
}

/// Sizes of a FLUX.1 (or Chroma) transformer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FluxConfig {
    pub layout: FluxLayout,
    /// Packed latent channels per token (16 latent channels × 2 × 2).
    pub in_channels: usize,
    pub out_channels: usize,
    pub hidden_size: usize,
    /// T5 hidden width (`txt_in` input).
    pub text_dim: usize,
    /// CLIP pooled width (`vector_in` input).
    pub pooled_dim: usize,
    pub head_dim: usize,
    pub heads: usize,
    pub mlp_hidden: usize,
    pub double_blocks: usize,
    pub single_blocks: usize,
    /// FLUX.1-dev's distilled guidance input (schnell has none).
    pub guidance_embed: bool,
    /// Rope dims per head for the (index, row, column) axes.
    pub axes_dims: [usize; 3],
    /// Chroma: the approximator that gives every block's modulation.
    pub chroma: Option<ChromaApproximator>,
}

impl FluxConfig {
    /// Whether `wb` holds a FLUX.1 transformer (either layout), by its first double block.
    pub fn recognise(wb: &WeightBuilder<'_, '_>) -> Option<FluxLayout> {
        if wb.contains("double_blocks.0.img_attn.qkv.weight") {
            Some(FluxLayout::Bfl)
        } else if wb.contains("transformer_blocks.0.attn.add_q_proj.weight")
            && wb.contains("single_transformer_blocks.0.proj_mlp.weight")
        {
            Some(FluxLayout::Diffusers)
        } else {
            None
        }
    }

    /// Detects every size from the weights; the rope axes (not stored) are [16, 56, 56] for
    /// head size 128 and scaled alike for others ([`super::super::default_axes_dims`]).
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let origin = "FLUX transformer weights";
        let layout = Self::recognise(wb).ok_or_else(|| RunnerError::BadData {
            key: wb.key("double_blocks.0.img_attn.qkv.weight"),
            origin: origin.into(),
            reason: "neither FLUX (double_blocks.*) nor diffusers (transformer_blocks.*) names"
                .into(),
        })?;
        let need = |name: &str| wb.require_ne(name, origin);
        let bfl = layout == FluxLayout::Bfl;
        let pick = |b: &'static str, d: &'static str| if bfl { b } else { d };
        let img_in = need(pick("img_in.weight", "x_embedder.weight"))?;
        let (in_channels, hidden_size) = (img_in[0], img_in[1]);
        let out_channels = need(pick("final_layer.linear.weight", "proj_out.weight"))?[1];
        let text_dim = need(pick("txt_in.weight", "context_embedder.weight"))?[0];
        let chroma = wb
            .source_ne("distilled_guidance_layer.in_proj.weight")
            .map(|ne| ChromaApproximator {
                in_dim: ne[0],
                hidden: ne[1],
                layers: (0..)
                    .take_while(|i| {
                        wb.contains(&format!(
                            "distilled_guidance_layer.layers.{i}.{}.weight",
                            pick("in_layer", "linear_1")
                        ))
                    })
                    .count(),
            });
        let pooled_dim = match chroma {
            Some(_) => 0,
            None => need(pick(
                "vector_in.in_layer.weight",
                "time_text_embed.text_embedder.linear_1.weight",
            ))?[0],
        };
        let head_dim = need(pick(
            "double_blocks.0.img_attn.norm.query_norm.scale",
            "transformer_blocks.0.attn.norm_q.weight",
        ))?[0];
        let mlp_hidden = need(pick(
            "double_blocks.0.img_mlp.0.weight",
            "transformer_blocks.0.ff.net.0.proj.weight",
        ))?[1];
        let guidance_embed = wb.contains(pick(
            "guidance_in.in_layer.weight",
            "time_text_embed.guidance_embedder.linear_1.weight",
        ));
        let count =
            |fmt: &dyn Fn(usize) -> String| (0..).take_while(|&i| wb.contains(&fmt(i))).count();
        let (double_blocks, single_blocks) = if bfl {
            (
                count(&|i| format!("double_blocks.{i}.img_attn.qkv.weight")),
                count(&|i| format!("single_blocks.{i}.linear1.weight")),
            )
        } else {
            (
                count(&|i| format!("transformer_blocks.{i}.attn.to_q.weight")),
                count(&|i| format!("single_transformer_blocks.{i}.attn.to_q.weight")),
            )
        };
        if head_dim == 0 || !hidden_size.is_multiple_of(head_dim) || !head_dim.is_multiple_of(2) {
            return Err(RunnerError::BadData {
                key: wb.key(pick(
                    "double_blocks.0.img_attn.norm.query_norm.scale",
                    "transformer_blocks.0.attn.norm_q.weight",
                )),
                origin: origin.into(),
                reason: format!(
                    "head size {head_dim} must be even and divide the hidden size {hidden_size}"
                ),
            });
        }
        Ok(Self {
            layout,
            in_channels,
            out_channels,
            hidden_size,
            text_dim,
            pooled_dim,
            head_dim,
            heads: hidden_size / head_dim,
            mlp_hidden,
            double_blocks,
            single_blocks,
            guidance_embed,
            axes_dims: super::super::default_axes_dims(head_dim),
            chroma,
        })
    }

    /// Modulation rows Chroma's approximator makes: 3 per single block, 6 per stream of each
    /// double block, 2 for the final norm.
    pub fn chroma_rows(&self) -> usize {
        3 * self.single_blocks + 12 * self.double_blocks + 2
    }

    /// The same sizes with explicit rope axes (a diffusers `axes_dims_rope`).
    pub fn with_axes_dims(mut self, axes_dims: [usize; 3]) -> Result<Self, RunnerError> {
        if axes_dims.iter().sum::<usize>() != self.head_dim
            || axes_dims.iter().any(|d| !d.is_multiple_of(2))
        {
            return Err(RunnerError::Internal(format!(
                "rope axes {axes_dims:?} must be even and sum to the head size {}",
                self.head_dim
            )));
        }
        self.axes_dims = axes_dims;
        Ok(self)
    }
}
