//! Wan 2.1 VAE video decode at the released size (random weights) at 480×832: ours untiled and
//! with `--vae-tiling`'s default 256-pixel tiles, against diffusers fp32 untiled and with its own
//! tiling, in the same run, with each side's peak RSS. The first latent frame gives one frame,
//! each later one four; 33 frames are 9 latent frames, estimated from the measured clip as
//! `first + 8 × later` with `later` from the clip's per-latent-frame average beyond the first.
//!
//! `cargo bench --bench wan_vae_decode -- [--frames T (latent, default 2) --threads N --dir DIR]`.
//! The script writes the VAE (about 0.5 GB) the first time; our variants run in child processes
//! so that each peak RSS is its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sd_cli::ggml::Backend;
use sd_cli::models::vae::tiling::{TileSettings, DEFAULT_OVERLAP, DEFAULT_TILE_PX};
use sd_cli::models::vae::wan_vae::{WanVae, WanVaeConfig};
use sd_cli::pipeline::vae::{LatentNorm, VaeStage};
use sd_cli::runner::{LoadOptions, RunOptions, Runner, RunnerError, StoreSource};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

#[path = "common/mod.rs"]
mod common;
use common::{arg, field, peak_rss_mb};

/// The latent of 480×832 frames.
const W: usize = 104;
const H: usize = 60;

/// Seconds for the first latent frame alone and for the whole clip of `frames`, untiled or
/// tiled.
fn time_ours(dir: &Path, frames: usize, threads: usize, tiled: bool) -> (f64, f64) {
    // `--latent WxH` decodes another size (a quicker look at how memory scales).
    let (w, h) = arg("--latent")
        .and_then(|s| {
            let (a, b) = s.split_once('x')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or((W, H));
    let store = TensorStore::open(&dir.join("diffusion_pytorch_model.safetensors")).expect("vae");
    let src = StoreSource::new(&store, "");
    let opts = LoadOptions {
        backend: std::rc::Rc::new(Backend::cpu(threads).expect("cpu")),
        wtype: None,
        run: RunOptions::default(),
        adapters: None,
    };
    let vae = Runner::load("vae", &src, opts, |wb| -> Result<_, RunnerError> {
        let mut config = WanVaeConfig::detect(wb)?;
        config.video = true;
        config.encoder = false;
        WanVae::new(wb, config)
    })
    .expect("load");
    let stage = VaeStage::new(
        vae,
        LatentNorm::Scale {
            scale: 1.0,
            shift: 0.0,
        },
    );
    let tiles = TileSettings::new(DEFAULT_TILE_PX, DEFAULT_TILE_PX, None, DEFAULT_OVERLAP);
    let tiling = tiled.then_some(&tiles);
    let clip = |t: usize| HostTensor {
        ne: [w, h, t, 16],
        data: (0..w * h * t * 16)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect(),
    };
    let run = |t: usize| {
        let z = clip(t);
        let t0 = Instant::now();
        let out = stage.decode_video(&z, tiling).expect("decode");
        assert_eq!(out.ne[2], 1 + 4 * (t - 1));
        t0.elapsed().as_secs_f64()
    };
    (run(1), run(frames))
}

fn run_variant(dir: &Path, frames: usize, threads: usize, tiled: bool) {
    let (first, clip) = time_ours(dir, frames, threads, tiled);
    println!(
        "first_s {first:.3} clip_s {clip:.3} rss_mb {:.0}",
        peak_rss_mb()
    );
}

/// The 33-frame (9 latent frames) estimate from a clip of `frames` latent frames.
fn estimate_33(first: f64, clip: f64, frames: usize) -> f64 {
    if frames < 2 {
        return f64::NAN;
    }
    let later = (clip - first) / (frames - 1) as f64;
    first + 8.0 * later
}

fn main() {
    let threads: usize = arg("--threads").and_then(|v| v.parse().ok()).unwrap_or(2);
    let frames: usize = arg("--frames").and_then(|v| v.parse().ok()).unwrap_or(2);
    let dir = PathBuf::from(arg("--dir").unwrap_or_else(|| "/tmp/wan_vae_decode".into()));
    if let Some(v) = arg("--variant") {
        run_variant(&dir, frames, threads, v == "tiled");
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/wan_vae_decode.py");
    let py = Command::new("python3")
        .arg(&script)
        .arg(&dir)
        .args([frames.to_string(), threads.to_string()])
        .output()
        .expect("python3");
    let py_out = String::from_utf8_lossy(&py.stdout).to_string();
    let Some(reference) = field(&py_out, "diffusers_s") else {
        eprintln!("reference failed: {}", String::from_utf8_lossy(&py.stderr));
        return;
    };
    let ref_tiled = field(&py_out, "tiled_s").unwrap_or(f64::NAN);
    let out_frames = 1 + 4 * (frames - 1);
    println!(
        "Wan 2.1 VAE decode, 480x832, {frames} latent frames ({out_frames} frames): diffusers fp32 \
         {reference:.1} s untiled, {ref_tiled:.1} s tiled, peak RSS {:.0} MB",
        field(&py_out, "rss_mb").unwrap_or(0.0)
    );
    let me = std::env::current_exe().expect("exe");
    for variant in ["untiled", "tiled"] {
        let o = Command::new(&me)
            .args(["--variant", variant, "--frames", &frames.to_string()])
            .args(["--threads", &threads.to_string()])
            .arg("--dir")
            .arg(&dir)
            .output()
            .expect("child");
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let (Some(first), Some(clip)) = (field(&text, "first_s"), field(&text, "clip_s")) else {
            eprintln!("{variant}: failed: {}", String::from_utf8_lossy(&o.stderr));
            continue;
        };
        let base = if variant == "tiled" {
            ref_tiled
        } else {
            reference
        };
        println!(
            "ours {variant:<7}: {clip:.1} s ({:.2}x diffusers {variant}), peak RSS {:.0} MB; \
             first latent frame {first:.1} s; 33 frames ≈ {:.0} s",
            clip / base,
            field(&text, "rss_mb").unwrap_or(0.0),
            estimate_33(first, clip, frames)
        );
    }
}
