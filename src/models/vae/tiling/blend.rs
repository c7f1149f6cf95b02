//! Blended tiled execution over host images.
//!
//! Each tile's output is accumulated as `value * weight` and `weight` per output pixel, then
//! divided, so the weights need not sum to one. Per axis a tile's weight ramps linearly
//! across the region it actually shares with its neighbour (half-pixel centred, so it never
//! reaches 0 and two overlapping ramps sum to exactly 1); edges on the image border keep
//! weight 1. The 2-D weight is the product of the two axis weights. Linear ramps bound the
//! seam: a per-tile offset difference `d` moves neighbouring pixels by at most `d / overlap`.
//! (Upstream uses a smootherstep ramp without normalising; the linear ramp is smooth enough
//! over the overlap and keeps that bound.)
//!
//! Accumulation is in f64: when every tile returns the same value for a pixel the normalised
//! result rounds back to that f32 value exactly.

use super::{TileGrid, TilingError};
use crate::tensor::HostTensor;

/// Decodes `latent` tile by tile; each tile's output must be `scale` times bigger.
/// `progress(i, n)` is called after tile `i` of `n` (1-based) is merged.
pub fn tiled_decode<E, F, P>(
    latent: &HostTensor,
    scale: usize,
    grid: &TileGrid,
    decode_tile: F,
    progress: P,
) -> Result<HostTensor, E>
where
    E: From<TilingError>,
    F: FnMut(&HostTensor) -> Result<HostTensor, E>,
    P: FnMut(usize, usize),
{
    check_grid(grid, scale)?;
    if latent.width() != grid.x.len || latent.height() != grid.y.len || !latent.is_consistent() {
        return Err(TilingError::Shape(format!(
            "latent is {}x{} ({} values for {} channels) but the tiles were planned for {}x{}",
            latent.width(),
            latent.height(),
            latent.data.len(),
            latent.channels(),
            grid.x.len,
            grid.y.len
        ))
        .into());
    }
    run_tiles(latent, grid, 1, scale, decode_tile, progress)
}

/// Encodes `image` tile by tile; each tile's output must be `scale` times smaller. The image
/// must be `grid.x.len * scale` by `grid.y.len * scale` pixels, up to `scale - 1` extra
/// pixels on the right/bottom that no tile reads (the latent size rounds down).
pub fn tiled_encode<E, F, P>(
    image: &HostTensor,
    scale: usize,
    grid: &TileGrid,
    encode_tile: F,
    progress: P,
) -> Result<HostTensor, E>
where
    E: From<TilingError>,
    F: FnMut(&HostTensor) -> Result<HostTensor, E>,
    P: FnMut(usize, usize),
{
    check_grid(grid, scale)?;
    if image.width() / scale != grid.x.len
        || image.height() / scale != grid.y.len
        || !image.is_consistent()
    {
        return Err(TilingError::Shape(format!(
            "image is {}x{} ({} values for {} channels) but the tiles were planned for a {}x{} latent at scale {scale}",
            image.width(),
            image.height(),
            image.data.len(),
            image.channels(),
            grid.x.len,
            grid.y.len
        ))
        .into());
    }
    run_tiles(image, grid, scale, 1, encode_tile, progress)
}

fn check_grid(grid: &TileGrid, scale: usize) -> Result<(), TilingError> {
    if scale == 0 {
        return Err(TilingError::InvalidScale);
    }
    if grid.scale != scale {
        return Err(TilingError::Shape(format!(
            "tile grid was planned for VAE scale {} but the call uses {scale}",
            grid.scale
        )));
    }
    // Grids are normally built by `plan_tiles`; reject hand-made ones that would index
    // outside the image.
    for a in [&grid.x, &grid.y] {
        if a.tile == 0 || a.origins.is_empty() || a.origins.iter().any(|&o| o + a.tile > a.len) {
            return Err(TilingError::Shape(format!(
                "tile grid axis of {} px with {}-px tiles at {:?} is inconsistent",
                a.len, a.tile, a.origins
            )));
        }
    }
    Ok(())
}

