//! Tile-grid arithmetic: tile sizes from the user's settings and the tile origins that cover
//! each latent axis evenly.
//!
//! The numbers follow upstream stable-diffusion.cpp (`VAE::get_tile_sizes`,
//! `sd_tiling_calc_tiles` and the origin walk of `process_tiles_2d`) so that the same flags
//! give the same tiles. Integer and `f32` arithmetic is kept where upstream uses it, because
//! truncation decides the tile origins.

use super::TilingError;

/// Default tile edge in image pixels when a size is 0 (upstream: 256x256).
pub const DEFAULT_TILE_PX: u32 = 256;
/// Smallest tile edge in latent pixels (or the whole axis when that is shorter).
pub const MIN_TILE_LATENT: usize = 4;
/// Default target overlap as a fraction of the tile size.
pub const DEFAULT_OVERLAP: f32 = 0.5;
/// Largest target overlap; larger values are clamped to it.
pub const MAX_OVERLAP: f32 = 0.5;

/// What the user asked for (`--vae-tile-size`, `--vae-relative-tile-size`,
/// `--vae-tile-overlap`). Sizes are in image pixels; 0 means the 256-pixel default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TileSettings {
    /// Tile width in image pixels (0 = 256).
    pub tile_w_px: u32,
    /// Tile height in image pixels (0 = 256).
    pub tile_h_px: u32,
    /// Per-axis override (w, h): `<= 1` is a fraction of the input, `> 1` a target tile
    /// count. A 0 on an axis leaves that axis to `tile_*_px`.
    pub relative: Option<(f32, f32)>,
    /// Target overlap fraction; clamped to [0, 0.5]. The real overlap adapts per axis.
    pub overlap: f32,
}

impl Default for TileSettings {
    fn default() -> Self {
        TileSettings {
            tile_w_px: 0,
            tile_h_px: 0,
            relative: None,
            overlap: DEFAULT_OVERLAP,
        }
    }
}

impl TileSettings {
    /// Builds settings from the CLI's `VaeTiling { tile_w, tile_h, relative, overlap }` fields.
    pub const fn new(
        tile_w_px: u32,
        tile_h_px: u32,
        relative: Option<(f32, f32)>,
        overlap: f32,
    ) -> Self {
        TileSettings {
            tile_w_px,
            tile_h_px,
            relative,
            overlap,
        }
    }
}

/// The tiles along one axis, in latent pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisTiles {
    /// Length of the axis in latent pixels.
    pub len: usize,
    /// Tile length in latent pixels (`<= len`).
    pub tile: usize,
    /// Overlap fraction after adapting to the axis (upstream's per-axis "optimal overlap").
    pub overlap_factor: f32,
    /// Nominal overlap between consecutive tiles in latent pixels (the last tile may
    /// overlap more: it is pulled back to end at the axis end).
    pub overlap: usize,
    /// Tile start positions, strictly increasing; the last one is `len - tile`.
    pub origins: Vec<usize>,
}

impl AxisTiles {
    /// Number of tiles on this axis.
    pub fn count(&self) -> usize {
        self.origins.len()
    }
}

/// A full 2-D tiling of a latent of `x.len` x `y.len` pixels, for a VAE of scale `scale`.
#[derive(Debug, Clone, PartialEq)]
pub struct TileGrid {
    /// VAE scale factor (image pixels per latent pixel).
    pub scale: usize,
    /// Target overlap after clamping to [0, 0.5].
    pub target_overlap: f32,
    /// Columns.
    pub x: AxisTiles,
    /// Rows.
    pub y: AxisTiles,
}

