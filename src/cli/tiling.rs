//! Syntax of the VAE tiling flags (`--vae-tile-size`, `--vae-relative-tile-size`,
//! `--vae-tile-overlap`). Sizes are in image pixels; rounding to the VAE scale factor and
//! capping at the input size happen in the VAE code, which knows the model.

use serde::Serialize;

/// Default tile edge in image pixels (upstream: 256x256).
pub const DEFAULT_TILE_SIZE: u32 = 256;
/// Default overlap as a fraction of the tile size.
pub const DEFAULT_TILE_OVERLAP: f32 = 0.5;
/// Largest overlap fraction that still makes progress.
pub const MAX_TILE_OVERLAP: f32 = 0.5;

/// Resolved VAE tiling request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VaeTiling {
    /// Tile width in image pixels (a `0` on the command line became the default).
    pub tile_w: u32,
    /// Tile height in image pixels.
    pub tile_h: u32,
    /// `--vae-relative-tile-size` (w, h): <= 1 fraction of the image, > 1 tile count.
    /// When set it overrides `tile_w`/`tile_h`.
    pub relative: Option<(f32, f32)>,
    /// Overlap fraction in [0, 0.5].
    pub overlap: f32,
}

impl Default for VaeTiling {
    fn default() -> Self {
        VaeTiling {
            tile_w: DEFAULT_TILE_SIZE,
            tile_h: DEFAULT_TILE_SIZE,
            relative: None,
            overlap: DEFAULT_TILE_OVERLAP,
        }
    }
}

fn split_wh(s: &str) -> (&str, Option<&str>) {
    match s.find(['x', 'X']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

/// Parses `S` or `WxH` (non-negative integers; `0` on an axis means the default 256).
pub fn parse_tile_size(s: &str) -> Result<(u32, u32), String> {
    let one = |t: &str| -> Result<u32, String> {
        let t = t.trim();
        let v: i64 = t.parse().map_err(|_| {
            format!("'{t}' is not an integer (expected S or WxH, e.g. 512 or 512x256)")
        })?;
        if v < 0 {
            return Err(format!("tile size {v} is negative"));
        }
        if v > 1 << 20 {
            return Err(format!("tile size {v} is too large"));
        }
        Ok(if v == 0 { DEFAULT_TILE_SIZE } else { v as u32 })
    };
    let (a, b) = split_wh(s.trim());
    let w = one(a)?;
    let h = match b {
        Some(b) => one(b)?,
        None => w,
    };
    Ok((w, h))
}

/// Parses `S` or `WxH` as positive finite floats.
pub fn parse_relative_tile_size(s: &str) -> Result<(f32, f32), String> {
    let one = |t: &str| -> Result<f32, String> {
        let t = t.trim();
        let v: f32 = t
            .parse()
            .map_err(|_| format!("'{t}' is not a number (expected S or WxH, e.g. 0.5 or 2x3)"))?;
        if !v.is_finite() || v <= 0.0 {
            return Err(format!(
                "relative tile size {t} must be a finite number > 0"
            ));
        }
        Ok(v)
    };
    let (a, b) = split_wh(s.trim());
    let w = one(a)?;
    let h = match b {
        Some(b) => one(b)?,
        None => w,
    };
    Ok((w, h))
}

/// Clamps the overlap into [0, 0.5]; returns the value and whether it was clamped.
/// NaN is an error.
pub fn clamp_overlap(v: f32) -> Result<(f32, bool), String> {
    if v.is_nan() {
        return Err("overlap is not a number".into());
    }
    let c = v.clamp(0.0, MAX_TILE_OVERLAP);
    Ok((c, c != v))
}