/// Per-tile linear weights along one axis, in output units (`out_scale` per latent pixel).
fn axis_weights(origins: &[usize], tile: usize, out_scale: usize) -> Vec<Vec<f64>> {
    let len = tile * out_scale;
    (0..origins.len())
        .map(|k| {
            // Overlap actually shared with each neighbour (the last tile may share more).
            let left = if k > 0 {
                (origins[k - 1] + tile).saturating_sub(origins[k]) * out_scale
            } else {
                0
            };
            let right = if k + 1 < origins.len() {
                (origins[k] + tile).saturating_sub(origins[k + 1]) * out_scale
            } else {
                0
            };
            (0..len)
                .map(|i| {
                    let mut w = 1.0f64;
                    if left > 0 {
                        w = w.min((i as f64 + 0.5) / left as f64);
                    }
                    if right > 0 {
                        w = w.min((len as f64 - i as f64 - 0.5) / right as f64);
                    }
                    w
                })
                .collect()
        })
        .collect()
}

/// Shared tile loop. Tile windows are `in_scale` and outputs `out_scale` per latent pixel.
fn run_tiles<E, F, P>(
    input: &HostTensor,
    grid: &TileGrid,
    in_scale: usize,
    out_scale: usize,
    mut compute: F,
    mut progress: P,
) -> Result<HostTensor, E>
where
    E: From<TilingError>,
    F: FnMut(&HostTensor) -> Result<HostTensor, E>,
    P: FnMut(usize, usize),
{
    let n = grid.len();
    let (out_w, out_h) = (grid.x.len * out_scale, grid.y.len * out_scale);
    let (tile_out_w, tile_out_h) = (grid.x.tile * out_scale, grid.y.tile * out_scale);
    let check_out = |out: &HostTensor, c: Option<usize>| -> Result<(), TilingError> {
        if out.width() != tile_out_w
            || out.height() != tile_out_h
            || out.ne[3] != 1
            || !out.is_consistent()
            || c.is_some_and(|c| c != out.channels())
        {
            return Err(TilingError::Shape(format!(
                "tile output is {}x{}x{} ({} values), expected {tile_out_w}x{tile_out_h}{}",
                out.width(),
                out.height(),
                out.channels(),
                out.data.len(),
                c.map(|c| format!("x{c}")).unwrap_or_default()
            )));
        }
        Ok(())
    };

    if grid.is_single() {
        // One tile: no cropping (unless encode drops a ragged edge) and no blending.
        let whole =
            if input.width() == grid.x.len * in_scale && input.height() == grid.y.len * in_scale {
                compute(input)?
            } else {
                compute(&input.crop(0, 0, grid.x.len * in_scale, grid.y.len * in_scale))?
            };
        check_out(&whole, None)?;
        progress(1, 1);
        return Ok(whole);
    }

    let wx = axis_weights(&grid.x.origins, grid.x.tile, out_scale);
    let wy = axis_weights(&grid.y.origins, grid.y.tile, out_scale);
    let plane = out_w * out_h;
    let mut acc: Vec<f64> = Vec::new();
    let mut wsum = vec![0.0f64; plane];
    let mut channels = None;

    for (i, (x0, y0, tw, th)) in grid.tiles().enumerate() {
        let tile_in = input.crop(x0 * in_scale, y0 * in_scale, tw * in_scale, th * in_scale);
        let out = compute(&tile_in)?;
        check_out(&out, channels)?;
        if channels.is_none() {
            channels = Some(out.channels());
            acc = vec![0.0; plane * out.channels()];
        }
        let (kx, ky) = (i % grid.x.count(), i / grid.x.count());
        let (ox, oy) = (x0 * out_scale, y0 * out_scale);
        for (ty, &row_w) in wy[ky].iter().enumerate() {
            let dst_row = (oy + ty) * out_w + ox;
            for (s, &w) in wsum[dst_row..][..tile_out_w].iter_mut().zip(&wx[kx]) {
                *s += row_w * w;
            }
            for ch in 0..out.channels() {
                let src = &out.data[(ty + tile_out_h * ch) * tile_out_w..][..tile_out_w];
                let dst = &mut acc[ch * plane + dst_row..][..tile_out_w];
                for ((d, &v), &w) in dst.iter_mut().zip(src).zip(&wx[kx]) {
                    *d += f64::from(v) * row_w * w;
                }
            }
        }
        progress(i + 1, n);
    }

    let c = channels.unwrap_or(0);
    let mut data = Vec::with_capacity(plane * c);
    for ch in 0..c {
        for (a, &w) in acc[ch * plane..(ch + 1) * plane].iter().zip(&wsum) {
            if w <= 0.0 {
                return Err(TilingError::Shape(
                    "an output pixel is not covered by any tile".into(),
                )
                .into());
            }
            data.push((a / w) as f32);
        }
    }
    Ok(HostTensor {
        ne: [out_w, out_h, c, 1],
        data,
    })
}
