//! Model files, `--type` and `--model-args`.

use crate::cli::args::Cli;
use crate::cli::error::{invalid, CliError};
use crate::dtype::DType;
use crate::pipeline::lora::LoraApplyMode;
use crate::pipeline::{ModelArgs, ModelFiles};
use crate::sampling::Prediction;

/// The model files and how to read them.
pub(super) struct Models {
    pub files: ModelFiles,
    pub weight_type: Option<DType>,
    pub model_args: ModelArgs,
    pub prediction: Option<Prediction>,
    pub lora_apply_mode: LoraApplyMode,
}

pub(super) fn resolve(cli: &Cli, warnings: &mut Vec<String>) -> Result<Models, CliError> {
    let m = &cli.model;
    // `--type` takes ggml's spelling exactly (`q4_K`, not `Q4_K`), as upstream.
    let weight_type = match &m.weight_type {
        None => None,
        Some(t) => Some(
            DType::ALL
                .iter()
                .copied()
                .find(|d| d.name() == t.trim())
                .ok_or_else(|| {
                    invalid(
                        "--type",
                        t,
                        "unknown weight type (e.g. f32, f16, bf16, q8_0, q4_0, q4_K)",
                    )
                })?,
        ),
    };
    // clap limits the spellings to upstream's; the flow kinds of families this build does not
    // run have no parameterisation here.
    let prediction = match &m.prediction {
        None => None,
        Some(p) => Some(p.parse::<Prediction>().map_err(|_| {
            invalid(
                "--prediction",
                p,
                "no model family of this build uses that prediction type",
            )
        })?),
    };
    let lora_apply_mode = m
        .lora_apply_mode
        .parse::<LoraApplyMode>()
        .map_err(|reason| invalid("--lora-apply-mode", &m.lora_apply_mode, &reason))?;
    let (model_args, w) = ModelArgs::parse(&m.model_args.join(","));
    warnings.extend(w);
    let files = ModelFiles {
        model: m.model.clone(),
        diffusion_model: m.diffusion_model.clone(),
        high_noise_diffusion_model: m.high_noise_diffusion_model.clone(),
        uncond_diffusion_model: m.uncond_diffusion_model.clone(),
        clip_l: m.clip_l.clone(),
        clip_g: m.clip_g.clone(),
        clip_vision: m.clip_vision.clone(),
        t5xxl: m.t5xxl.clone(),
        t5xxl_tokenizer: m.t5xxl_tokenizer.clone(),
        llm: m.llm.clone(),
        llm_vision: m.llm_vision.clone(),
        vae: m.vae.clone(),
        taesd: m.taesd.clone(),
        audio_vae: m.audio_vae.clone(),
        control_net: m.control_net.clone(),
        upscale_model: m.upscale_model.clone(),
        embd_dir: m.embd_dir.clone(),
        lora_model_dir: m.lora_model_dir.clone(),
    };
    Ok(Models {
        files,
        weight_type,
        model_args,
        prediction,
        lora_apply_mode,
    })
}
