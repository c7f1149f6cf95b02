//! Qwen-VL image preprocessing (transformers `Qwen2VLImageProcessorPil`, which Qwen3-VL uses):
//! the target size ([`smart_resize`]) and the flattening of an image already at that size into
//! the vision tower's patch vectors ([`patchify`]). Resampling itself is not done here.

use std::path::Path;

use serde_json::Value;

use super::error::VisionError;
use crate::weights::GgufMetadata;

/// The image processor settings of Qwen3-VL's `preprocessor_config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionPreprocessConfig {
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// `size.shortest_edge` (legacy `min_pixels`): the least pixel count after resizing.
    pub min_pixels: u64,
    /// `size.longest_edge` (legacy `max_pixels`): the largest pixel count after resizing.
    pub max_pixels: u64,
    /// Multiplies the u8 pixel values before normalisation (1/255).
    pub rescale_factor: f64,
}

impl Default for VisionPreprocessConfig {
    fn default() -> Self {
        Self {
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            rescale_factor: 1.0 / 255.0,
        }
    }
}

impl VisionPreprocessConfig {
    /// The size both sides of a resized image are multiples of (patch × merge).
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// Reads a `preprocessor_config.json`; keys it lacks keep their defaults.
    pub fn from_json_file(path: &Path) -> Result<Self, VisionError> {
        let bad = |reason: String| VisionError::BadConfig {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        Self::default().with_json(&json).map_err(bad)
    }

    /// Applies the keys of a parsed `preprocessor_config.json` over `self`.
    pub fn with_json(mut self, json: &Value) -> Result<Self, String> {
        let uint = |v: &Value, key: &str| -> Result<Option<u64>, String> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| format!("'{key}' is not a non-negative integer")),
            }
        };
        let triple = |key: &str| -> Result<Option<[f32; 3]>, String> {
            let Some(v) = json.get(key) else {
                return Ok(None);
            };
            let vals: Option<Vec<f32>> = match v {
                Value::Array(a) => a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect(),
                Value::Number(n) => n.as_f64().map(|f| vec![f as f32; 3]),
                _ => None,
            };
            match vals.as_deref() {
                Some(&[a, b, c]) => Ok(Some([a, b, c])),
                _ => Err(format!("'{key}' is not a number or a list of 3 numbers")),
            }
        };
        let as_usize = |v: u64| usize::try_from(v).map_err(|_| "value too large".to_string());
        if let Some(v) = uint(json, "patch_size")? {
            self.patch_size = as_usize(v)?;
        }
        if let Some(v) = uint(json, "temporal_patch_size")? {
            self.temporal_patch_size = as_usize(v)?;
        }
        if let Some(v) = uint(json, "merge_size")? {
            self.merge_size = as_usize(v)?;
        }
        if let Some(v) = triple("image_mean")? {
            self.image_mean = v;
        }
        if let Some(v) = triple("image_std")? {
            self.image_std = v;
        }
        if let Some(v) = json.get("rescale_factor").and_then(Value::as_f64) {
            self.rescale_factor = v;
        }
        // transformers 5 keeps the limits in `size`; older files have top-level keys.
        if let Some(v) = uint(json, "min_pixels")? {
            self.min_pixels = v;
        }
        if let Some(v) = uint(json, "max_pixels")? {
            self.max_pixels = v;
        }
        if let Some(size) = json.get("size") {
            if let Some(v) = uint(size, "shortest_edge")? {
                self.min_pixels = v;
            }
            if let Some(v) = uint(size, "longest_edge")? {
                self.max_pixels = v;
            }
        }
        self.validate()?;
        Ok(self)
    }

    /// Applies what a llama.cpp mmproj GGUF says: `clip.vision.image_mean` / `image_std`,
    /// `clip.vision.patch_size`, `clip.vision.spatial_merge_size`. llama.cpp's Qwen3-VL path
    /// reads no pixel limits from the file (it uses fixed token limits), so min/max pixels
    /// keep their values.
    pub fn with_gguf(mut self, meta: &GgufMetadata) -> Result<Self, String> {
        let triple = |key: &str| match meta.get_arr_f32(key).as_deref() {
            Some(&[a, b, c]) => Some([a, b, c]),
            _ => None,
        };
        if let Some(v) = triple("clip.vision.image_mean") {
            self.image_mean = v;
        }
        if let Some(v) = triple("clip.vision.image_std") {
            self.image_std = v;
        }
        if let Some(v) = meta.get_u32("clip.vision.patch_size") {
            self.patch_size = v as usize;
        }
        if let Some(v) = meta.get_u32("clip.vision.spatial_merge_size") {
            self.merge_size = v as usize;
        }
        self.validate()?;
        Ok(self)
    }

    fn validate(&self) -> Result<(), String> {
        if self.patch_size == 0 || self.temporal_patch_size == 0 || self.merge_size == 0 {
            return Err("patch, temporal patch and merge sizes must be positive".into());
        }
        if self.image_std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            return Err(format!("image_std {:?} has a zero entry", self.image_std));
        }
        if self.min_pixels > self.max_pixels {
            return Err(format!(
                "min pixels {} exceed max pixels {}",
                self.min_pixels, self.max_pixels
            ));
        }
        Ok(())
    }

    /// [`smart_resize`] with these settings: the (height, width) to resize an image to.
    pub fn target_size(&self, height: usize, width: usize) -> Result<(usize, usize), VisionError> {
        smart_resize(
            height,
            width,
            self.factor(),
            self.min_pixels,
            self.max_pixels,
        )
    }

    /// [`patchify`] with these settings.
    pub fn patchify(
        &self,
        rgb: &[u8],
        width: usize,
        height: usize,
    ) -> Result<(Vec<f32>, [usize; 3]), VisionError> {
        self.patchify_frames(&[rgb], width, height)
    }

    /// [`patchify_frames`] with these settings.
    pub fn patchify_frames(
        &self,
        frames: &[&[u8]],
        width: usize,
        height: usize,
    ) -> Result<(Vec<f32>, [usize; 3]), VisionError> {
        patchify_frames(
            frames,
            width,
            height,
            self.image_mean,
            self.image_std,
            self.patch_size,
            self.temporal_patch_size,
            self.merge_size,
            self.rescale_factor,
        )
    }
}

