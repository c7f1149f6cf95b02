//! `--extra-sample-args`: `key=value` pairs for schedules and samplers.
//!
//! Upstream (stable-diffusion.cpp) splits the string on `,` or `;`, trims each side of
//! `=`, and lets every schedule / sampler pick out the keys it knows. The keys:
//!
//! | key | used by | value |
//! |---|---|---|
//! | `alpha`, `beta` | `beta` schedule | float > 0 (default 0.6, 0.6) |
//! | `base_shift`, `max_shift` | `flux` and `ltx2` schedules (each has its own defaults) | float |
//! | `terminal` | `ltx2` | float, clamped to [0, 0.99] when used |
//! | `stretch` | `ltx2` | bool |
//! | `mu`, `std`, `logsnr_min`, `logsnr_max` | `logit_normal` | float (`std` > 0) |
//! | `resolution_aware` | `logit_normal` | bool |
//! | `noise_clip_std`, `noise_scale_start`, `noise_scale_end` | `lcm` sampler | float |
//! | `lms_max_order`, `lms_shift`, `lms_divisions` | `lms` sampler | integer |
//! | `gamma` | `euler_ge` sampler | float |
//!
//! Bools accept `1/true/yes/on` and `0/false/no/off` (any case). Upstream has no keys
//! for karras / exponential sigma_min, sigma_max or rho, nor for flux2. `sefi_alpha` and
//! `sefi_delta_t` belong to the SeFi model's own schedule, which this module does not
//! implement: they come back as unknown keys.
//!
//! Differences from upstream, on purpose: a malformed entry (no `=`) or a bad value is an
//! error naming it (upstream logs a warning and ignores it), and non-finite numbers are
//! rejected. Later entries override earlier ones, as upstream.

use super::samplers::SamplerExtraArgs;
use super::schedules::ScheduleOptions;
use super::SamplingError;

/// Splits an `--extra-sample-args` string (`k=v,k=v;k=v`) into trimmed pairs; empty
/// entries are skipped.
pub fn split_extra_sample_args(text: &str) -> Result<Vec<(String, String)>, SamplingError> {
    let mut pairs = vec![];
    for token in text.split([',', ';']).map(str::trim) {
        if token.is_empty() {
            continue;
        }
        let Some((k, v)) = token.split_once('=') else {
            return Err(SamplingError::InvalidArg {
                key: token.to_string(),
                value: String::new(),
                reason: "expected key=value",
            });
        };
        pairs.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(pairs)
}

fn bad(key: &str, value: &str, reason: &'static str) -> SamplingError {
    SamplingError::InvalidArg {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    }
}

fn parse_float(key: &str, value: &str) -> Result<f32, SamplingError> {
    match value.trim().parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(bad(key, value, "not a finite number")),
        Err(_) => Err(bad(key, value, "not a number")),
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, SamplingError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(bad(
            key,
            value,
            "expected true/false, yes/no, on/off or 1/0",
        )),
    }
}

/// Schedule parameters set by `--extra-sample-args`; `None` keeps the model default.
///
/// Kept separate from [`ScheduleOptions`] because the CLI parses the arguments before
/// the model (and so the defaults, e.g. Qwen Image's flux anchors) is known.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScheduleOverrides {
    /// `alpha` (beta schedule).
    pub beta_alpha: Option<f64>,
    /// `beta` (beta schedule).
    pub beta_beta: Option<f64>,
    /// `base_shift` (flux and ltx2).
    pub base_shift: Option<f32>,
    /// `max_shift` (flux and ltx2).
    pub max_shift: Option<f32>,
    /// `terminal` (ltx2).
    pub ltx2_terminal: Option<f32>,
    /// `stretch` (ltx2).
    pub ltx2_stretch: Option<bool>,
    /// `mu` (logit_normal mean).
    pub logit_mean: Option<f32>,
    /// `std` (logit_normal).
    pub logit_std: Option<f32>,
    /// `logsnr_min` (logit_normal).
    pub logsnr_min: Option<f32>,
    /// `logsnr_max` (logit_normal).
    pub logsnr_max: Option<f32>,
    /// `resolution_aware` (logit_normal).
    pub resolution_aware: Option<bool>,
}

