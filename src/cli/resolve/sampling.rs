//! Sampler, schedule, guidance, RNG and `--extra-sample-args`, parsed into the sampling
//! module's types.

use crate::app::SamplingConfig;
use crate::cli::args::SamplingArgs;
use crate::cli::error::{check_finite, invalid, CliError};
use crate::rng::RngKind;
use crate::sampling::{custom_sigmas, ExtraSampleArgs, SamplerKind, ScheduleKind};

/// `--extra-sample-args` keys upstream defines for features this build does not have yet
/// (guidance schedules, APG): accepted, with a warning that they do nothing.
const NO_EFFECT_KEYS: &[&str] = &[
    "guidance_schedule",
    "apg_eta",
    "apg_momentum",
    "apg_norm_threshold",
    "apg_norm_threshold_smoothing",
    "sefi_alpha",
    "sefi_delta_t",
];

fn name(s: &Option<String>) -> Option<String> {
    s.as_ref()
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
}

pub(super) fn resolve(
    s: &SamplingArgs,
    warnings: &mut Vec<String>,
) -> Result<SamplingConfig, CliError> {
    if s.steps < 1 {
        return Err(invalid("--steps", s.steps, "must be greater than 0"));
    }
    let cfg_scale = check_finite("--cfg-scale", s.cfg_scale)?;
    if cfg_scale < 0.0 {
        return Err(invalid("--cfg-scale", cfg_scale, "must not be negative"));
    }
    let img_cfg_scale = match s.img_cfg_scale {
        Some(v) => check_finite("--img-cfg-scale", v)?,
        None => cfg_scale,
    };
    if !(0..=1000).contains(&s.timestep_shift) {
        return Err(invalid(
            "--timestep-shift",
            s.timestep_shift,
            "must be in [0, 1000]",
        ));
    }
    let sampler = name(&s.sampling_method)
        .map(|n| {
            n.parse::<SamplerKind>()
                .map_err(|e| invalid("--sampling-method", &n, e.to_string()))
        })
        .transpose()?;
    let scheduler = name(&s.scheduler)
        .map(|n| {
            n.parse::<ScheduleKind>()
                .map_err(|e| invalid("--scheduler", &n, e.to_string()))
        })
        .transpose()?;
    let rng_name = name(&Some(s.rng.clone())).unwrap_or_else(|| "cuda".into());
    let rng: RngKind = rng_name
        .parse()
        .map_err(|e: crate::rng::RngError| invalid("--rng", &rng_name, e.to_string()))?;
    let sampler_rng = name(&s.sampler_rng)
        .map(|n| {
            n.parse::<RngKind>()
                .map_err(|e| invalid("--sampler-rng", &n, e.to_string()))
        })
        .transpose()?;
    let sigmas = match &s.sigmas {
        Some(list) if list.0.is_empty() => {
            return Err(invalid("--sigmas", "", "needs at least one value"))
        }
        Some(list) => Some(
            custom_sigmas(&list.0)
                .map_err(|e| invalid("--sigmas", format!("{:?}", list.0), e.to_string()))?,
        ),
        None => None,
    };
    let extra_raw = s.extra_sample_args.join(",");
    let extra = ExtraSampleArgs::parse_str(&extra_raw)
        .map_err(|e| invalid("--extra-sample-args", &extra_raw, e.to_string()))?;
    for key in &extra.unknown {
        warnings.push(if NO_EFFECT_KEYS.contains(&key.as_str()) {
            format!("--extra-sample-args: '{key}' has no effect in this build; ignored")
        } else {
            format!("--extra-sample-args: unknown key '{key}' (no sampler uses it); ignored")
        });
    }
    let extra_text = crate::sampling::split_extra_sample_args(&extra_raw)
        .map(|pairs| {
            pairs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    Ok(SamplingConfig {
        steps: s.steps as usize,
        cfg_scale,
        img_cfg_scale,
        guidance: check_finite("--guidance", s.guidance)?,
        slg_scale: check_finite("--slg-scale", s.slg_scale)?,
        skip_layers: s.skip_layers.0.clone(),
        skip_layer_start: check_finite("--skip-layer-start", s.skip_layer_start)?,
        skip_layer_end: check_finite("--skip-layer-end", s.skip_layer_end)?,
        eta: s.eta.map(|v| check_finite("--eta", v)).transpose()?,
        flow_shift: s
            .flow_shift
            .map(|v| check_finite("--flow-shift", v))
            .transpose()?,
        timestep_shift: s.timestep_shift as u32,
        sampler,
        scheduler,
        sigmas,
        rng,
        sampler_rng,
        extra,
        extra_text,
    })
}

/// The high-noise expert's settings (`--moe-boundary`, `--high-noise-*`); the SLG, eta and
/// image-guidance variants are not used by the Wan experts and warn when changed.
pub(super) fn high_noise(
    cli: &crate::cli::args::Cli,
    warnings: &mut Vec<String>,
) -> Result<crate::app::HighNoiseSettings, CliError> {
    let h = &cli.high_noise;
    let boundary = check_finite("--moe-boundary", cli.generation.moe_boundary)?;
    if !(0.0..=1.0).contains(&boundary) {
        return Err(invalid("--moe-boundary", boundary, "must be in [0, 1]"));
    }
    let cfg_scale = check_finite("--high-noise-cfg-scale", h.high_noise_cfg_scale)?;
    let sampler = name(&h.high_noise_sampling_method)
        .map(|n| {
            n.parse::<SamplerKind>()
                .map_err(|e| invalid("--high-noise-sampling-method", &n, e.to_string()))
        })
        .transpose()?;
    for (flag, unused) in [
        ("--high-noise-slg-scale", h.high_noise_slg_scale != 0.0),
        ("--high-noise-eta", h.high_noise_eta.is_some()),
        (
            "--high-noise-img-cfg-scale",
            h.high_noise_img_cfg_scale.is_some(),
        ),
    ] {
        if unused {
            warnings.push(format!(
                "{flag} has no effect on the Wan high-noise expert; ignored"
            ));
        }
    }
    Ok(crate::app::HighNoiseSettings {
        boundary,
        boundary_given: cli.given_flags.contains("--moe-boundary"),
        steps: usize::try_from(h.high_noise_steps).ok().filter(|&n| n > 0),
        cfg_scale,
        sampler,
    })
}
