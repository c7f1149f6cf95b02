//! One Stable Diffusion UNet step with CFG (batch 2, 77 text tokens), ours vs diffusers fp32 on
//! the CPU in the same run, at f32/bf16/f16/q8_0 weights, with peak RSS: SD 1.5 at 512×512 and
//! SDXL base at 1024×1024.
//!
//! `cargo bench --bench sd_unet_step [-- --model sd15|sdxl --threads N --dir DIR --reps N]`.
//! `benches/sd_unet_step.py` writes the random real-size weights (diffusers layout: SD 1.5
//! 3.4 GB, SDXL 10.3 GB) the first time and times diffusers; each of our variants runs in a
//! child process so its peak RSS is its own. With `SD_CLI_UPSTREAM=<path to upstream sd-cli>`
//! and `SD_CLI_UPSTREAM_MODEL=<its checkpoint>` the upstream C++ binary's sampling time is
//! printed too (one `--steps` run; its log gives the per-step time).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::time::Instant;

use sd_cli::dtype::DType;
use sd_cli::ggml::Backend;
use sd_cli::models::unet::{UNet, UNetConfig, UNetHparams};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::weights::TensorStore;

#[path = "common/mod.rs"]
mod common;
use common::{arg, field, peak_rss_mb};

/// Latent side and context width of each model.
fn shape(model: &str) -> (usize, usize) {
    if model == "sdxl" {
        (128, 2048)
    } else {
        (64, 768)
    }
}

/// Child mode: load with the variant's weight type, run the steps, print the best.
fn run_variant(model: &str, dir: &Path, variant: &str, threads: usize, reps: usize) {
    let (ty, blocked_kernels) = match variant.strip_suffix("+ggml") {
        Some(ty) => (ty, false),
        None => (variant, true),
    };
    let wtype = if ty == "f32" {
        None
    } else {
        DType::from_name(ty)
    };
    let store = TensorStore::open(dir).expect("weights");
    let config_json = store.files().iter().find_map(|f| f.config.clone());
    let hparams = config_json
        .as_ref()
        .map(|c| UNetHparams::from_diffusers_config(c).expect("config.json"))
        .unwrap_or_default();
    let backend = Rc::new(Backend::cpu(threads).expect("cpu"));
    let (unet, weights) = {
        let src = StoreSource::new(&store, "");
        let loader = WeightLoader::new(&src, wtype);
        let config = UNetConfig::detect(&loader.root(""), &hparams).expect("config");
        let unet = UNet::new(&loader.root(""), config).expect("model");
        (unet, loader.finish(&backend, "unet").expect("load"))
    };
    let weight_mb = weights.bytes() as f64 / 1048576.0;
    drop(store); // the mmap: only the runner's copy stays
    let runner = Runner::new(
        "unet",
        backend,
        Some(weights),
        RunOptions {
            blocked_kernels,
            ..RunOptions::default()
        },
    );
    let load_peak = peak_rss_mb();
    let (side, ctx_dim) = shape(model);
    let x: Vec<f32> = (0..side * side * 4 * 2)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let ctx: Vec<f32> = (0..ctx_dim * 77 * 2)
        .map(|i| ((i * 104729 % 1000) as f32 / 5000.0) - 0.1)
        .collect();
    let adm = unet.config().adm_in_channels;
    let y: Option<Vec<f32>> = adm.map(|a| (0..a * 2).map(|i| (i % 13) as f32 / 13.0).collect());
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        let out = runner
            .compute(|g| {
                let xt = g.input_f32("x", [side, side, 4, 2], x.clone());
                let t = g.input_f32("t", [2, 1, 1, 1], vec![999.0; 2]);
                let c = g.input_f32("ctx", [ctx_dim, 77, 2, 1], ctx.clone());
                let yt = match (&y, adm) {
                    (Some(y), Some(a)) => Some(g.input_f32("y", [a, 2, 1, 1], y.clone())),
                    _ => None,
                };
                vec![unet.forward(g, xt, t, c, yt)]
            })
            .expect("step");
        assert_eq!(out[0].ne, [side, side, 4, 2]);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!(
        "ours_s {best:.3} rss_mb {:.0} weights_mb {weight_mb:.0} load_rss_mb {load_peak:.0}",
        peak_rss_mb()
    );
}

