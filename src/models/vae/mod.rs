//! Autoencoders (latent <-> pixels) and the [`Vae`] interface every pipeline decodes and
//! encodes through (with tiling and the out-of-memory retry, `pipeline::vae`).

pub mod autoencoder_kl;
pub mod minimax_h3_audio_vae;
pub mod minimax_h3_vae;
pub mod qwen_image_2_1_vae;
pub mod taesd;
pub mod tiling;
pub mod wan22_vae;
pub mod wan_vae;

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, Runner, RunnerError};
use crate::tensor::HostTensor;

/// Refuses a `width × height` image unless both are positive multiples of `f`: each stride-2
/// level floors odd sizes, so other sizes would silently lose their last pixels.
pub(crate) fn check_multiple_of(
    width: usize,
    height: usize,
    f: usize,
    origin: &str,
) -> Result<(), RunnerError> {
    if width == 0 || height == 0 || !width.is_multiple_of(f) || !height.is_multiple_of(f) {
        return Err(RunnerError::BadData {
            key: "image".into(),
            origin: origin.into(),
            reason: format!(
                "{width}x{height} pixels; the VAE encodes sizes that are multiples of {f}"
            ),
        });
    }
    Ok(())
}

/// What a pipeline needs of any VAE: its spatial scale, which halves it has, and graph
/// builders for both directions. Latents here are in the VAE's own space (the family's
/// scaling or statistics are applied outside).
pub trait Vae {
    /// Image pixels per latent pixel along each axis.
    fn scale_factor(&self) -> usize;
    fn has_encoder(&self) -> bool;
    fn has_decoder(&self) -> bool;
    /// Image channels the encoder takes (3 RGB, 4 RGBA).
    fn image_channels(&self) -> usize;
    /// Checks that a `width × height` image can be encoded (any size unless a VAE says).
    fn check_encode_size(&self, _width: usize, _height: usize) -> Result<(), RunnerError> {
        Ok(())
    }
    /// Latent [w, h, C, N] → raw decoder output [w·f, h·f, C_out, N], about [−1, 1].
    /// Only when [`Vae::has_decoder`].
    fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g>;
    /// Image [W, H, C_in, N] in [−1, 1] → the posterior mean [W/f, H/f, C, N]. Only when
    /// [`Vae::has_encoder`].
    fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g>;
    /// Video VAEs: a latent [w, h, T, C] (one clip, in the VAE's space) → frames
    /// [w·f, h·f, F, C_out] clamped to [−1, 1], run chunk by chunk on `runner`. `None` for image
    /// VAEs.
    fn decode_video(
        &self,
        _runner: &Runner,
        _z: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        None
    }
    /// Video VAEs: frames [W, H, F, C_in] in [−1, 1] (F = 1 + 4k for the Wan VAEs) → the
    /// posterior mean [W/f, H/f, T, C] in the VAE's space, chunk by chunk on `runner`. `None`
    /// for image VAEs.
    fn encode_video(
        &self,
        _runner: &Runner,
        _x: &HostTensor,
    ) -> Option<Result<HostTensor, RunnerError>> {
        None
    }
}
