//! Qwen Image 2.1 transformer sizes, detected from weight shapes.

use crate::runner::{RunnerError, WeightBuilder};

/// Sinusoidal timestep features fed to the timestep MLP.
pub const TIME_FREQ_DIM: usize = 256;
/// Rope base of every position axis.
pub const ROPE_THETA: f32 = 10_000.0;
/// Epsilon of every norm (layer norms, q/k RMS norms, the text RMS norm).
pub const NORM_EPS: f32 = 1e-6;

/// How a block's SwiGLU feed-forward stores its two input projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnLayout {
    /// diffusers: `img_mlp.proj` (up) and `img_mlp.gate_layer` (gate).
    Split,
    /// One `img_mlp.gate_up` whose first half of outputs is the gate, the second the up
    /// projection (single-file checkpoints loaded by stable-diffusion.cpp).
    Fused,
}

/// Sizes of a Qwen Image 2.1 transformer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QwenImage21Config {
    /// Latent channels per token (`img_in` input).
    pub in_channels: usize,
    /// Velocity channels per token (`proj_out` output).
    pub out_channels: usize,
    pub hidden_size: usize,
    /// Channels of the text encoder's hidden states (`txt_in` input).
    pub text_dim: usize,
    pub head_dim: usize,
    pub heads: usize,
    /// SwiGLU inner width (3 × hidden in the released model).
    pub intermediate_size: usize,
    pub layers: usize,
    pub ffn: FfnLayout,
    /// Rope dims per head for the [frame, height, width] axes (sum = head_dim, each even).
    pub axes_dims: [usize; 3],
}

impl QwenImage21Config {
    /// Detects the sizes from the weights under `wb` (diffusers names; the single-file
    /// prefix `model.diffusion_model.` is the caller's source prefix). The rope axes are
    /// not stored in the weights: [16, 56, 56] for the released head size 128, else
    /// [`default_axes_dims`].
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let need = |name: &str| wb.require_ne(name, "Qwen Image 2.1 transformer weights");
        let img_in = need("img_in.weight")?;
        let (in_channels, hidden_size) = (img_in[0], img_in[1]);
        let out_channels = need("proj_out.weight")?[1];
        let text_dim = need("txt_in.in_layer.weight")?[0];
        let head_dim = need("transformer_blocks.0.attn.norm_q.weight")?[0];
        let (ffn, intermediate_size) =
            if let Some(ne) = wb.source_ne("transformer_blocks.0.img_mlp.gate_up.weight") {
                (FfnLayout::Fused, ne[1] / 2)
            } else {
                (
                    FfnLayout::Split,
                    need("transformer_blocks.0.img_mlp.proj.weight")?[1],
                )
            };
        let layers = (0..)
            .take_while(|i| wb.contains(&format!("transformer_blocks.{i}.attn.to_q.weight")))
            .count();
        let bad = |reason: String| RunnerError::BadData {
            key: wb.key("transformer_blocks.0.attn.norm_q.weight"),
            origin: "Qwen Image 2.1 transformer weights".into(),
            reason,
        };
        if head_dim == 0 || !hidden_size.is_multiple_of(head_dim) || !head_dim.is_multiple_of(2) {
            return Err(bad(format!(
                "head size {head_dim} must be even and divide the hidden size {hidden_size}"
            )));
        }
        Ok(Self {
            in_channels,
            out_channels,
            hidden_size,
            text_dim,
            head_dim,
            heads: hidden_size / head_dim,
            intermediate_size,
            layers,
            ffn,
            axes_dims: default_axes_dims(head_dim),
        })
    }

    /// The same sizes with explicit rope axes (e.g. a diffusers `axes_dims_rope`).
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

pub use super::super::default_axes_dims;
