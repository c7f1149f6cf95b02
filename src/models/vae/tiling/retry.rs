//! Decode retry on allocation failure (upstream `prepare_vae_decode_retry_tiling`).
//!
//! The main VAE decode first runs as asked. If the graph allocation fails it retries with
//! smaller spatial tiles, even when tiling was off: the first retry from an untiled decode
//! uses at most 256-pixel tiles, then every retry halves the tile down to 4 latent pixels per
//! axis. Each retry must shrink the tile; when it cannot, the last error is returned.
//! Execution failures are not retried (they can leave the device unusable), and encode has
//! no retry. The caller's settings are copied, never changed.

use super::grid::{
    plan_tiles, TileGrid, TileSettings, DEFAULT_OVERLAP, DEFAULT_TILE_PX, MIN_TILE_LATENT,
};
use super::TilingError;

/// Next (smaller) tile size in latent pixels after an allocation failure with tiles of
/// `current` latent pixels, or `None` when neither axis can shrink. `tiled` says whether the
/// failed run was already tiled; an untiled run is first capped at 256 image pixels.
pub fn next_retry_tiles(
    current: (usize, usize),
    tiled: bool,
    scale: usize,
) -> Option<(usize, usize)> {
    if current.0 == 0 || current.1 == 0 || scale == 0 {
        return None;
    }
    let shrink = |size: usize| {
        let mut next = size / 2;
        if !tiled {
            next = next.min(DEFAULT_TILE_PX as usize / scale);
        }
        size.min(next.max(MIN_TILE_LATENT))
    };
    let next = (shrink(current.0), shrink(current.1));
    (next != current).then_some(next)
}

/// The warning logged before a retry; sizes in latent pixels, printed in image pixels.
pub fn retry_warning(from: (usize, usize), to: (usize, usize), scale: usize) -> String {
    format!(
        "reducing VAE decode tiles from {}x{} to {}x{} image pixels",
        from.0 * scale,
        from.1 * scale,
        to.0 * scale,
        to.1 * scale
    )
}

/// Runs a decode of an `image_w` x `image_h` output (latent `image / scale`), retrying with
/// smaller tiles while `is_alloc_failure` says the error was an allocation failure.
///
/// `run(None)` decodes untiled; `run(Some(grid))` decodes with that tile grid. `settings`
/// is the user's tiling (`None` = `--vae-tiling` off).
pub fn decode_with_retry<T, E, R, A>(
    image_w: usize,
    image_h: usize,
    scale: usize,
    settings: Option<&TileSettings>,
    mut run: R,
    is_alloc_failure: A,
) -> Result<T, E>
where
    E: From<TilingError>,
    R: FnMut(Option<&TileGrid>) -> Result<T, E>,
    A: Fn(&E) -> bool,
{
    if scale == 0 {
        return Err(TilingError::InvalidScale.into());
    }
    let latent = (image_w / scale, image_h / scale);
    let mut current: Option<TileSettings> = settings.copied();
    loop {
        let grid = match &current {
            Some(s) => Some(plan_tiles(image_w, image_h, scale, s)?),
            None => None,
        };
        let tiles = grid.as_ref().map_or(latent, |g| (g.x.tile, g.y.tile));
        let err = match run(grid.as_ref()) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !is_alloc_failure(&err) {
            return Err(err);
        }
        let Some(next) = next_retry_tiles(tiles, current.is_some(), scale) else {
            return Err(err);
        };
        log::warn!("{}", retry_warning(tiles, next, scale));
        log::warn!("VAE decode ran out of memory; retrying with spatial tiling");
        current = Some(TileSettings {
            tile_w_px: (next.0 * scale) as u32,
            tile_h_px: (next.1 * scale) as u32,
            relative: None,
            overlap: current.map_or(DEFAULT_OVERLAP, |s| s.overlap),
        });
    }
}
