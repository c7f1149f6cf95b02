//! One PixArt-Σ XL transformer step at 512×512 with CFG (batch 2) with a rank-32 LoRA on every
//! attention and feed-forward linear (280 modules): none vs merged (`immediately`) vs applied at
//! run time, at q8_0 (and f16) weights; with the load time (the merge's cost) and peak RSS.
//!
//! `cargo bench --bench lora_step [-- --threads N --dir /tmp/pixart_xl --types q8_0,f16
//! --repeats 2]`. The weights are those of `benches/pixart_step.py` (run the pixart_step bench
//! once first); the LoRA is random, written next to them the first time. Each variant runs in
//! a child process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::time::Instant;

use sd_cli::dtype::DType;
use sd_cli::ggml::Backend;
use sd_cli::models::dit::pixart::{PixArt, PixArtConfig};
use sd_cli::pipeline::components::ComponentId;
use sd_cli::pipeline::lora::{names, LoraFile, LoraSet};
use sd_cli::runner::{AdapterMode, RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::weights::safetensors::{write_safetensors, SafetensorsItem};
use sd_cli::weights::TensorStore;

#[path = "common/mod.rs"]
mod common;
#[path = "common/pixart.rs"]
mod pixart_step_common;
use common::{arg, field, peak_rss_mb};
use pixart_step_common::best_step_seconds;

const RANK: usize = 32;
const HIDDEN: usize = 1152;
const FF: usize = 4608;
const BLOCKS: usize = 28;

/// A random rank-32 PEFT LoRA (diffusers names) for PixArt-Σ XL's block linears, in f16.
fn write_lora(path: &Path) {
    let mut names = Vec::new();
    for b in 0..BLOCKS {
        for attn in ["attn1", "attn2"] {
            for p in ["to_q", "to_k", "to_v", "to_out.0"] {
                names.push((format!("transformer_blocks.{b}.{attn}.{p}"), HIDDEN, HIDDEN));
            }
        }
        names.push((format!("transformer_blocks.{b}.ff.net.0.proj"), HIDDEN, FF));
        names.push((format!("transformer_blocks.{b}.ff.net.2"), FF, HIDDEN));
    }
    let mut seed = 12345u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
    };
    let mut tensors: Vec<(String, Vec<u64>, Vec<u8>)> = Vec::new();
    for (n, inp, out) in names {
        let mut f16 = |count: usize| -> Vec<u8> {
            (0..count)
                .flat_map(|_| half::f16::from_f32(next()).to_le_bytes())
                .collect()
        };
        let a = f16(RANK * inp);
        let b = f16(out * RANK);
        tensors.push((
            format!("transformer.{n}.lora_A.weight"),
            vec![RANK as u64, inp as u64],
            a,
        ));
        tensors.push((
            format!("transformer.{n}.lora_B.weight"),
            vec![out as u64, RANK as u64],
            b,
        ));
    }
    let items: Vec<SafetensorsItem<'_>> = tensors
        .iter()
        .map(|(name, shape, data)| SafetensorsItem {
            name,
            dtype: "F16",
            shape,
            data,
        })
        .collect();
    write_safetensors(path, &Default::default(), &items).expect("write the LoRA");
}

/// Child mode: load with `ty` and `lora` (none, merge, runtime), time a warm-up and a step.
fn run_variant(dir: &Path, variant: &str, threads: usize) {
    let (ty, lora) = variant.split_once('/').expect("type/lora");
    let wtype = if ty == "f32" {
        None
    } else {
        DType::from_name(ty)
    };
    let store = TensorStore::open(dir).expect("weights");
    let backend = Rc::new(Backend::cpu(threads).expect("cpu"));
    let mode = match lora {
        "none" => None,
        "merged" => Some(AdapterMode::Merge),
        _ => Some(AdapterMode::Runtime),
    };
    let adapters = mode.map(|mode| {
        let file =
            LoraFile::open(&dir.join("lora_r32.safetensors"), "lora_r32", 1.0).expect("lora");
        let set = Rc::new(LoraSet::new(vec![file], mode, &[names::pixart]));
        set.for_component(ComponentId::Diffusion).expect("adapters")
    });
    let t_load = Instant::now();
    let (model, weights) = {
        let src = StoreSource::new(&store, "");
        let loader = WeightLoader::new(&src, wtype).with_adapters(adapters.as_deref());
        let config = PixArtConfig::detect(&loader.root("")).expect("config");
        let model = PixArt::new(&loader.root(""), config).expect("model");
        (model, loader.finish(&backend, "pixart").expect("load"))
    };
    let load_s = t_load.elapsed().as_secs_f64();
    let weight_mb = weights.bytes() as f64 / 1048576.0;
    drop(store);
    let runner = Runner::new("pixart", backend, Some(weights), RunOptions::default());
    let best = best_step_seconds(&runner, &model);
    println!(
        "step_s {best:.3} load_s {load_s:.2} rss_mb {:.0} weights_mb {weight_mb:.0}",
        peak_rss_mb()
    );
}

fn main() {
    let threads: usize = arg("--threads").and_then(|v| v.parse().ok()).unwrap_or(2);
    let dir = PathBuf::from(arg("--dir").unwrap_or_else(|| "/tmp/pixart_xl".into()));
    if let Some(v) = arg("--variant") {
        run_variant(&dir, &v, threads);
        return;
    }
    if !dir.join("diffusion_pytorch_model.safetensors").exists() {
        eprintln!(
            "no PixArt-Σ XL weights in {}: run `cargo bench --bench pixart_step` first",
            dir.display()
        );
        return;
    }
    let lora = dir.join("lora_r32.safetensors");
    if !lora.exists() {
        write_lora(&lora);
    }
    let types = arg("--types").unwrap_or_else(|| "q8_0".into());
    // The variants take turns, `--repeats` rounds; each keeps its fastest round (a busy
    // machine slows single runs by 5-10%).
    let repeats: usize = arg("--repeats").and_then(|v| v.parse().ok()).unwrap_or(2);
    let me = std::env::current_exe().expect("exe");
    for ty in types.split(',') {
        let mut best: Vec<Option<(f64, String)>> = vec![None; 3];
        for _ in 0..repeats {
            for (slot, lora) in ["none", "merged", "runtime"].iter().enumerate() {
                let variant = format!("{ty}/{lora}");
                let o = Command::new(&me)
                    .args([
                        "--variant",
                        &variant,
                        "--threads",
                        &threads.to_string(),
                        "--dir",
                    ])
                    .arg(&dir)
                    .output()
                    .expect("child");
                let text = String::from_utf8_lossy(&o.stdout).to_string();
                let Some(step) = field(&text, "step_s") else {
                    eprintln!("{variant}: failed: {}", String::from_utf8_lossy(&o.stderr));
                    continue;
                };
                if best[slot].as_ref().is_none_or(|(s, _)| step < *s) {
                    best[slot] = Some((step, text));
                }
            }
        }
        let base = best[0].as_ref().map_or(f64::NAN, |b| b.0);
        for (lora, b) in ["none", "merged", "runtime"].iter().zip(&best) {
            let Some((step, text)) = b else { continue };
            println!(
                "{ty}/{lora:<8}: {step:.2} s/step ({:.3}x no LoRA), load {:.2} s, peak RSS {:.0} MB, \
                 {:.0} MB on the device",
                step / base,
                field(text, "load_s").unwrap_or(0.0),
                field(text, "rss_mb").unwrap_or(0.0),
                field(text, "weights_mb").unwrap_or(0.0)
            );
        }
    }
}
