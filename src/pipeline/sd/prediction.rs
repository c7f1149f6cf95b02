//! What a Stable Diffusion checkpoint predicts and on which noise table, as upstream decides:
//! `--prediction` wins; SDXL files that carry a `v_pred` (or `edm_vpred.sigma_max`, CosXL) key
//! are v (EDM-v) models; SD2 runs the UNet once on a constant input and calls it a v model when
//! the output's mean minus the input's is below −1 (the test A1111 introduced); the rest
//! predict noise. A diffusers pipeline's `scheduler_config.json` says `prediction_type`
//! outright, and is read first (upstream does not read diffusers folders' schedulers).
//! A checkpoint's own 1000-entry `alphas_cumprod` replaces the default scaled-linear table.

use std::path::Path;

use super::variant::SdVersion;
use crate::error::Result;
use crate::sampling::timesteps::TIMESTEPS;
use crate::sampling::{DiscreteSigmas, ModelSchedule, Prediction};
use crate::weights::TensorStore;

/// Top-level keys of a single-file checkpoint that are not weights of any component.
#[derive(Debug, Default)]
pub struct CheckpointExtras {
    pub alphas_cumprod: Option<Vec<f32>>,
    pub v_pred: bool,
    pub edm_v: bool,
}

/// Reads the extras of the checkpoint at `path` (a weights file; folders have none). Names
/// may carry the diffusion prefix when the file was given as `--diffusion-model`.
pub fn checkpoint_extras(path: &Path) -> Result<CheckpointExtras> {
    if !path.is_file() {
        return Ok(CheckpointExtras::default());
    }
    let store = TensorStore::open(path)?;
    let find = |name: &str| {
        store
            .get(name)
            .or_else(|| store.get(&format!("model.diffusion_model.{name}")))
    };
    let alphas_cumprod = match find("alphas_cumprod") {
        Some(t) if t.numel() == TIMESTEPS => Some(store.to_f32(t)?),
        Some(t) => {
            log::warn!(
                "ignoring alphas_cumprod in {}: {} values, expected {TIMESTEPS}",
                path.display(),
                t.numel()
            );
            None
        }
        None => None,
    };
    Ok(CheckpointExtras {
        alphas_cumprod,
        v_pred: find("v_pred").is_some(),
        edm_v: find("edm_vpred.sigma_max").is_some(),
    })
}

/// `prediction_type` from the `scheduler/scheduler_config.json` of the diffusers pipeline
/// the UNet at `unet_path` belongs to (its folder, or a weights file in it).
pub fn diffusers_prediction(unet_path: &Path) -> Option<Prediction> {
    let folder = if unet_path.is_dir() {
        unet_path
    } else {
        unet_path.parent()?
    };
    let config = folder
        .parent()?
        .join("scheduler")
        .join("scheduler_config.json");
    let text = std::fs::read_to_string(config).ok()?;
    // Not parsed as JSON: DPM scheduler configs hold `-Infinity` (REFERENCE-NOTES 12).
    let at = text.find("\"prediction_type\"")?;
    let rest = &text[at + "\"prediction_type\"".len()..];
    let value = rest.split('"').nth(1)?;
    match value {
        "epsilon" => Some(Prediction::Eps),
        "v_prediction" => Some(Prediction::V),
        _ => None,
    }
}

/// How the prediction type was decided, for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    SchedulerConfig,
    CheckpointKey,
    Sd2Probe,
    Default,
}

/// The prediction type without running the model; `None` when SD2's probe must decide.
pub fn decide(
    flag: Option<Prediction>,
    version: SdVersion,
    unet_path: &Path,
    extras: &CheckpointExtras,
) -> Option<(Prediction, Source)> {
    if let Some(p) = flag {
        return Some((p, Source::Flag));
    }
    if let Some(p) = diffusers_prediction(unet_path) {
        return Some((p, Source::SchedulerConfig));
    }
    match version {
        SdVersion::Sdxl if extras.edm_v => Some((Prediction::EdmV, Source::CheckpointKey)),
        SdVersion::Sdxl if extras.v_pred => Some((Prediction::V, Source::CheckpointKey)),
        SdVersion::Sd2 => None,
        _ => Some((Prediction::Eps, Source::Default)),
    }
}

/// Upstream's SD2 test on the UNet's output for x = 0.5 everywhere ([8, 8, C, 1]), a context
/// of 0.5 (two tokens) at t = 999: v when mean(out − x) < −1.
pub fn sd2_probe_says_v(out: &[f32]) -> bool {
    if out.is_empty() {
        return false;
    }
    let mean = out.iter().map(|&v| (v - 0.5) as f64).sum::<f64>() / out.len() as f64;
    log::debug!("sd2 v-prediction probe: mean(out - x) = {mean:.4}");
    mean < -1.0
}

/// The noise table: the checkpoint's `alphas_cumprod`, else SD's scaled-linear betas.
pub fn schedule(prediction: Prediction, extras: &CheckpointExtras) -> Result<ModelSchedule> {
    Ok(match (prediction, &extras.alphas_cumprod) {
        (Prediction::Eps | Prediction::V, Some(ac)) => {
            ModelSchedule::Discrete(DiscreteSigmas::from_alphas_cumprod(ac)?)
        }
        (p, _) => p.default_schedule(0.0),
    })
}