impl TileGrid {
    /// Tiles as `(x0, y0, w, h)` in latent pixels, row by row (upstream's order).
    pub fn tiles(&self) -> impl Iterator<Item = (usize, usize, usize, usize)> + '_ {
        let (tw, th) = (self.x.tile, self.y.tile);
        self.y
            .origins
            .iter()
            .flat_map(move |&y0| self.x.origins.iter().map(move |&x0| (x0, y0, tw, th)))
    }

    /// Total number of tiles.
    pub fn len(&self) -> usize {
        self.x.count() * self.y.count()
    }

    /// Always false (a grid has at least one tile); present for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the whole latent is one tile.
    pub fn is_single(&self) -> bool {
        self.len() == 1
    }

    /// Tile width in image pixels.
    pub fn tile_w_px(&self) -> usize {
        self.x.tile * self.scale
    }

    /// Tile height in image pixels.
    pub fn tile_h_px(&self) -> usize {
        self.y.tile * self.scale
    }

    /// One tile covering a `latent_w` x `latent_h` latent (what an untiled run amounts to).
    pub fn single(latent_w: usize, latent_h: usize, scale: usize) -> TileGrid {
        let whole = |len: usize| AxisTiles {
            len,
            tile: len,
            overlap_factor: 0.0,
            overlap: 0,
            origins: vec![0],
        };
        TileGrid {
            scale,
            target_overlap: 0.0,
            x: whole(latent_w),
            y: whole(latent_h),
        }
    }
}

/// Plans the tiles for an image of `image_w_px` x `image_h_px` pixels (the decode output or
/// the encode input); the latent is `image / scale` (rounded down) on each axis.
pub fn plan_tiles(
    image_w_px: usize,
    image_h_px: usize,
    scale_factor: usize,
    settings: &TileSettings,
) -> Result<TileGrid, TilingError> {
    if scale_factor == 0 {
        return Err(TilingError::InvalidScale);
    }
    let (lw, lh) = (image_w_px / scale_factor, image_h_px / scale_factor);
    if lw == 0 || lh == 0 {
        return Err(TilingError::EmptyInput {
            w: image_w_px,
            h: image_h_px,
            scale: scale_factor,
        });
    }
    plan_tiles_latent(lw, lh, scale_factor, settings)
}

/// Plans the tiles for a latent of `latent_w` x `latent_h` pixels.
pub fn plan_tiles_latent(
    latent_w: usize,
    latent_h: usize,
    scale_factor: usize,
    settings: &TileSettings,
) -> Result<TileGrid, TilingError> {
    let (tile_w, tile_h, overlap) = resolve_tile_sizes(latent_w, latent_h, scale_factor, settings)?;
    Ok(TileGrid {
        scale: scale_factor,
        target_overlap: overlap,
        x: axis_tiles(latent_w, tile_w, overlap),
        y: axis_tiles(latent_h, tile_h, overlap),
    })
}

/// Tile sizes in latent pixels and the clamped target overlap (upstream `get_tile_sizes`).
pub fn resolve_tile_sizes(
    latent_w: usize,
    latent_h: usize,
    scale_factor: usize,
    settings: &TileSettings,
) -> Result<(usize, usize, f32), TilingError> {
    if scale_factor == 0 {
        return Err(TilingError::InvalidScale);
    }
    if latent_w == 0
        || latent_h == 0
        || latent_w > i32::MAX as usize
        || latent_h > i32::MAX as usize
    {
        return Err(TilingError::EmptyInput {
            w: latent_w * scale_factor,
            h: latent_h * scale_factor,
            scale: scale_factor,
        });
    }
    if !settings.overlap.is_finite() {
        return Err(TilingError::InvalidOverlap(settings.overlap));
    }
    let overlap = settings.overlap.clamp(0.0, MAX_OVERLAP);
    let (rel_w, rel_h) = settings.relative.unwrap_or((0.0, 0.0));
    let w = axis_tile_size(
        Axis::Width,
        settings.tile_w_px,
        rel_w,
        latent_w,
        scale_factor,
        overlap,
    )?;
    let h = axis_tile_size(
        Axis::Height,
        settings.tile_h_px,
        rel_h,
        latent_h,
        scale_factor,
        overlap,
    )?;
    Ok((w, h, overlap))
}

#[derive(Clone, Copy)]
enum Axis {
    Width,
    Height,
}

impl Axis {
    fn name(self) -> &'static str {
        match self {
            Axis::Width => "width",
            Axis::Height => "height",
        }
    }
}