impl ScheduleOverrides {
    /// Sets one key; `Ok(false)` if the key is not a schedule key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool, SamplingError> {
        let positive = |v: f32| {
            if v > 0.0 {
                Ok(v)
            } else {
                Err(bad(key, value, "must be greater than 0"))
            }
        };
        match key {
            "alpha" => self.beta_alpha = Some(f64::from(positive(parse_float(key, value)?)?)),
            "beta" => self.beta_beta = Some(f64::from(positive(parse_float(key, value)?)?)),
            "base_shift" => self.base_shift = Some(parse_float(key, value)?),
            "max_shift" => self.max_shift = Some(parse_float(key, value)?),
            "terminal" => self.ltx2_terminal = Some(parse_float(key, value)?),
            "stretch" => self.ltx2_stretch = Some(parse_bool(key, value)?),
            "mu" => self.logit_mean = Some(parse_float(key, value)?),
            "std" => self.logit_std = Some(positive(parse_float(key, value)?)?),
            "logsnr_min" => self.logsnr_min = Some(parse_float(key, value)?),
            "logsnr_max" => self.logsnr_max = Some(parse_float(key, value)?),
            "resolution_aware" => self.resolution_aware = Some(parse_bool(key, value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Writes the set values into `opts` (`base_shift` / `max_shift` go to both the
    /// flux and the ltx2 parameters: upstream uses the same keys for both).
    pub fn apply_to(&self, opts: &mut ScheduleOptions) {
        fn put<T: Copy>(dst: &mut T, src: Option<T>) {
            if let Some(v) = src {
                *dst = v;
            }
        }
        put(&mut opts.beta.0, self.beta_alpha);
        put(&mut opts.beta.1, self.beta_beta);
        put(&mut opts.flux.base_shift, self.base_shift);
        put(&mut opts.flux.max_shift, self.max_shift);
        put(&mut opts.ltx2.base_shift, self.base_shift);
        put(&mut opts.ltx2.max_shift, self.max_shift);
        put(&mut opts.ltx2.terminal, self.ltx2_terminal);
        put(&mut opts.ltx2.stretch, self.ltx2_stretch);
        put(&mut opts.logit_normal.mean, self.logit_mean);
        put(&mut opts.logit_normal.std, self.logit_std);
        put(&mut opts.logit_normal.logsnr_min, self.logsnr_min);
        put(&mut opts.logit_normal.logsnr_max, self.logsnr_max);
        put(
            &mut opts.logit_normal.resolution_aware,
            self.resolution_aware,
        );
    }
}

impl ScheduleOptions {
    /// Applies the schedule keys of `pairs` (see the module table) and returns every
    /// other key, in order (sampler keys included: use [`parse_extra_sample_args`] to
    /// handle both layers).
    pub fn apply_extra_args(
        &mut self,
        pairs: &[(String, String)],
    ) -> Result<Vec<String>, SamplingError> {
        let mut overrides = ScheduleOverrides::default();
        let mut unknown = vec![];
        for (k, v) in pairs {
            if !overrides.set(k, v)? {
                unknown.push(k.clone());
            }
        }
        overrides.apply_to(self);
        Ok(unknown)
    }
}

/// `--extra-sample-args`, parsed for both layers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtraSampleArgs {
    /// Schedule overrides; apply with [`ScheduleOverrides::apply_to`] once the model's
    /// [`ScheduleOptions`] are known.
    pub schedule: ScheduleOverrides,
    /// Sampler settings (defaults where not given); goes into `SamplerOptions::extra`.
    pub sampler: SamplerExtraArgs,
    /// `slg_uncond`: skip-layer guidance also leaves the layers out of the unconditional
    /// prediction.
    pub slg_uncond: bool,
    /// Keys no layer knows, in order (the CLI may warn; upstream ignores them).
    pub unknown: Vec<String>,
}

impl ExtraSampleArgs {
    /// Splits and parses an `--extra-sample-args` string.
    pub fn parse_str(text: &str) -> Result<Self, SamplingError> {
        parse_extra_sample_args(&split_extra_sample_args(text)?)
    }
}

/// The CLI's single entry point: parses `key=value` pairs (from
/// [`split_extra_sample_args`]) into schedule overrides, sampler settings and the list
/// of unknown keys. Bad values are errors naming the key and the value.
pub fn parse_extra_sample_args(
    pairs: &[(String, String)],
) -> Result<ExtraSampleArgs, SamplingError> {
    let mut out = ExtraSampleArgs::default();
    let not_sampler = out
        .sampler
        .apply(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    for (k, v) in pairs {
        if k == "slg_uncond" {
            match v.trim().to_ascii_lowercase().as_str() {
                "true" | "1" => out.slg_uncond = true,
                "false" | "0" => out.slg_uncond = false,
                _ => out.unknown.push(k.clone()),
            }
            continue;
        }
        if not_sampler.contains(&k.as_str()) && !out.schedule.set(k, v)? {
            out.unknown.push(k.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn splits_like_upstream() {
        let p = split_extra_sample_args(" alpha = 0.5 ;beta=0.7,, gamma=3 ").unwrap();
        assert_eq!(
            p,
            pairs(&[("alpha", "0.5"), ("beta", "0.7"), ("gamma", "3")])
        );
        assert!(split_extra_sample_args("").unwrap().is_empty());
        let e = split_extra_sample_args("alpha=1,stretch")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'stretch='") && e.contains("key=value"), "{e}");
    }

    #[test]
    fn routes_keys_to_layers() {
        let a = ExtraSampleArgs::parse_str(
            "gamma=3, alpha=0.5, max_shift=1.4, stretch=OFF, lms_max_order=2, foo=1, sefi_alpha=1",
        )
        .unwrap();
        assert_eq!(a.sampler.ge_gamma, 3.0);
        assert_eq!(a.sampler.lms_max_order, 2);
        assert_eq!(a.schedule.beta_alpha, Some(0.5));
        assert_eq!(a.schedule.ltx2_stretch, Some(false));
        assert_eq!(a.unknown, vec!["foo".to_string(), "sefi_alpha".to_string()]);
        let mut opts = ScheduleOptions::default();
        a.schedule.apply_to(&mut opts);
        assert_eq!((opts.flux.max_shift, opts.ltx2.max_shift), (1.4, 1.4));
        assert_eq!(opts.flux.base_shift, 0.5);
        assert_eq!(opts.ltx2.base_shift, 0.95);
        assert_eq!(opts.beta, (0.5, 0.6));
        assert!(!opts.ltx2.stretch);
    }

    #[test]
    fn schedule_options_apply_and_report_unknown() {
        let mut o = ScheduleOptions::default();
        let unknown = o
            .apply_extra_args(&pairs(&[
                ("mu", "0.3"),
                ("gamma", "2"),
                ("resolution_aware", "0"),
                ("mu", "0.4"),
            ]))
            .unwrap();
        assert_eq!(unknown, vec!["gamma".to_string()]);
        assert_eq!(o.logit_normal.mean, 0.4);
        assert!(!o.logit_normal.resolution_aware);
    }

    #[test]
    fn bad_values_name_key_and_value() {
        for (k, v, why) in [
            ("alpha", "0", "greater than 0"),
            ("beta", "-1", "greater than 0"),
            ("std", "abc", "not a number"),
            ("max_shift", "nan", "finite"),
            ("stretch", "maybe", "true/false"),
            ("lms_max_order", "2.5", "integer"),
            ("gamma", "", "number"),
        ] {
            let e = parse_extra_sample_args(&pairs(&[(k, v)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("'{k}={v}'")) && e.contains(why), "{e}");
        }
    }
}
