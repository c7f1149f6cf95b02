//! One FLUX.1-dev step (512², guidance, no CFG), one SD3.5-medium step (512², CFG batch 2),
//! one Z-Image Turbo step (1024², no CFG) or one Wan 2.1 1.3B call (480×832, 33 frames) at the
//! real block widths with fewer blocks (`benches/dit_step.py` says which), ours vs
//! diffusers fp32 on the CPU in the same run, at f32/bf16/q8_0 weights, with peak RSS.
//!
//! `cargo bench --bench dit_step -- --model flux|sd35m|zimage|wan [--threads N --dir DIR
//! --variants f32,bf16,q8_0]` (a variant `bf16+fa` runs as `--fa` does). The script writes the random weights (about 2.6 GB each) the
//! first time and times diffusers; each of our variants runs in a child process so its peak
//! RSS is its own. Per-block figures come from the same weights loaded without blocks (FLUX:
//! and with its double block only), and extrapolate a step of the released depth.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::time::Instant;

use sd_cli::dtype::DType;
use sd_cli::ggml::Backend;
use sd_cli::models::dit::flux::{packing, Flux, FluxConfig, FluxInputs};
use sd_cli::models::dit::sd3::{Sd3, Sd3Config};
use sd_cli::models::dit::wan::{Wan, WanConfig, WanInputs};
use sd_cli::models::dit::z_image::{ZImage, ZImageConfig, ZImageInputs};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::weights::TensorStore;

#[path = "common/mod.rs"]
mod common;
use common::{arg, field, peak_rss_mb};

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * seed % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

