//! Small validation helpers of [`super::config::RunConfig::resolve`]: input files,
//! image sides, threads, seeds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::args::Cli;
use super::error::{invalid, CliError};
use super::resolve::MAX_IMAGE_SIDE;

pub(crate) fn check_file(flag: &'static str, p: &Option<PathBuf>) -> Result<(), CliError> {
    match p {
        Some(p) => check_file_path(flag, p),
        None => Ok(()),
    }
}

pub(crate) fn check_file_path(flag: &'static str, p: &Path) -> Result<(), CliError> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(CliError::InputWrongKind {
            flag,
            path: p.to_path_buf(),
            expected: "file",
        }),
        Err(_) => Err(CliError::InputMissing {
            flag,
            path: p.to_path_buf(),
        }),
    }
}

pub(crate) fn check_dir(flag: &'static str, p: &Path) -> Result<(), CliError> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(CliError::InputWrongKind {
            flag,
            path: p.to_path_buf(),
            expected: "directory",
        }),
        Err(_) => Err(CliError::InputMissing {
            flag,
            path: p.to_path_buf(),
        }),
    }
}

pub(crate) fn read_text(flag: &'static str, p: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(p).map_err(|source| CliError::InputRead {
        flag,
        path: p.to_path_buf(),
        source,
    })
}

/// `-W`/`-H`: -1 (upstream's "unset" sentinel) → `None`; otherwise 1..=16384.
pub(crate) fn image_side(flag: &'static str, v: Option<i32>) -> Result<Option<u32>, CliError> {
    match v {
        None | Some(-1) => Ok(None),
        Some(v) if (1..=MAX_IMAGE_SIDE).contains(&v) => Ok(Some(v as u32)),
        Some(v) => Err(invalid(
            flag,
            v,
            format!("must be between 1 and {MAX_IMAGE_SIDE} pixels (or -1 for the default)"),
        )),
    }
}

/// Number of physical CPU cores (Linux: distinct (package, core) pairs in /proc/cpuinfo);
/// falls back to the logical count.
pub fn physical_cores() -> u32 {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = BTreeSet::new();
    let mut phys = String::new();
    for line in info.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "physical id" => phys = v.trim().to_string(),
            "core id" => {
                cores.insert((phys.clone(), v.trim().to_string()));
            }
            _ => {}
        }
    }
    if cores.is_empty() {
        logical
    } else {
        (cores.len() as u32).min(logical).max(1)
    }
}

/// A seed in [0, 2^31), like upstream's `rand()` after `srand(time)`.
pub(crate) fn random_seed() -> i64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    (h.finish() & 0x7fff_ffff) as i64
}

/// Every input file or folder named by a flag exists and is of the right kind.
pub(crate) fn check_inputs(cli: &Cli) -> Result<(), CliError> {
    let m = &cli.model;
    let g = &cli.generation;
    let files: [(&'static str, &Option<PathBuf>); 29] = [
        ("-m/--model", &m.model),
        ("--diffusion-model", &m.diffusion_model),
        (
            "--high-noise-diffusion-model",
            &m.high_noise_diffusion_model,
        ),
        ("--uncond-diffusion-model", &m.uncond_diffusion_model),
        ("--clip_l", &m.clip_l),
        ("--clip_g", &m.clip_g),
        ("--clip_vision", &m.clip_vision),
        ("--t5xxl", &m.t5xxl),
        ("--t5xxl-tokenizer", &m.t5xxl_tokenizer),
        ("--llm", &m.llm),
        ("--llm_vision", &m.llm_vision),
        ("--embeddings-connectors", &m.embeddings_connectors),
        ("--vae", &m.vae),
        ("--audio-vae", &m.audio_vae),
        ("--taesd", &m.taesd),
        ("--control-net", &m.control_net),
        ("--ip-adapter", &m.ip_adapter),
        ("--motion-module", &m.motion_module),
        ("--photo-maker", &m.photo_maker),
        ("--pulid-weights", &m.pulid_weights),
        ("--upscale-model", &m.upscale_model),
        ("-i/--init-img", &g.init_img),
        ("--end-img", &g.end_img),
        ("--mask", &g.mask),
        ("--control-image", &g.control_image),
        ("--ip-adapter-image", &g.ip_adapter_image),
        ("--pm-id-embed-path", &g.pm_id_embed_path),
        ("--pulid-id-embedding", &g.pulid_id_embedding),
        ("--ad-model", &g.ad_model),
    ];
    // Model files may also be diffusers folders (config.json + weights).
    const MAY_BE_FOLDER: [&str; 12] = [
        "-m/--model",
        "--diffusion-model",
        "--high-noise-diffusion-model",
        "--clip_l",
        "--clip_g",
        "--clip_vision",
        "--t5xxl",
        "--llm",
        "--llm_vision",
        "--vae",
        "--audio-vae",
        "--taesd",
    ];
    for (flag, p) in files {
        match p {
            Some(path) if MAY_BE_FOLDER.contains(&flag) && path.is_dir() => {}
            _ => check_file(flag, p)?,
        }
    }
    for p in &g.ref_image {
        check_file_path("-r/--ref-image", p)?;
    }
    for p in &g.ref_video_audio {
        check_file_path("--ref-video-audio", p)?;
    }
    for p in &g.ref_audio {
        check_file_path("--ref-audio", p)?;
    }
    for p in &cli.other.imat_in {
        check_file_path("--imat-in", p)?;
    }
    for p in &g.ref_video {
        check_dir("--ref-video", p)?;
    }
    if let Some(p) = &g.control_video {
        check_dir("--control-video", p)?;
    }
    if let Some(p) = &g.pm_id_images_dir {
        check_dir("--pm-id-images-dir", p)?;
    }
    Ok(())
}

/// The hires-fix flags are in range.
pub(crate) fn check_hires(cli: &Cli) -> Result<(), CliError> {
    let g = &cli.generation;
    if g.hires_width < 0 || g.hires_height < 0 {
        return Err(invalid(
            "--hires-width/--hires-height",
            format!("{}x{}", g.hires_width, g.hires_height),
            "must be >= 0",
        ));
    }
    if (g.hires_scale.is_nan() || g.hires_scale <= 0.0) && g.hires_width <= 0 && g.hires_height <= 0
    {
        return Err(invalid(
            "--hires-scale",
            g.hires_scale,
            "must be positive when no hires target size is set",
        ));
    }
    if g.hires_steps < 0 {
        return Err(invalid("--hires-steps", g.hires_steps, "must be >= 0"));
    }
    if !(g.hires_denoising_strength > 0.0 && g.hires_denoising_strength <= 1.0) {
        return Err(invalid(
            "--hires-denoising-strength",
            g.hires_denoising_strength,
            "must be in (0.0, 1.0]",
        ));
    }
    if let Some(s) = &g.hires_sigmas {
        if s.0.len() < 2 {
            return Err(invalid(
                "--hires-sigmas",
                format!("{:?}", s.0),
                "needs at least two values",
            ));
        }
    }
    if g.hires_upscale_tile_size < 1 {
        return Err(invalid(
            "--hires-upscale-tile-size",
            g.hires_upscale_tile_size,
            "must be positive",
        ));
    }
    Ok(())
}
