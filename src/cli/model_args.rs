//! Parsers for the key=value list flags `--model-args` and `--extra-sample-args`.
//!
//! Upstream semantics (src/core/util.cpp `parse_key_value_args`, the model runners): items are
//! separated by `,` or `;`, keys and values are trimmed, an item without `=` is ignored with a
//! warning, and an invalid value is ignored with a warning, leaving the previous (or default)
//! value in force. Nothing here fails: warnings are returned for the caller to log.

use serde::Serialize;

/// Splits a key=value list like upstream. Returns the pairs in order and warnings for
/// malformed items. `context` names the flag in the warnings (e.g. `"--model-args"`).
pub fn parse_key_value_list(raw: &str, context: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut pairs = Vec::new();
    let mut warnings = Vec::new();
    for token in raw.split([',', ';']) {
        let token = token.trim();
        if token.is_empty() {
            continue;
        }
        match token.split_once('=') {
            None => warnings.push(format!(
                "{context}: ignoring malformed item '{token}' (expected key=value)"
            )),
            Some((k, v)) => {
                let key = k.trim();
                if key.is_empty() {
                    warnings.push(format!(
                        "{context}: ignoring item '{token}' with an empty key"
                    ));
                } else {
                    pairs.push((key.to_string(), v.trim().to_string()));
                }
            }
        }
    }
    (pairs, warnings)
}

/// Upstream's strict bool: true/false, 1/0, yes/no, on/off, case-insensitive.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// ggml type names accepted by `--type` (case-sensitive, as ggml spells them).
pub const GGML_TYPE_NAMES: &[&str] = &[
    "f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K", "q4_K", "q5_K",
    "q6_K", "q8_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs",
    "i8", "i16", "i32", "i64", "f64", "iq1_m", "bf16", "tq1_0", "tq2_0", "mxfp4", "nvfp4", "q1_0",
];

/// Types that can hold floating-point activations (integer types cannot store K/V).
const NON_FLOAT_TYPES: &[&str] = &["i8", "i16", "i32", "i64", "f64"];

/// Returns the canonical `&'static` name when `s` is a known ggml type name.
pub fn ggml_type_name(s: &str) -> Option<&'static str> {
    GGML_TYPE_NAMES.iter().copied().find(|n| *n == s)
}

/// Storage type of the Qwen Image 2.1 prefix K/V cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PrefixCacheType {
    /// f16 only when flash attention is used for every attention op, else f32.
    Auto,
    /// An explicit ggml type (canonical name). Whether it converts both ways and whether its
    /// block size divides hidden_size is checked by the model at load time.
    Ggml(&'static str),
}

impl PrefixCacheType {
    /// `"auto"` or the ggml type name.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefixCacheType::Auto => "auto",
            PrefixCacheType::Ggml(n) => n,
        }
    }
}

/// Typed `--model-args`. `None` means "not given: the model's own default applies".
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelArgs {
    /// Store/reuse the text + reference prefix K/V across steps (default true).
    pub qwen_image_2_1_prefix_cache: bool,
    /// Prefix cache storage type (default auto).
    pub qwen_image_2_1_prefix_cache_type: PrefixCacheType,
    /// PixArt sincos position-embedding base grid, in patches (default 64).
    pub pixart_pos_embed_base_size: i32,
    /// PixArt position-embedding interpolation scale (default 2.0).
    pub pixart_interpolation_scale: f32,
    /// PixArt VAE latent scale override (default: 0.13025 Σ, 0.18215 α, decided by the loader).
    pub pixart_vae_scale_factor: Option<f32>,
    /// Chroma: use the DiT attention mask.
    pub chroma_use_dit_mask: Option<bool>,
    /// Chroma: use the T5 attention mask.
    pub chroma_use_t5_mask: Option<bool>,
    /// Chroma: T5 mask padding tokens.
    pub chroma_t5_mask_pad: Option<i32>,
    /// Qwen Image: zero conditioning timestep.
    pub qwen_image_zero_cond_t: Option<bool>,
}

/// Default PixArt base grid (PixArt-Σ 1024: 64x64 patches).
pub const DEFAULT_PIXART_POS_EMBED_BASE_SIZE: i32 = 64;
/// Default PixArt interpolation scale (PixArt-Σ 1024).
pub const DEFAULT_PIXART_INTERPOLATION_SCALE: f32 = 2.0;

impl Default for ModelArgs {
    fn default() -> Self {
        ModelArgs {
            qwen_image_2_1_prefix_cache: true,
            qwen_image_2_1_prefix_cache_type: PrefixCacheType::Auto,
            pixart_pos_embed_base_size: DEFAULT_PIXART_POS_EMBED_BASE_SIZE,
            pixart_interpolation_scale: DEFAULT_PIXART_INTERPOLATION_SCALE,
            pixart_vae_scale_factor: None,
            chroma_use_dit_mask: None,
            chroma_use_t5_mask: None,
            chroma_t5_mask_pad: None,
            qwen_image_zero_cond_t: None,
        }
    }
}

/// The keys `--model-args` understands.
pub const MODEL_ARG_KEYS: &[&str] = &[
    "qwen_image_2_1_prefix_cache",
    "qwen_image_2_1_prefix_cache_type",
    "pixart_pos_embed_base_size",
    "pixart_interpolation_scale",
    "pixart_vae_scale_factor",
    "chroma_use_dit_mask",
    "chroma_use_t5_mask",
    "chroma_t5_mask_pad",
    "qwen_image_zero_cond_t",
];

