//! The VAE tiling flags (`--vae-tiling`, `--vae-tile-size`, `--vae-relative-tile-size`,
//! `--vae-tile-overlap`) into [`TileSettings`]. Sizes are in image pixels; rounding to the VAE
//! scale factor and capping at the input size happen in the VAE code, which knows the model.

use crate::cli::args::VaeArgs;
use crate::cli::error::{invalid, CliError};
use crate::models::vae::tiling::TileSettings;

use crate::models::vae::tiling::{
    DEFAULT_OVERLAP, DEFAULT_TILE_PX as DEFAULT_TILE_SIZE, MAX_OVERLAP,
};

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
    let c = v.clamp(0.0, MAX_OVERLAP);
    Ok((c, c != v))
}

/// `Some` settings with `--vae-tiling`; the size and overlap flags need it.
pub(super) fn resolve(
    v: &VaeArgs,
    warnings: &mut Vec<String>,
) -> Result<Option<TileSettings>, CliError> {
    if !v.vae_tiling {
        for (flag, given) in [
            ("--vae-tile-size", v.vae_tile_size.is_some()),
            (
                "--vae-relative-tile-size",
                v.vae_relative_tile_size.is_some(),
            ),
            ("--vae-tile-overlap", v.vae_tile_overlap.is_some()),
        ] {
            if given {
                return Err(CliError::Requires {
                    flag,
                    requires: "--vae-tiling",
                });
            }
        }
        return Ok(None);
    }
    let mut t = TileSettings::new(DEFAULT_TILE_SIZE, DEFAULT_TILE_SIZE, None, DEFAULT_OVERLAP);
    if let Some(s) = &v.vae_tile_size {
        let (w, h) = parse_tile_size(s).map_err(|e| invalid("--vae-tile-size", s, e))?;
        t.tile_w_px = w;
        t.tile_h_px = h;
    }
    if let Some(s) = &v.vae_relative_tile_size {
        t.relative = Some(
            parse_relative_tile_size(s).map_err(|e| invalid("--vae-relative-tile-size", s, e))?,
        );
    }
    if let Some(o) = v.vae_tile_overlap {
        let (c, clamped) = clamp_overlap(o).map_err(|e| invalid("--vae-tile-overlap", o, e))?;
        if clamped {
            warnings.push(format!(
                "--vae-tile-overlap {o} clamped to {c} (allowed range [0, 0.5])"
            ));
        }
        t.overlap = c;
    }
    Ok(Some(t))
}

/// Keys `--extra-tiling-args` knows (upstream: the LTX video VAE's temporal tiles).
const TEMPORAL_KEYS: [&str; 2] = ["temporal_tile_frames", "temporal_tile_overlap"];

/// `--temporal-tiling` and `--extra-tiling-args`. Upstream tiles time only in the LTX video VAE;
/// its other VAEs ignore both. The video VAEs here (Wan 2.1 / 2.2) already decode one latent
/// frame per graph, so memory does not grow with the clip: the flags are checked as upstream
/// checks them (integer values, known keys) and then ignored with a warning that says so.
pub(super) fn temporal(v: &VaeArgs, warnings: &mut Vec<String>) {
    let raw = v.extra_tiling_args.join(",");
    let (pairs, parse_warnings) =
        crate::pipeline::model_args::parse_key_value_list(&raw, "--extra-tiling-args");
    warnings.extend(parse_warnings);
    for (key, value) in &pairs {
        if value.parse::<i64>().is_err() {
            warnings.push(format!(
                "--extra-tiling-args: ignoring invalid value '{key}={value}' (an integer is expected)"
            ));
        } else if !TEMPORAL_KEYS.contains(&key.as_str()) {
            warnings.push(format!(
                "--extra-tiling-args: ignoring unknown key '{key}' (known: {})",
                TEMPORAL_KEYS.join(", ")
            ));
        }
    }
    if v.temporal_tiling || !pairs.is_empty() {
        warnings.push(
            "--temporal-tiling / --extra-tiling-args: only the LTX video VAE tiles time \
             (upstream); the Wan VAEs already decode one latent frame at a time, so they are \
             ignored (--vae-tiling tiles video frames spatially)"
                .into(),
        );
    }
}