/// The size transformers' Qwen2-VL `smart_resize` gives: both sides multiples of `factor`, the
/// area within [`min_pixels`, `max_pixels`] where possible, the aspect ratio kept as well as
/// rounding allows. Sides are first rounded to the nearest multiple (ties to even, as Python's
/// `round`); an area over the maximum shrinks both by √(h·w/max) (rounding down, at least
/// `factor`), one under the minimum grows both by √(min/(h·w)) (rounding up).
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize), VisionError> {
    if height == 0 || width == 0 {
        return Err(VisionError::EmptyImage { height, width });
    }
    if factor == 0 || max_pixels == 0 {
        return Err(VisionError::BadSetting(format!(
            "smart_resize factor {factor} and max pixels {max_pixels} must be positive"
        )));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if h.max(w) / h.min(w) > 200.0 {
        return Err(VisionError::AspectRatio { height, width });
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// Flattens an RGB image (u8, `height` rows of `width` pixels, channels interleaved) that is
/// already at its [`smart_resize`]d size into the processor's `pixel_values`: values
/// `(v·rescale − mean) / std`, patches of `patch`² pixels in spatial-merge-window order
/// (windows of `merge`² patches row-major, patches row-major inside each), each patch's vector
/// ordered (channel, frame, y, x) with the single frame repeated `temporal` times.
///
/// Returns `(patches [n, 3·temporal·patch²] row-major, grid [1, height/patch, width/patch])`.
#[allow(clippy::too_many_arguments)]
pub fn patchify(
    rgb: &[u8],
    width: usize,
    height: usize,
    mean: [f32; 3],
    std: [f32; 3],
    patch: usize,
    temporal: usize,
    merge: usize,
    rescale: f64,
) -> Result<(Vec<f32>, [usize; 3]), VisionError> {
    patchify_frames(
        &[rgb],
        width,
        height,
        mean,
        std,
        patch,
        temporal,
        merge,
        rescale,
    )
}

/// [`patchify`] of one temporal patch of several frames (a video block): temporal slot `t`
/// reads frame `min(t, frames − 1)`, so one frame is repeated as for an image.
#[allow(clippy::too_many_arguments)]
pub fn patchify_frames(
    frames: &[&[u8]],
    width: usize,
    height: usize,
    mean: [f32; 3],
    std: [f32; 3],
    patch: usize,
    temporal: usize,
    merge: usize,
    rescale: f64,
) -> Result<(Vec<f32>, [usize; 3]), VisionError> {
    if width == 0 || height == 0 {
        return Err(VisionError::EmptyImage { height, width });
    }
    if patch == 0 || temporal == 0 || merge == 0 || frames.is_empty() {
        return Err(VisionError::BadSetting(
            "patch, temporal patch and merge sizes must be positive, with a frame".into(),
        ));
    }
    let expected = width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(3))
        .ok_or(VisionError::EmptyImage { height, width })?;
    if let Some(rgb) = frames.iter().find(|f| f.len() != expected) {
        return Err(VisionError::RgbLength {
            height,
            width,
            expected,
            got: rgb.len(),
        });
    }
    let cell = patch * merge;
    if !height.is_multiple_of(cell) || !width.is_multiple_of(cell) {
        return Err(VisionError::NotPatchAligned {
            height,
            width,
            patch,
            merge,
        });
    }
    let (gh, gw) = (height / patch, width / patch);
    let patch_dim = 3 * temporal * patch * patch;
    // Rescale in f64 then narrow (numpy's rescale), normalise in f32.
    let value = |t: usize, row: usize, col: usize, c: usize| -> f32 {
        let rgb = frames[t.min(frames.len() - 1)];
        let v = (f64::from(rgb[(row * width + col) * 3 + c]) * rescale) as f32;
        (v - mean[c]) / std[c]
    };
    let mut out = Vec::with_capacity(gh * gw * patch_dim);
    for br in 0..gh / merge {
        for bc in 0..gw / merge {
            for ir in 0..merge {
                for ic in 0..merge {
                    let (row0, col0) = ((br * merge + ir) * patch, (bc * merge + ic) * patch);
                    for c in 0..3 {
                        for t in 0..temporal {
                            for y in 0..patch {
                                for x in 0..patch {
                                    out.push(value(t, row0 + y, col0 + x, c));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok((out, [1, gh, gw]))
}
