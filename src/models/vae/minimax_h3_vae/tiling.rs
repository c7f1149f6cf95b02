//! MiniMax-H3's spatial tiling rule and its tiled video decode.
//!
//! The model was released with tiled decoding, so tiling is always on (stable-diffusion.cpp
//! `MiniMaxH3VideoVAERunner::resolve_tiling_params`): 256×256-pixel tiles unless the user gave
//! sizes, a 0.25 target overlap unless `--vae-tiling` was passed (then the user's overlap),
//! never in time. The grid, blend and out-of-memory retry are the shared ones
//! (`models::vae::tiling`).

use crate::error::{Error, Result};
use crate::models::vae::tiling::{tiled_video_decode, TileSettings, DEFAULT_TILE_PX};
use crate::runner::Runner;
use crate::tensor::HostTensor;

use super::MiniMaxH3Vae;

/// Target tile overlap when the user did not ask for tiling.
pub const DEFAULT_OVERLAP: f32 = 0.25;

/// The tile settings MiniMax-H3 decodes (and encodes) with, given the user's (`None` without
/// `--vae-tiling`). A 0 size with no relative size means 256 pixels.
pub fn tile_settings(user: Option<&TileSettings>) -> TileSettings {
    match user {
        Some(s) => {
            let mut s = *s;
            let (rw, rh) = s.relative.unwrap_or((0.0, 0.0));
            if s.tile_w_px == 0 && rw == 0.0 {
                s.tile_w_px = DEFAULT_TILE_PX;
            }
            if s.tile_h_px == 0 && rh == 0.0 {
                s.tile_h_px = DEFAULT_TILE_PX;
            }
            s
        }
        None => TileSettings::new(DEFAULT_TILE_PX, DEFAULT_TILE_PX, None, DEFAULT_OVERLAP),
    }
}

/// Decodes a raw VAE latent z [w, h, T, C] (ggml order; `latent · std + mean` of the sampler's,
/// see [`LatentStats::denormalize`](crate::models::vae::qwen_image_2_1_vae::LatentStats::denormalize))
/// to frames [16w, 16h, F, 3] in [−1, 1], spatially tiled per [`tile_settings`]`(user)`; an
/// allocation failure retries with smaller tiles. `runner` holds `vae`'s weights.
pub fn decode_video_tiled(
    vae: &MiniMaxH3Vae,
    runner: &Runner,
    z: &HostTensor,
    user: Option<&TileSettings>,
) -> Result<HostTensor> {
    let settings = tile_settings(user);
    tiled_video_decode(
        z,
        vae.scale_factor(),
        Some(&settings),
        |clip: &HostTensor| -> Result<HostTensor> { Ok(vae.decode_video(runner, clip)?) },
        |e: &Error| matches!(e, Error::Runner(r) if r.is_alloc_failure()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_without_vae_tiling() {
        let s = tile_settings(None);
        assert_eq!((s.tile_w_px, s.tile_h_px, s.overlap), (256, 256, 0.25));
    }

    #[test]
    fn user_settings_are_kept() {
        let user = TileSettings::new(128, 0, None, 0.5);
        let s = tile_settings(Some(&user));
        assert_eq!((s.tile_w_px, s.tile_h_px, s.overlap), (128, 256, 0.5));
        let rel = TileSettings::new(0, 0, Some((0.5, 0.0)), 0.3);
        let s = tile_settings(Some(&rel));
        assert_eq!((s.tile_w_px, s.tile_h_px), (0, 256));
    }
}
