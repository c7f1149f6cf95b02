//! Qwen Image (v1) transformer sizes, read off the weight shapes.

use crate::runner::{RunnerError, WeightBuilder};

/// Epsilon of every norm (the blocks' layer norms, q/k and text RMS norms).
pub const NORM_EPS: f32 = 1e-6;
/// Rope base frequency.
pub const ROPE_THETA: f32 = 10_000.0;
/// Sinusoidal timestep features before the time embedder.
pub const TIME_FREQ_DIM: usize = 256;
/// Patch size of every released model (not stored in the weights; a diffusers
/// `config.json` may say otherwise).
pub const PATCH_SIZE: usize = 2;

const ORIGIN: &str = "the Qwen Image transformer weights";

/// Sizes of a `QwenImageTransformer2DModel`.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenImageConfig {
    /// Features of a packed image token (latent channels × patch²).
    pub in_channels: usize,
    /// Features of an output token (`proj_out` rows).
    pub out_channels: usize,
    pub hidden_size: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub mlp_hidden: usize,
    pub layers: usize,
    /// Width of the text encoder's states.
    pub text_dim: usize,
    pub patch_size: usize,
    /// Rope dims per head for the (frame, row, column) axes.
    pub axes_dims: [usize; 3],
    /// The checkpoint carries Edit 2511's `__index_timestep_zero__` marker (reference tokens
    /// modulated at timestep 0).
    pub zero_cond_t: bool,
}

/// The weight name whose presence marks an Edit 2511 checkpoint.
pub const ZERO_COND_MARKER: &str = "__index_timestep_zero__";

impl QwenImageConfig {
    /// Detects the sizes under `wb` (diffusers names, the single-file prefix stripped): the
    /// head size from the q norm, the rope axes [16, 56, 56] scaled to it
    /// ([`super::super::default_axes_dims`]).
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let shape = |name: &str| wb.require_ne(name, ORIGIN);
        let [in_channels, hidden_size, ..] = shape("img_in.weight")?;
        let [text_dim, ..] = shape("txt_in.weight")?;
        let b0 = "transformer_blocks.0";
        let [head_dim, ..] = shape(&format!("{b0}.attn.norm_q.weight"))?;
        let [_, mlp_hidden, ..] = shape(&format!("{b0}.img_mlp.net.0.proj.weight"))?;
        let [_, out_channels, ..] = shape("proj_out.weight")?;
        if head_dim == 0 || !hidden_size.is_multiple_of(head_dim) || !head_dim.is_multiple_of(2) {
            return Err(wb.bad_data(
                &format!("{b0}.attn.norm_q.weight"),
                ORIGIN,
                format!("head size {head_dim} does not divide the width {hidden_size}"),
            ));
        }
        let layers = (0..)
            .take_while(|i| wb.contains(&format!("transformer_blocks.{i}.img_mod.1.weight")))
            .count();
        Ok(Self {
            in_channels,
            out_channels,
            hidden_size,
            heads: hidden_size / head_dim,
            head_dim,
            mlp_hidden,
            layers,
            text_dim,
            patch_size: PATCH_SIZE,
            axes_dims: super::super::default_axes_dims(head_dim),
            zero_cond_t: wb.contains(ZERO_COND_MARKER),
        })
    }

    /// The same sizes with explicit rope axes (a diffusers `axes_dims_rope`).
    pub fn with_axes_dims(mut self, axes_dims: [usize; 3]) -> Result<Self, RunnerError> {
        if axes_dims.iter().sum::<usize>() != self.head_dim
            || axes_dims.iter().any(|d| !d.is_multiple_of(2))
        {
            return Err(RunnerError::BadData {
                key: "axes_dims_rope".into(),
                origin: "the Qwen Image transformer's config.json".into(),
                reason: format!(
                    "rope axes {axes_dims:?} must be even and sum to the head size {}",
                    self.head_dim
                ),
            });
        }
        self.axes_dims = axes_dims;
        Ok(self)
    }

    /// The same sizes with another patch size (a diffusers `patch_size`).
    pub fn with_patch_size(mut self, patch_size: usize) -> Result<Self, RunnerError> {
        let p2 = patch_size * patch_size;
        if patch_size == 0 || !self.in_channels.is_multiple_of(p2) {
            return Err(RunnerError::BadData {
                key: "patch_size".into(),
                origin: "the Qwen Image transformer's config.json".into(),
                reason: format!(
                    "patch size {patch_size} does not fit {} input features",
                    self.in_channels
                ),
            });
        }
        self.patch_size = patch_size;
        Ok(self)
    }

    /// Latent channels of the VAE this model works with.
    pub fn latent_channels(&self) -> usize {
        self.in_channels / (self.patch_size * self.patch_size)
    }
}