impl ModelArgs {
    /// Parses a `--model-args` string. Later items override earlier ones; invalid values and
    /// unknown keys leave the previous value and add a warning.
    pub fn parse(raw: &str) -> (ModelArgs, Vec<String>) {
        let (pairs, mut warnings) = parse_key_value_list(raw, "--model-args");
        let mut out = ModelArgs::default();
        for (key, value) in pairs {
            if let Err(why) = out.apply(&key, &value) {
                warnings.push(format!("--model-args: ignoring '{key}={value}': {why}"));
            }
        }
        (out, warnings)
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), String> {
        let bool_of = |v: &str| {
            parse_bool(v).ok_or_else(|| "expected true/false, 1/0, yes/no or on/off".to_string())
        };
        let int_of = |v: &str| {
            v.parse::<i32>()
                .map_err(|_| "expected an integer".to_string())
        };
        let float_of = |v: &str| match v.parse::<f32>() {
            Ok(f) if f.is_finite() => Ok(f),
            _ => Err("expected a finite number".to_string()),
        };
        match key {
            "qwen_image_2_1_prefix_cache" => self.qwen_image_2_1_prefix_cache = bool_of(value)?,
            "qwen_image_2_1_prefix_cache_type" => {
                self.qwen_image_2_1_prefix_cache_type = parse_prefix_cache_type(value)?
            }
            "pixart_pos_embed_base_size" => {
                let v = int_of(value)?;
                if v <= 0 {
                    return Err("must be a positive integer".into());
                }
                self.pixart_pos_embed_base_size = v;
            }
            "pixart_interpolation_scale" => {
                let v = float_of(value)?;
                if v <= 0.0 {
                    return Err("must be > 0".into());
                }
                self.pixart_interpolation_scale = v;
            }
            "pixart_vae_scale_factor" => {
                let v = float_of(value)?;
                if v <= 0.0 {
                    return Err("must be > 0".into());
                }
                self.pixart_vae_scale_factor = Some(v);
            }
            "chroma_use_dit_mask" => self.chroma_use_dit_mask = Some(bool_of(value)?),
            "chroma_use_t5_mask" => self.chroma_use_t5_mask = Some(bool_of(value)?),
            "chroma_t5_mask_pad" => self.chroma_t5_mask_pad = Some(int_of(value)?),
            "qwen_image_zero_cond_t" => self.qwen_image_zero_cond_t = Some(bool_of(value)?),
            _ => {
                return Err(format!(
                    "unknown key (known: {})",
                    MODEL_ARG_KEYS.join(", ")
                ))
            }
        }
        Ok(())
    }
}

/// `auto` or a ggml type name usable for K/V storage (case-sensitive, like `--type`).
pub fn parse_prefix_cache_type(value: &str) -> Result<PrefixCacheType, String> {
    if value == "auto" {
        return Ok(PrefixCacheType::Auto);
    }
    match ggml_type_name(value) {
        None => Err(format!(
            "unknown cache type (use auto or one of: {})",
            GGML_TYPE_NAMES
                .iter()
                .filter(|n| !NON_FLOAT_TYPES.contains(n))
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(n) if NON_FLOAT_TYPES.contains(&n) => {
            Err(format!("type '{n}' cannot store keys and values"))
        }
        Some(n) => Ok(PrefixCacheType::Ggml(n)),
    }
}

/// Keys the samplers/schedulers/guidance understand in `--extra-sample-args` (upstream set).
pub const EXTRA_SAMPLE_ARG_KEYS: &[&str] = &[
    "guidance_schedule",
    "apg_eta",
    "apg_momentum",
    "apg_norm_threshold",
    "apg_norm_threshold_smoothing",
    "slg_uncond",
    "noise_clip_std",
    "noise_scale_start",
    "noise_scale_end",
    "base_shift",
    "max_shift",
    "stretch",
    "terminal",
    "gamma",
    "alpha",
    "beta",
    "mu",
    "std",
    "logsnr_min",
    "logsnr_max",
    "resolution_aware",
    "lms_max_order",
    "lms_shift",
    "lms_divisions",
    "strength_as_noise_level",
    "force_first_sigma",
    "sefi_alpha",
    "sefi_delta_t",
];

/// Parses `--extra-sample-args` into raw pairs (values are typed by the sampling code).
/// Malformed items are dropped with a warning; every well-formed pair is kept in order, and
/// a key outside [`EXTRA_SAMPLE_ARG_KEYS`] adds a warning (likely a typo) but is still kept.
pub fn parse_extra_sample_args(raw: &str) -> (Vec<(String, String)>, Vec<String>) {
    let (pairs, mut warnings) = parse_key_value_list(raw, "--extra-sample-args");
    for (k, _) in &pairs {
        if !EXTRA_SAMPLE_ARG_KEYS.contains(&k.as_str()) {
            warnings.push(format!(
                "--extra-sample-args: unknown key '{k}' (no sampler uses it)"
            ));
        }
    }
    (pairs, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_comma_and_semicolon_and_trims() {
        let (p, w) = parse_key_value_list(" a = 1 ;b=2,, c=x=y ", "t");
        assert!(w.is_empty());
        assert_eq!(
            p,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "2".into()),
                ("c".into(), "x=y".into())
            ]
        );
    }

    #[test]
    fn bools_like_upstream() {
        for t in ["1", "TRUE", "yes", "On"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "false", "NO", "off"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_bool("2"), None);
        assert_eq!(parse_bool(""), None);
    }
}
