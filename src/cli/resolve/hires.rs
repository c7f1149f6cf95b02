//! `--hires` and its flags → [`HiresSettings`]: the upscaler name as upstream reads it (the
//! built-in names, else a model name under `--hires-upscalers-dir`).

use std::path::Path;

use super::super::args::Cli;
use super::super::checks::check_hires;
use super::super::error::{invalid, CliError};
use crate::app::{HiresMethod, HiresSettings};
use crate::pipeline::resample::Resample;

/// Extensions a hires upscaler model may have, tried in this order (upstream's list).
const MODEL_EXTENSIONS: [&str; 4] = [".gguf", ".safetensors", ".pt", ".pth"];

/// The built-in upscalers by upstream's names; `Ok(None)` for "None".
fn builtin(name: &str) -> Option<Option<HiresMethod>> {
    let latent = |r| Some(Some(HiresMethod::Latent(r)));
    match name {
        "None" => Some(None),
        "Latent" => latent(Resample::Bilinear { antialias: false }),
        "Latent (nearest)" => latent(Resample::Nearest),
        "Latent (nearest-exact)" => latent(Resample::NearestExact),
        "Latent (antialiased)" => latent(Resample::Bilinear { antialias: true }),
        "Latent (bicubic)" => latent(Resample::Bicubic { antialias: false }),
        "Latent (bicubic antialiased)" => latent(Resample::Bicubic { antialias: true }),
        "Lanczos" => Some(Some(HiresMethod::Image(Resample::Lanczos))),
        "Nearest" => Some(Some(HiresMethod::Image(Resample::Nearest))),
        _ => None,
    }
}

/// A model name (no path, no extension) found in `dir` with one of the model extensions.
fn model_in_dir(name: &str, dir: Option<&Path>) -> Result<HiresMethod, CliError> {
    let flag = "--hires-upscaler";
    let dir = dir.ok_or_else(|| {
        invalid(
            flag,
            name,
            "is not a built-in upscaler (Latent, Latent (nearest), Latent (nearest-exact), \
             Latent (antialiased), Latent (bicubic), Latent (bicubic antialiased), Lanczos, \
             Nearest, None); a model name needs --hires-upscalers-dir",
        )
    })?;
    let lower = name.to_ascii_lowercase();
    if name.contains('/')
        || name.contains('\\')
        || Path::new(name).has_root()
        || MODEL_EXTENSIONS.iter().any(|e| lower.ends_with(e))
    {
        return Err(invalid(
            flag,
            name,
            "a hires upscaler model is named without path or extension",
        ));
    }
    MODEL_EXTENSIONS
        .iter()
        .map(|e| dir.join(format!("{name}{e}")))
        .find(|p| p.is_file())
        .map(HiresMethod::Model)
        .ok_or_else(|| {
            invalid(
                flag,
                name,
                format!(
                    "no {name}.gguf/.safetensors/.pt/.pth in '{}'",
                    dir.display()
                ),
            )
        })
}

/// The hires settings of a run; `None` without `--hires` or with `--hires-upscaler None`.
pub(super) fn resolve(
    cli: &Cli,
    warnings: &mut Vec<String>,
) -> Result<Option<HiresSettings>, CliError> {
    let g = &cli.generation;
    if !g.hires {
        return Ok(None);
    }
    check_hires(cli)?;
    let name = g.hires_upscaler.trim();
    let name = if name.is_empty() { "Latent" } else { name };
    let method = match builtin(name) {
        Some(Some(m)) => m,
        Some(None) => {
            warnings.push("--hires-upscaler None: the hires fix is off".into());
            return Ok(None);
        }
        None => model_in_dir(name, cli.model.hires_upscalers_dir.as_deref())?,
    };
    Ok(Some(HiresSettings {
        method,
        name: name.to_string(),
        scale: g.hires_scale,
        width: g.hires_width.max(0) as u32,
        height: g.hires_height.max(0) as u32,
        steps: g.hires_steps.max(0) as u32,
        strength: g.hires_denoising_strength,
        tile_size: g.hires_upscale_tile_size.max(1) as u32,
        sigmas: g.hires_sigmas.as_ref().map(|s| s.0.clone()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_map_to_their_filters() {
        assert_eq!(
            builtin("Latent (bicubic antialiased)"),
            Some(Some(HiresMethod::Latent(Resample::Bicubic {
                antialias: true
            })))
        );
        assert_eq!(builtin("None"), Some(None));
        assert_eq!(
            builtin("latent"),
            None,
            "names are case-sensitive, as upstream"
        );
    }

    #[test]
    fn model_names_are_found_by_extension() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("4x.pth"), b"x").unwrap();
        let found = model_in_dir("4x", Some(dir.path())).unwrap();
        assert_eq!(found, HiresMethod::Model(dir.path().join("4x.pth")));
        assert!(model_in_dir("4x.pth", Some(dir.path())).is_err());
        assert!(model_in_dir("a/4x", Some(dir.path())).is_err());
        let e = model_in_dir("missing", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        assert!(model_in_dir("4x", None).is_err());
    }
}
