//! The run's LoRAs: the prompt's `<lora:...>` tags become files to open, an apply mode, and
//! the metadata's `Lora hashes`.

use std::rc::Rc;

use super::RunConfig;
use crate::error::Result;
use crate::pipeline::components::{ComponentFiles, ComponentId};
use crate::pipeline::lora::{self, LoraApplyMode, LoraSet};
use crate::pipeline::Family;
use crate::runner::AdapterMode;

/// The prompt the text encoder reads and the LoRAs the tags named.
pub(super) struct RunLoras {
    pub prompt: String,
    pub set: Option<Rc<LoraSet>>,
}

/// Reads the tags of `-p` (a tag in `-n` stays text, as upstream) and opens their files.
/// With an empty `--lora-model-dir` tags are not read (upstream).
pub(super) fn prepare(
    cfg: &RunConfig,
    family: &dyn Family,
    files: &ComponentFiles,
) -> Result<RunLoras> {
    if lora::tags::has_tag(&cfg.negative_prompt) {
        log::warn!("<lora:...> in the negative prompt is read as text (as upstream)");
    }
    let dir = &cfg.models.lora_model_dir;
    if dir.as_os_str().is_empty() {
        return Ok(RunLoras {
            prompt: cfg.prompt.clone(),
            set: None,
        });
    }
    let (prompt, mut requests) = lora::requests(&cfg.prompt, dir)?;
    if files.get(ComponentId::HighNoiseDiffusion).is_none() {
        // Upstream keeps these for a high-noise model that is not there: they change nothing.
        requests.retain(|r| {
            if r.high_noise {
                log::warn!(
                    "LoRA '{}' is tagged for the high-noise expert (<lora:|high_noise|...>) but no \
                     --high-noise-diffusion-model is given; ignored",
                    r.name
                );
            }
            !r.high_noise
        });
    }
    if requests.is_empty() {
        return Ok(RunLoras { prompt, set: None });
    }
    let opened = lora::open_all(&requests)?;
    let quantized = cfg.weight_type.is_some_and(|t| t.is_quantized()) || files.any_quantized();
    let mode = match cfg.lora_apply_mode {
        LoraApplyMode::Immediately => AdapterMode::Merge,
        LoraApplyMode::AtRuntime => AdapterMode::Runtime,
        LoraApplyMode::Auto if quantized => AdapterMode::Runtime,
        LoraApplyMode::Auto => AdapterMode::Merge,
    };
    for r in &requests {
        let expert = if r.high_noise {
            " for the high-noise expert"
        } else {
            ""
        };
        log::debug!("LoRA {} ×{}{expert} ({mode:?})", r.path.display(), r.weight);
    }
    let set = LoraSet::new(opened, mode, family.lora_aliases());
    Ok(RunLoras {
        prompt,
        set: Some(Rc::new(set)),
    })
}

/// `name: hash` of each LoRA for the metadata, with its weight.
pub(super) fn metadata(set: Option<&LoraSet>) -> Result<Vec<(String, f32, String)>> {
    let Some(set) = set else {
        return Ok(Vec::new());
    };
    set.files()
        .iter()
        .map(|f| {
            // Named as upstream names it in its logs.
            let name = if f.high_noise {
                format!("|high_noise|{}", f.name)
            } else {
                f.name.clone()
            };
            Ok((name, f.multiplier, f.short_hash()?))
        })
        .collect()
}
