//! `--ref-image-args K=V,...`: how reference images are prepared (upstream keys).
//!
//! Keys that matter for the models here: `resize_before_vae` (resize each reference to the
//! output's area before encoding; `--disable-auto-resize-ref-image` is its deprecated
//! spelling) and `vae_input_max_pixels` (cap that area); `ref_resolution` (ours, not upstream's)
//! resizes references to that side's square area whatever the output size, as diffusers'
//! `output_resolution` does (`ref_resolution=1024` is diffusers' default, where upstream
//! sd-cli takes the output's area). `pass_to_vlm` / `pass_to_dit` must stay
//! on for Qwen Image 2.1 (each reference fills vision slots *and* latent slots); the other
//! upstream keys are accepted and noted as having no effect. As with `--model-args`, an invalid
//! value or unknown key warns and keeps the previous setting.

use serde::Serialize;

use super::model_args::{parse_bool, parse_key_value_list};

/// The reference-image settings of a run.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RefImageArgs {
    pub resize_before_vae: bool,
    /// Cap on a resized reference's pixel count (`None` = the output's area).
    pub vae_input_max_pixels: Option<u64>,
    /// `ref_resolution=N`: resize references to N² pixels instead of the output's area
    /// (diffusers' `output_resolution`).
    pub ref_resolution: Option<u64>,
    pub pass_to_vlm: bool,
    pub pass_to_dit: bool,
    /// `ref_index_mode`: the first rope coordinate of reference images (FLUX Kontext).
    pub ref_index_mode: RefIndexMode,
}

/// How reference images are numbered in the first rope axis (upstream's `RefIndexMode`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
pub enum RefIndexMode {
    /// Every reference at index 1, placed beside the previous ones (offset rows or columns).
    #[default]
    Fixed,
    /// References at 1, 2, ... without offsets.
    Increase,
    /// References at 0, −1, ... without offsets.
    Decrease,
}

impl Default for RefImageArgs {
    fn default() -> Self {
        Self {
            resize_before_vae: true,
            vae_input_max_pixels: None,
            ref_resolution: None,
            pass_to_vlm: true,
            pass_to_dit: true,
            ref_index_mode: RefIndexMode::Fixed,
        }
    }
}

/// Upstream keys accepted without an effect on the supported models.
const NO_EFFECT: &[&str] = &[
    "preset",
    "vlm_resize_mode",
    "vlm_min_size",
    "vlm_max_size",
    "vlm_size",
    "force_ref_timestep_zero",
    "resize_vae_to_target",
];

impl RefImageArgs {
    /// Applies every `--ref-image-args` item in order over `self`; returns warnings.
    pub fn apply(&mut self, items: &[String]) -> Vec<String> {
        let ctx = "--ref-image-args";
        let mut warnings = Vec::new();
        for raw in items {
            let (pairs, w) = parse_key_value_list(raw, ctx);
            warnings.extend(w);
            for (key, value) in pairs {
                let bad = |what: &str| {
                    format!("{ctx}: ignoring {key}={value} ({what}); keeping the previous value")
                };
                match key.as_str() {
                    "resize_before_vae" | "pass_to_vlm" | "pass_to_dit" => {
                        match parse_bool(&value) {
                            Some(b) => match key.as_str() {
                                "resize_before_vae" => self.resize_before_vae = b,
                                "pass_to_vlm" => self.pass_to_vlm = b,
                                _ => self.pass_to_dit = b,
                            },
                            None => warnings.push(bad("expected true or false")),
                        }
                    }
                    "ref_index_mode" => match value.as_str() {
                        "fixed" => self.ref_index_mode = RefIndexMode::Fixed,
                        "increase" => self.ref_index_mode = RefIndexMode::Increase,
                        "decrease" => self.ref_index_mode = RefIndexMode::Decrease,
                        _ => warnings.push(bad("expected fixed, increase or decrease")),
                    },
                    "vae_input_max_pixels" => match value.parse::<u64>() {
                        Ok(0) => self.vae_input_max_pixels = None,
                        Ok(n) => self.vae_input_max_pixels = Some(n),
                        Err(_) => warnings.push(bad("expected a pixel count")),
                    },
                    "ref_resolution" => match value.parse::<u64>() {
                        Ok(0) => self.ref_resolution = None,
                        Ok(n) if n <= 1 << 16 => self.ref_resolution = Some(n),
                        _ => warnings.push(bad("expected a side length in pixels, at most 65536")),
                    },
                    k if NO_EFFECT.contains(&k) => warnings.push(format!(
                        "{ctx}: {key} has no effect on the supported models; ignored"
                    )),
                    _ => warnings.push(format!("{ctx}: unknown key '{key}' ignored")),
                }
            }
        }
        warnings
    }

    /// The pixel area references are resized to for an output of `output_area` pixels: the
    /// output's area (or `ref_resolution`²), capped by `vae_input_max_pixels`.
    pub fn target_area(&self, output_area: u64) -> u64 {
        let area = self.ref_resolution.map_or(output_area, |r| r * r);
        self.vae_input_max_pixels.map_or(area, |m| m.min(area))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_apply_in_order_and_bad_values_keep_the_previous_setting() {
        let mut a = RefImageArgs::default();
        let w = a.apply(&[
            "resize_before_vae=false, vae_input_max_pixels=4096".into(),
            "vae_input_max_pixels=lots;pass_to_vlm=maybe;preset=qwen;frobnicate=1".into(),
        ]);
        assert!(!a.resize_before_vae);
        assert_eq!(a.vae_input_max_pixels, Some(4096));
        assert!(a.pass_to_vlm);
        assert_eq!(w.len(), 4, "{w:?}");
        assert_eq!(a.target_area(96 * 64), 4096);
        assert_eq!(RefImageArgs::default().target_area(96 * 64), 96 * 64);
        let mut b = RefImageArgs::default();
        assert!(b.apply(&["ref_resolution=1024".into()]).is_empty());
        assert_eq!(b.target_area(64 * 64), 1024 * 1024);
        assert_eq!(b.apply(&["ref_resolution=wide".into()]).len(), 1);
        assert_eq!(b.ref_resolution, Some(1024));
        b.apply(&["vae_input_max_pixels=4096".into()]);
        assert_eq!(b.target_area(64 * 64), 4096);
    }
}
