//! What each mode needs, and that every input file named exists.

use crate::app::Mode;
use crate::cli::args::Cli;
use crate::cli::checks::{check_file, check_inputs};
use crate::cli::error::CliError;

/// Mode requirements (upstream `validate()`), then the input files.
pub(super) fn check(cli: &Cli) -> Result<(), CliError> {
    let mode = cli.mode;
    let m = &cli.model;
    let g = &cli.generation;
    match mode {
        Mode::Metadata => {
            if cli.other.image.is_none() {
                return Err(CliError::Missing(
                    "metadata mode needs an image path (--image)".into(),
                ));
            }
        }
        Mode::Convert => {
            let any = [
                &m.model,
                &m.clip_l,
                &m.clip_g,
                &m.t5xxl,
                &m.diffusion_model,
                &m.vae,
            ]
            .iter()
            .any(|p| p.is_some());
            if !any {
                return Err(CliError::Missing(
                    "convert mode needs at least one model input path".into(),
                ));
            }
        }
        Mode::Upscale => {
            if m.upscale_model.is_none() {
                return Err(CliError::Missing(
                    "upscale mode needs an upscaler model (--upscale-model)".into(),
                ));
            }
        }
        _ => {
            if m.model.is_none() && m.diffusion_model.is_none() {
                return Err(CliError::Missing(format!(
                    "{} mode needs a model: give -m/--model or --diffusion-model",
                    mode.as_str()
                )));
            }
        }
    }
    if matches!(mode, Mode::Upscale | Mode::Adetailer) && g.init_img.is_none() {
        return Err(CliError::Missing(format!(
            "{} mode needs an init image (--init-img)",
            mode.as_str()
        )));
    }
    if mode == Mode::Adetailer && g.ad_model.is_none() {
        return Err(CliError::Missing(
            "adetailer mode needs a detector model (--ad-model)".into(),
        ));
    }
    if g.ad_model.is_some() && !matches!(mode, Mode::ImgGen | Mode::Adetailer) {
        return Err(CliError::Conflict(
            "--ad-model is only supported in img_gen and adetailer modes".into(),
        ));
    }
    // Input files must exist (metadata mode only reads --image).
    if mode == Mode::Metadata {
        check_file("--image", &cli.other.image)
    } else {
        check_inputs(cli)
    }
}
