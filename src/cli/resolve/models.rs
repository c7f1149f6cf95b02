//! Model files, `--type` and `--model-args`.

use crate::cli::args::Cli;
use crate::cli::error::{invalid, CliError};
use crate::dtype::DType;
use crate::pipeline::{ModelArgs, ModelFiles};

pub(super) fn resolve(
    cli: &Cli,
    warnings: &mut Vec<String>,
) -> Result<(ModelFiles, Option<DType>, ModelArgs), CliError> {
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
        control_net: m.control_net.clone(),
        upscale_model: m.upscale_model.clone(),
        embd_dir: m.embd_dir.clone(),
        lora_model_dir: m.lora_model_dir.clone(),
    };
    Ok((files, weight_type, model_args))
}