/// Upstream's per-step sampling time from its `-v` log ("sampling completed, taking X s" over
/// the steps it ran), when the environment names its binary and checkpoint.
fn upstream(model: &str, threads: usize) {
    let (Ok(exe), Ok(ckpt)) = (
        std::env::var("SD_CLI_UPSTREAM"),
        std::env::var("SD_CLI_UPSTREAM_MODEL"),
    ) else {
        println!("upstream sd-cli: not run (set SD_CLI_UPSTREAM and SD_CLI_UPSTREAM_MODEL)");
        return;
    };
    let (size, steps) = if model == "sdxl" {
        ("1024", "1")
    } else {
        ("512", "3")
    };
    let out = std::env::temp_dir().join("sd_unet_step_upstream.png");
    let o = Command::new(&exe)
        .args(["-m", &ckpt, "-p", "a photo of a cat", "--cfg-scale", "7"])
        .args(["--steps", steps, "-W", size, "-H", size, "-s", "42"])
        .args([
            "-t",
            &threads.to_string(),
            "--sampling-method",
            "euler",
            "-v",
        ])
        .arg("-o")
        .arg(&out)
        .output()
        .expect("upstream sd-cli");
    let log = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    let secs = log
        .lines()
        .rev()
        .filter(|l| l.contains("sampling completed"))
        .find_map(|l| {
            l.split("taking")
                .nth(1)?
                .trim()
                .trim_end_matches('s')
                .parse::<f64>()
                .ok()
        });
    match secs {
        Some(s) => println!(
            "upstream sd-cli ({}): {:.2} s/step",
            Path::new(&ckpt)
                .file_name()
                .map_or(String::new(), |n| n.to_string_lossy().into_owned()),
            s / steps.parse::<f64>().unwrap_or(1.0)
        ),
        None => eprintln!("upstream sd-cli: no sampling time in its log"),
    }
}

fn main() {
    let model = arg("--model").unwrap_or_else(|| "sd15".into());
    let threads: usize = arg("--threads").and_then(|v| v.parse().ok()).unwrap_or(2);
    let reps: usize = arg("--reps")
        .and_then(|v| v.parse().ok())
        .unwrap_or(if model == "sdxl" { 1 } else { 2 });
    let dir = PathBuf::from(arg("--dir").unwrap_or_else(|| format!("/tmp/{model}_unet")));
    if let Some(ty) = arg("--variant") {
        run_variant(&model, &dir, &ty, threads, reps);
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/sd_unet_step.py");
    let py = Command::new("python3")
        .arg(&script)
        .arg(&model)
        .arg(&dir)
        .arg(threads.to_string())
        .arg(reps.to_string())
        .output()
        .expect("python3");
    let py_out = String::from_utf8_lossy(&py.stdout).to_string();
    let reference = field(&py_out, "diffusers_s");
    match reference {
        Some(s) => println!(
            "{model}: diffusers fp32: {s:.2} s/step, peak RSS {:.0} MB",
            field(&py_out, "rss_mb").unwrap_or(0.0)
        ),
        None => {
            eprintln!("reference failed: {}", String::from_utf8_lossy(&py.stderr));
            return;
        }
    }
    let me = std::env::current_exe().expect("exe");
    let variants = arg("--variants").unwrap_or_else(|| "f32,bf16,f16,q8_0".into());
    for ty in variants.split(',') {
        let o = Command::new(&me)
            .args(["--model", &model, "--variant", ty])
            .args([
                "--threads",
                &threads.to_string(),
                "--reps",
                &reps.to_string(),
            ])
            .arg("--dir")
            .arg(&dir)
            .output()
            .expect("child");
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        match (field(&text, "ours_s"), reference) {
            (Some(s), Some(r)) => println!(
                "ours {ty:<9}: {s:.2} s/step ({:.2}x diffusers), peak RSS {:.0} MB for {:.0} MB of weights ({:.0} MB while loading)",
                s / r,
                field(&text, "rss_mb").unwrap_or(0.0),
                field(&text, "weights_mb").unwrap_or(0.0),
                field(&text, "load_rss_mb").unwrap_or(0.0)
            ),
            _ => eprintln!("{ty}: failed: {}", String::from_utf8_lossy(&o.stderr)),
        }
    }
    upstream(&model, threads);
}
