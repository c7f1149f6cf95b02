//! MiniMax-H3's spatial tiling rule and its tiled video decode.
//!
//! The model was released with tiled decoding, so tiling is always on (stable-diffusion.cpp
//! `MiniMaxH3VideoVAERunner::resolve_tiling_params`): 256×256-pixel tiles unless the user gave
//! sizes, a 0.25 target overlap unless `--vae-tiling` was passed (then the user's overlap),
//! never in time. The grid, blend and out-of-memory retry are the shared ones
//! (`models::vae::tiling`).

use crate::error::{Error, Result};
use crate::models::vae::tiling::{
    plan_tiles, tiled_encode, tiled_video_decode, TileSettings, DEFAULT_TILE_PX,
};
use crate::progress::Progress;
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

/// Encodes frames x [W, H, F, 3] in [−1, 1] (W, H multiples of 16) to the raw posterior mean
/// [W/16, H/16, T, latent], spatially tiled per [`tile_settings`]`(user)` as upstream encodes
/// (each tile over the whole video, blended as image tiles are; no retry, as for every
/// encode). Normalise the result with [`normalize_video_latent`](super::normalize_video_latent).
pub fn encode_video_tiled(
    vae: &MiniMaxH3Vae,
    runner: &Runner,
    x: &HostTensor,
    user: Option<&TileSettings>,
) -> Result<HostTensor> {
    let [w, h, frames, c] = x.ne;
    vae.check_encode_size(w, h)?;
    let scale = vae.scale_factor();
    let grid = plan_tiles(w, h, scale, &tile_settings(user))?;
    if grid.is_single() {
        return Ok(vae.encode_video(runner, x)?);
    }
    log::debug!(
        "VAE video encode: {} tiles of {}x{} image pixels",
        grid.len(),
        grid.tile_w_px(),
        grid.tile_h_px()
    );
    // Frames × channels stand in for an image's channels: the blend works plane by plane.
    let planes = |ne: [usize; 4], data| HostTensor {
        ne: [ne[0], ne[1], ne[2] * ne[3], 1],
        data,
    };
    let mut latent_ne = (0, 0);
    let mut bar = Progress::new("video tiles", grid.len());
    let out = tiled_encode(
        &planes(x.ne, x.data.clone()),
        scale,
        &grid,
        |tile| -> Result<HostTensor> {
            let clip = HostTensor {
                ne: [tile.ne[0], tile.ne[1], frames, c],
                data: tile.data.clone(),
            };
            let mean = vae.encode_video(runner, &clip)?;
            latent_ne = (mean.ne[2], mean.ne[3]);
            Ok(planes(mean.ne, mean.data))
        },
        |i, _| bar.set(i),
    )?;
    Ok(HostTensor {
        ne: [out.ne[0], out.ne[1], latent_ne.0, latent_ne.1],
        data: out.data,
    })
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