/// One axis of `resolve_tile_sizes`.
fn axis_tile_size(
    axis: Axis,
    requested_px: u32,
    relative: f32,
    latent_len: usize,
    scale: usize,
    overlap: f32,
) -> Result<usize, TilingError> {
    if !relative.is_finite() || relative < 0.0 {
        return Err(TilingError::InvalidRelative {
            axis: axis.name(),
            value: relative,
        });
    }
    let min_tile = MIN_TILE_LATENT.min(latent_len);
    let base_px = if requested_px > 0 {
        requested_px
    } else {
        DEFAULT_TILE_PX
    };
    // Rounded down to whole latent pixels (integer division, as upstream).
    let mut size = (base_px as usize / scale) as f64;
    if relative > 0.0 {
        let mut fraction = f64::from(relative);
        if fraction > 1.0 {
            // A tile count n with overlap o spans n*(1-o)+o tiles.
            let ov = f64::from(overlap);
            fraction = 1.0 / (fraction * (1.0 - ov) + ov);
        }
        size = (latent_len as f64 * fraction).floor();
    }
    if size < min_tile as f64 {
        if relative > 0.0 {
            return Err(TilingError::RelativeTooSmall {
                axis: axis.name(),
                value: relative,
                latent: size as usize,
                min_px: min_tile * scale,
            });
        }
        if requested_px > 0 {
            return Err(TilingError::TileTooSmall {
                axis: axis.name(),
                requested_px,
                min_px: min_tile * scale,
            });
        }
    }
    Ok((size.max(min_tile as f64) as usize).min(latent_len))
}

/// Number of tiles and adapted overlap fraction for an axis of `len` latent pixels and tiles
/// of `tile <= len` (upstream `sd_tiling_calc_tiles`, non-circular).
pub(crate) fn adapt_axis(len: usize, tile: usize, target_overlap: f32) -> (usize, f32) {
    let (len_i, t) = (len as i64, tile as i64);
    if tile >= len {
        return (1, 0.0);
    }
    let ov = (t as f32 * target_overlap) as i64;
    let step = (t - ov).max(1);
    let mut n = (len_i - ov) / step;
    let overshoot = ((n + 1) * step + ov) % len_i;
    // Squeeze in one more tile when the tiles don't fit exactly and the extra tile keeps the
    // overlap at or below one half.
    if overshoot != step && overshoot <= n * (t / 2 - ov) {
        n += 1;
    }
    if n <= 2 {
        return (2, (2 * t - len_i) as f32 / t as f32);
    }
    (n as usize, (t * n - len_i) as f32 / (t * (n - 1)) as f32)
}

/// Tiles for one axis: walk by `tile - overlap`, pulling the last tile back to the axis end.
fn axis_tiles(len: usize, tile: usize, target_overlap: f32) -> AxisTiles {
    let (_, overlap_factor) = adapt_axis(len, tile, target_overlap);
    // Same f32 product and truncation as upstream, so the origins agree.
    let overlap = ((tile as f32 * overlap_factor) as usize).min(tile.saturating_sub(1));
    let step = tile - overlap;
    let mut origins = Vec::new();
    let mut pos = 0usize;
    loop {
        if pos + tile >= len {
            origins.push(len - tile);
            break;
        }
        origins.push(pos);
        pos += step;
    }
    AxisTiles {
        len,
        tile,
        overlap_factor,
        overlap,
        origins,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapt_axis_exact_fit_keeps_target() {
        // 64 latent px, 32 px tiles, 50%: 0, 16, 32.
        assert_eq!(adapt_axis(64, 32, 0.5), (3, 0.5));
        let a = axis_tiles(64, 32, 0.5);
        assert_eq!(a.origins, vec![0, 16, 32]);
        assert_eq!(a.overlap, 16);
    }

    #[test]
    fn adapt_axis_two_tiles() {
        // 40 px with 32 px tiles: two tiles overlapping by 24 px.
        let (n, f) = adapt_axis(40, 32, 0.5);
        assert_eq!(n, 2);
        assert!((f - 0.75).abs() < 1e-6);
        assert_eq!(axis_tiles(40, 32, 0.5).origins, vec![0, 8]);
    }

    #[test]
    fn single_tile_when_it_fits() {
        assert_eq!(adapt_axis(20, 20, 0.5), (1, 0.0));
        assert_eq!(axis_tiles(20, 20, 0.5).origins, vec![0]);
    }
}
