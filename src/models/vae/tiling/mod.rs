//! Spatial tiling for VAE encode and decode (`--vae-tiling`, `--vae-tile-size`,
//! `--vae-relative-tile-size`, `--vae-tile-overlap`) and the decode out-of-memory retry.
//!
//! Contract (upstream stable-diffusion.cpp, docs/performance.md):
//! - Tile sizes are in image pixels, default 256x256, 0 on an axis means 256; they are rounded
//!   down to a multiple of the VAE scale factor and capped at the input size. An explicit size
//!   below 4 latent pixels on an axis (or below the whole axis when that is shorter) is an
//!   error. Encode and decode use the same sizes; an input that fits in one tile is one tile.
//! - The overlap is clamped to [0, 0.5] and adapted per axis so the tiles cover it evenly.
//! - A relative size overrides the pixel size per axis: `<= 1` is a fraction of the input,
//!   `> 1` a target tile count (overlap-aware).
//! - Decode retries allocation failures with smaller tiles (see [`decode_with_retry`]).
//!
//! Everything here works in latent pixels, the tile grid being shared by encode (input
//! `scale`x bigger) and decode (output `scale`x bigger). The blending in [`tiled_decode`] /
//! [`tiled_encode`] is host-side and model-agnostic; the caller supplies the per-tile
//! compute.

mod blend;
mod grid;
mod retry;
mod video;

pub use blend::{tiled_decode, tiled_encode};
pub use grid::{
    plan_tiles, plan_tiles_latent, resolve_tile_sizes, AxisTiles, TileGrid, TileSettings,
    DEFAULT_OVERLAP, DEFAULT_TILE_PX, MAX_OVERLAP, MIN_TILE_LATENT,
};
pub use retry::{decode_with_retry, next_retry_tiles, retry_warning};
pub use video::tiled_video_decode;

/// Errors from planning tiles or from shapes that don't fit the plan.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TilingError {
    /// The VAE scale factor is zero.
    #[error("VAE scale factor must be at least 1")]
    InvalidScale,
    /// The input is smaller than one latent pixel on an axis.
    #[error(
        "VAE tiling: input {w}x{h} pixels is smaller than one latent pixel at VAE scale {scale}"
    )]
    EmptyInput { w: usize, h: usize, scale: usize },
    /// `--vae-tile-overlap` is not a finite number.
    #[error("--vae-tile-overlap: {0} is not a finite number")]
    InvalidOverlap(f32),
    /// `--vae-relative-tile-size` is negative or not finite.
    #[error("--vae-relative-tile-size: {axis} {value} must be a finite number >= 0")]
    InvalidRelative { axis: &'static str, value: f32 },
    /// `--vae-tile-size` gives fewer than the minimum latent pixels on an axis.
    #[error(
        "--vae-tile-size: tile {axis} {requested_px} pixels is too small; \
         VAE tile size must be at least {min_px} image pixels on this axis"
    )]
    TileTooSmall {
        axis: &'static str,
        requested_px: u32,
        min_px: usize,
    },
    /// `--vae-relative-tile-size` gives fewer than the minimum latent pixels on an axis.
    #[error(
        "--vae-relative-tile-size: {axis} {value} gives a {latent}-latent-pixel tile; \
         VAE tile size must be at least {min_px} image pixels on this axis"
    )]
    RelativeTooSmall {
        axis: &'static str,
        value: f32,
        latent: usize,
        min_px: usize,
    },
    /// An input or tile output has a shape that does not match the tile grid.
    #[error("VAE tiling: {0}")]
    Shape(String),
}

impl From<crate::tensor::ShapeError> for TilingError {
    fn from(e: crate::tensor::ShapeError) -> Self {
        TilingError::Shape(e.to_string())
    }
}