/// Seconds of the faster of two steps of `step`.
fn best(mut step: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..2 {
        let t0 = Instant::now();
        step();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    best
}

/// Seconds per step of the model in `dir` with `blocks` (FLUX: [double, single]; SD3: [depth])
/// of its blocks, and the loaded weight bytes.
fn time_model(
    model: &str,
    dir: &Path,
    wtype: Option<DType>,
    threads: usize,
    blocks: Option<[usize; 2]>,
    fa: bool,
) -> (f64, f64) {
    let store = TensorStore::open(dir).expect("weights");
    let backend = Rc::new(Backend::cpu(threads).expect("cpu"));
    let src = StoreSource::new(&store, "");
    let loader = WeightLoader::new(&src, wtype);
    let secs;
    let weights_mb;
    if model == "flux" {
        let mut config = FluxConfig::detect(&loader.root(""))
            .expect("config")
            .with_axes_dims([16, 56, 56])
            .expect("axes");
        if let Some([double, single]) = blocks {
            (config.double_blocks, config.single_blocks) = (double, single);
        }
        let m = Flux::new(&loader.root(""), config).expect("model");
        let weights = loader.finish(&backend, "flux").expect("load");
        weights_mb = weights.bytes() as f64 / 1048576.0;
        drop(store);
        let runner = Runner::new("flux", backend, Some(weights), run_options(fa));
        let (img, txt, pooled) = (
            values(64 * 1024, 7919),
            values(4096 * 256, 104729),
            values(768, 31),
        );
        let pos = packing::positions(64, 64, 0.0, (0.0, 0.0));
        secs = best(|| {
            runner
                .compute(|g| {
                    let inputs = FluxInputs {
                        img: g.input_f32("img", [64, 1024, 1, 1], img.clone()),
                        img_pos: &pos,
                        targets: 1024,
                        txt: g.input_f32("txt", [4096, 256, 1, 1], txt.clone()),
                        pooled: Some(g.input_f32("pooled", [768, 1, 1, 1], pooled.clone())),
                        timesteps: &[0.7],
                        guidance: &[3.5],
                        txt_mask: None,
                        skip_layers: &[],
                    };
                    vec![m.forward(g, &inputs).expect("forward")]
                })
                .expect("step");
        });
    } else if model == "wan" {
        let mut config = WanConfig::detect(&loader.root(""), None).expect("config");
        if let Some([layers, _]) = blocks {
            config.layers = layers;
        }
        let m = Wan::new(&loader.root(""), config).expect("model");
        let weights = loader.finish(&backend, "wan").expect("load");
        weights_mb = weights.bytes() as f64 / 1048576.0;
        drop(store);
        let runner = Runner::new("wan", backend, Some(weights), run_options(fa));
        let (x, text) = (values(104 * 60 * 9 * 16, 7919), values(4096 * 512, 104729));
        secs = best(|| {
            runner
                .compute(|g| {
                    let inputs = WanInputs {
                        latent: g.input_f32("x", [104, 60, 9, 16], x.clone()),
                        text: g.input_f32("text", [4096, 512, 1, 1], text.clone()),
                        image: None,
                        timestep: 700.0,
                        vace: None,
                    };
                    vec![m.forward(g, &inputs).expect("forward")]
                })
                .expect("step");
        });
    } else if model == "zimage" {
        let mut config = ZImageConfig::detect(&loader.root("")).expect("config");
        if let Some([refiners, layers]) = blocks {
            (config.refiner_layers, config.layers) = (refiners, layers);
        }
        let m = ZImage::new(&loader.root(""), config).expect("model");
        let weights = loader.finish(&backend, "zimage").expect("load");
        weights_mb = weights.bytes() as f64 / 1048576.0;
        drop(store);
        let runner = Runner::new("zimage", backend, Some(weights), run_options(fa));
        let (img, cap) = (values(64 * 4096, 7919), values(2560 * 100, 104729));
        secs = best(|| {
            runner
                .compute(|g| {
                    let inputs = ZImageInputs {
                        img: g.input_f32("img", [64, 4096, 1, 1], img.clone()),
                        grid: (64, 64),
                        cap: g.input_f32("cap", [2560, 100, 1, 1], cap.clone()),
                        sigmas: &[0.7],
                    };
                    vec![m.forward(g, &inputs).expect("forward")]
                })
                .expect("step");
        });
    } else {
        let mut config = Sd3Config::detect(&loader.root(""))
            .expect("config")
            .with_head_dim(64)
            .expect("heads");
        if let Some([depth, _]) = blocks {
            config.depth = depth;
        }
        let m = Sd3::new(&loader.root(""), config).expect("model");
        let weights = loader.finish(&backend, "sd3").expect("load");
        weights_mb = weights.bytes() as f64 / 1048576.0;
        drop(store);
        let runner = Runner::new("sd3", backend, Some(weights), run_options(fa));
        let (x, ctx, pooled) = (
            values(64 * 64 * 16 * 2, 7919),
            values(4096 * 154 * 2, 104729),
            values(2048 * 2, 31),
        );
        secs = best(|| {
            runner
                .compute(|g| {
                    let lat = g.input_f32("x", [64, 64, 16, 2], x.clone());
                    let c = g.input_f32("ctx", [4096, 154, 2, 1], ctx.clone());
                    let p = g.input_f32("pooled", [2048, 2, 1, 1], pooled.clone());
                    vec![m.forward(g, lat, c, p, &[0.7, 0.7], &[]).expect("forward")]
                })
                .expect("step");
        });
    }
    (secs, weights_mb)
}

/// The runner's options; `fa` as `--fa` sets them.
fn run_options(fa: bool) -> RunOptions {
    RunOptions {
        flash_attn: fa,
        ..RunOptions::default()
    }
}

/// One variant: a weight type, with `+fa` as `--fa` runs it (`bf16+fa`).
fn run_variant(model: &str, dir: &Path, variant: &str, threads: usize) {
    let (ty, fa) = match variant.strip_suffix("+fa") {
        Some(ty) => (ty, true),
        None => (variant, false),
    };
    let wtype = if ty == "f32" {
        None
    } else {
        DType::from_name(ty)
    };
    let (secs, weights_mb) = time_model(model, dir, wtype, threads, None, fa);
    // Peak RSS belongs to the whole model: the block-less runs below are smaller.
    let rss = peak_rss_mb();
    // Per-block costs from the same model without blocks (and, for FLUX, with its double
    // block only), so a released depth can be extrapolated.
    let base = time_model(model, dir, wtype, threads, Some([0, 0]), fa).0;
    let blocks = if model == "flux" {
        let double = time_model(model, dir, wtype, threads, Some([1, 0]), fa).0 - base;
        let single = (secs - base - double) / 2.0;
        format!(
            "embedders_s {base:.3} double_s {double:.3} single_s {single:.3} full_s {:.3}",
            base + 19.0 * double + 38.0 * single
        )
    } else if model == "zimage" {
        // Refiners: one noise (image, modulated) + one context (caption) block; the main
        // layers run over image + caption tokens.
        let refiners = time_model(model, dir, wtype, threads, Some([1, 0]), fa).0 - base;
        let layer = (secs - base - refiners) / 2.0;
        format!(
            "embedders_s {base:.3} refiners_s {refiners:.3} layer_s {layer:.3} full_s {:.3}",
            base + 2.0 * refiners + 30.0 * layer
        )
    } else if model == "wan" {
        let block = (secs - base) / 2.0;
        format!(
            "embedders_s {base:.3} block_s {block:.3} full_s {:.3}",
            base + 30.0 * block
        )
    } else {
        let block = (secs - base) / 6.0;
        format!(
            "embedders_s {base:.3} block_s {block:.3} full_s {:.3}",
            base + 24.0 * block
        )
    };
    println!("ours_s {secs:.3} rss_mb {rss:.0} weights_mb {weights_mb:.0} {blocks}");
}

fn main() {
    let model = arg("--model").unwrap_or_else(|| "flux".into());
    let threads: usize = arg("--threads").and_then(|v| v.parse().ok()).unwrap_or(2);
    let dir = PathBuf::from(arg("--dir").unwrap_or_else(|| format!("/tmp/dit_step_{model}")));
    if let Some(ty) = arg("--variant") {
        run_variant(&model, &dir, &ty, threads);
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/dit_step.py");
    let py = Command::new("python3")
        .arg(&script)
        .args([&model, dir.to_str().expect("dir"), &threads.to_string()])
        .output()
        .expect("python3");
    let py_out = String::from_utf8_lossy(&py.stdout).to_string();
    let Some(reference) = field(&py_out, "diffusers_s") else {
        eprintln!("reference failed: {}", String::from_utf8_lossy(&py.stderr));
        return;
    };
    println!(
        "{model}: diffusers fp32: {reference:.2} s/step, peak RSS {:.0} MB",
        field(&py_out, "rss_mb").unwrap_or(0.0)
    );
    let me = std::env::current_exe().expect("exe");
    let variants = arg("--variants").unwrap_or_else(|| "f32,bf16,q8_0".into());
    for ty in variants.split(',') {
        let o = Command::new(&me)
            .args([
                "--model",
                &model,
                "--variant",
                ty,
                "--threads",
                &threads.to_string(),
            ])
            .arg("--dir")
            .arg(&dir)
            .output()
            .expect("child");
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        match field(&text, "ours_s") {
            Some(s) => {
                println!(
                    "ours {ty:<5}: {s:.2} s/step ({:.2}x diffusers), peak RSS {:.0} MB for {:.0} MB of weights",
                    s / reference,
                    field(&text, "rss_mb").unwrap_or(0.0),
                    field(&text, "weights_mb").unwrap_or(0.0)
                );
                let f = |k: &str| field(&text, k).unwrap_or(f64::NAN);
                if model == "flux" {
                    println!(
                        "    per block: embedders {:.2} s, double {:.2} s, single {:.2} s; 19+38 blocks ≈ {:.1} s/step",
                        f("embedders_s"),
                        f("double_s"),
                        f("single_s"),
                        f("full_s")
                    );
                } else if model == "zimage" {
                    println!(
                        "    per block: embedders {:.2} s, noise + context refiner {:.2} s, layer {:.2} s; 2 + 2 refiners and 30 layers ≈ {:.1} s/step",
                        f("embedders_s"),
                        f("refiners_s"),
                        f("layer_s"),
                        f("full_s")
                    );
                } else if model == "wan" {
                    println!(
                        "    per block: embedders {:.2} s, block {:.2} s; 30 blocks ≈ {:.1} s per call (CFG: two calls a step)",
                        f("embedders_s"),
                        f("block_s"),
                        f("full_s")
                    );
                } else {
                    println!(
                        "    per block: embedders {:.2} s, block {:.2} s (3 dual + 3 plain averaged); 24 blocks ≈ {:.1} s/step",
                        f("embedders_s"),
                        f("block_s"),
                        f("full_s")
                    );
                }
            }
            None => eprintln!("{ty}: failed: {}", String::from_utf8_lossy(&o.stderr)),
        }
    }
}
