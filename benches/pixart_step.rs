//! One PixArt-Σ XL transformer step at 512×512 with CFG (batch 2), ours vs diffusers fp32 on
//! the CPU in the same run, at f32/bf16/f16/q8_0 weights, with peak RSS. Ours is timed twice:
//! a step computing everything (what diffusers' step does: the ratio), and a "later" step
//! reading the caption's cross-attention keys and values kept from an earlier one (what the
//! PixArt pipeline's steps after the first do).
//!
//! `cargo bench --bench pixart_step [-- --threads N --dir /tmp/pixart_xl --classes LIST
//! --variants LIST --contend --rounds N]` (`--variants f32,q8_0+ggml` runs only those of ours;
//! `--rounds 3` alternates diffusers and ours three times and keeps the best of each;
//! `--contend` times both sides while one busy process competes for the cores). The
//! reference script `benches/pixart_step.py` writes the random real-size weights (2.4 GB,
//! diffusers layout) the first time and times diffusers; each of our variants runs in a child
//! process so its peak RSS is its own. `+ggml` variants run ggml's own CPU kernels instead of
//! the blocked ones (`ggml::gemm`), for comparison. `+rpc` variants (`--variants f32+rpc`)
//! run on an `sd-cli --rpc-server` on loopback (device RPC0; it computes with ggml's CPU
//! kernels, so compare with `+ggml`): the cost of the protocol, without a network.
//!
//! CPU classes: the machine's own (`native`), then every lesser class it can imitate
//! (`avx512bf16`, `avx512`, `avxvnni`, `avx2`; `--classes native,avx512,ggml` picks; `ggml`
//! is none of our kernels; `avxvnni` on an AVX-512 VNNI machine runs the EVEX encoding of
//! AVX-VNNI's instruction): ours under `SD_CLI_CPU=<class>`, PyTorch capped alike (`ATEN_CPU_CAPABILITY`,
//! `MKL_ENABLE_INSTRUCTIONS`, `DNNL_MAX_CPU_ISA`). ggml's own kernels are compiled for the
//! build machine and are not capped, so on an AVX-512 machine the `avx2` class runs our AVX2
//! tiles beside ggml's kernels as built there (AVX-512), not an AVX2 build of ggml.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;

use sd_cli::dtype::DType;
use sd_cli::ggml::{Backend, BackendChoice};
use sd_cli::models::dit::pixart::{PixArt, PixArtConfig};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::weights::TensorStore;

#[path = "common/mod.rs"]
mod common;
#[path = "common/pixart.rs"]
mod pixart_step_common;
use common::{arg, field, peak_rss_mb};
use pixart_step_common::{best_cached_step_seconds, best_step_seconds};

/// Child mode: load with `ty`; a warm-up, the best of two full steps, then the best of two
/// steps reading the caption's cross-attention K/V a step before them stored; print them.
fn run_variant(dir: &Path, variant: &str, threads: usize) {
    // `<type>`, `<type>+fa` (flash attention), `<type>+ggml` (ggml's own CPU kernels
    // instead of the blocked ones) or `<type>+rpc` (an RPC server on loopback).
    let (ty, flash_attn, blocked_kernels) = if let Some(ty) = variant.strip_suffix("+fa") {
        (ty, true, true)
    } else if let Some(ty) = variant.strip_suffix("+ggml") {
        (ty, false, false)
    } else if let Some(ty) = variant.strip_suffix("+rpc") {
        (ty, false, false)
    } else {
        (variant, false, true)
    };
    let _server = variant.ends_with("+rpc").then(|| RpcServer::start(threads));
    let wtype = if ty == "f32" {
        None
    } else {
        DType::from_name(ty)
    };
    let store = TensorStore::open(dir).expect("weights");
    let backend = match &_server {
        Some(server) => {
            sd_cli::ggml::rpc::add_servers(std::slice::from_ref(&server.endpoint))
                .expect("RPC server");
            Rc::new(Backend::new(&BackendChoice::Named("RPC0".into()), threads).expect("RPC0"))
        }
        None => Rc::new(Backend::cpu(threads).expect("cpu")),
    };
    let (model, weights) = {
        let src = StoreSource::new(&store, "");
        let loader = WeightLoader::new(&src, wtype);
        let config = PixArtConfig::detect(&loader.root("")).expect("config");
        let model = PixArt::new(&loader.root(""), config).expect("model");
        (model, loader.finish(&backend, "pixart").expect("load"))
    };
    let weight_mb = weights.bytes() as f64 / 1048576.0;
    drop(store); // the mmap: only the runner's copy stays
    let runner = Runner::new(
        "pixart",
        backend,
        Some(weights),
        RunOptions {
            flash_attn,
            blocked_kernels,
            ..RunOptions::default()
        },
    );
    let best = best_step_seconds(&runner, &model);
    let cached = best_cached_step_seconds(&runner, &model);
    println!(
        "ours_s {best:.3} cached_s {cached:.3} rss_mb {:.0} weights_mb {weight_mb:.0}",
        peak_rss_mb()
    );
}

/// `sd-cli --rpc-server` on a free loopback port, stopped when dropped.
struct RpcServer {
    child: std::process::Child,
    endpoint: String,
}

impl RpcServer {
    fn start(threads: usize) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args(["--rpc-server", "--port", &port.to_string()])
            .args(["-t", &threads.to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sd-cli --rpc-server");
        let endpoint = format!("127.0.0.1:{port}");
        while std::net::TcpStream::connect(&endpoint).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Self { child, endpoint }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A competing busy process (`--contend`): one thread spinning on its own until dropped, the
/// way another program sharing the cores would.
struct Contender(std::process::Child);

impl Contender {
    fn start() -> Self {
        let me = std::env::current_exe().expect("exe");
        Self(
            Command::new(me)
                .arg("--burn")
                .spawn()
                .expect("busy process"),
        )
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The busy process's body: integer work that never ends (the parent kills it).
fn burn() -> ! {
    let mut x = 1u64;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

fn main() {
    let threads: usize = arg("--threads").and_then(|v| v.parse().ok()).unwrap_or(2);
    let dir = PathBuf::from(arg("--dir").unwrap_or_else(|| "/tmp/pixart_xl".into()));
    if std::env::args().any(|a| a == "--burn") {
        burn();
    }
    if let Some(ty) = arg("--variant") {
        run_variant(&dir, &ty, threads);
        return;
    }
    let contend = std::env::args().any(|a| a == "--contend");
    let rounds: usize = arg("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let classes: Vec<String> = match arg("--classes") {
        Some(list) => list.split(',').map(str::to_string).collect(),
        None => reachable_classes(),
    };
    let only: Option<Vec<String>> =
        arg("--variants").map(|list| list.split(',').map(str::to_string).collect());
    println!("CPU: {}", sd_cli::cpu_info::cpu_line(threads));
    for class in &classes {
        println!("-- class {class}");
        run_class(&dir, class, threads, only.as_deref(), contend, rounds);
    }
}

/// `native` and the lesser classes this CPU can imitate.
fn reachable_classes() -> Vec<String> {
    let f = sd_cli::cpu_info::cpu_features();
    let mut out = vec!["native".to_string()];
    if f.contains(&"AVX-512 BF16") {
        out.push("avx512".into());
    }
    if f.contains(&"AVX-512 VNNI") && f.contains(&"AVX2") {
        out.push("avxvnni".into());
    }
    if f.contains(&"AVX-512F") && f.contains(&"AVX2") {
        out.push("avx2".into());
    }
    out
}

/// PyTorch's environment for a class (the same instruction sets as ours).
fn torch_env(class: &str) -> Vec<(&'static str, &'static str)> {
    match class {
        "avx2" | "ggml" => vec![
            ("ATEN_CPU_CAPABILITY", "avx2"),
            ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
            ("DNNL_MAX_CPU_ISA", "AVX2"),
        ],
        "avxvnni" => vec![
            ("ATEN_CPU_CAPABILITY", "avx2"),
            ("MKL_ENABLE_INSTRUCTIONS", "AVX2_E1"),
            ("DNNL_MAX_CPU_ISA", "AVX2_VNNI"),
        ],
        "avx512" => vec![
            ("ATEN_CPU_CAPABILITY", "avx512"),
            ("MKL_ENABLE_INSTRUCTIONS", "AVX512"),
            ("DNNL_MAX_CPU_ISA", "AVX512_CORE_VNNI"),
        ],
        _ => Vec::new(),
    }
}

fn run_class(
    dir: &Path,
    class: &str,
    threads: usize,
    only: Option<&[String]>,
    contend: bool,
    rounds: usize,
) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/pixart_step.py");
    // The weights exist before the busy process starts (the script writes them the first
    // time, which is not what is timed); it then runs while each side is timed.
    if contend && !dir.join("diffusion_pytorch_model.safetensors").exists() {
        let _ = Command::new("python3")
            .arg(&script)
            .arg(dir)
            .arg(threads.to_string())
            .output();
    }
    let _busy = contend.then(Contender::start);
    if contend {
        println!("(with one competing busy process)");
    }
    let variants: &[&str] = if class == "native" {
        &[
            "f32",
            "bf16",
            "f16",
            "q8_0",
            "f32+ggml",
            "bf16+ggml",
            "f16+ggml",
            "q8_0+ggml",
        ]
    } else {
        &["f32", "bf16", "q8_0"]
    };
    // `--variants` may also name variants outside the default list (`f32+rpc`, `f16+fa`).
    let chosen: Vec<&str> = match only {
        Some(o) => o.iter().map(String::as_str).collect(),
        None => variants.to_vec(),
    };
    // Rounds alternate the reference and our variants, and the best of each is kept: on a
    // shared host the speed of both drifts by ±5 % over minutes.
    let mut reference: Option<(f64, f64)> = None;
    let mut ours: Vec<Option<Figures>> = vec![None; chosen.len()];
    for round in 0..rounds {
        let Some(r) = reference_step(&script, dir, class, threads) else {
            return;
        };
        let mut line = format!("round {}: diffusers {:.2} s", round + 1, r.0);
        reference = Some(reference.map_or(r, |b: (f64, f64)| if r.0 < b.0 { r } else { b }));
        for (ty, best) in chosen.iter().zip(&mut ours) {
            if let Some(f) = our_step(dir, class, ty, threads) {
                line += &format!(", {ty} {:.2} s (later {:.2} s)", f.seconds, f.cached);
                if best.as_ref().is_none_or(|b| f.seconds < b.seconds) {
                    *best = Some(f);
                }
            }
        }
        if rounds > 1 {
            println!("{line}");
        }
    }
    let Some((r, rss)) = reference else { return };
    println!("diffusers fp32: {r:.2} s/step, peak RSS {rss:.0} MB");
    for (ty, f) in chosen.iter().zip(&ours) {
        if let Some(f) = f {
            println!(
                "ours {ty:<9}: {:.2} s/step ({:.2}x diffusers), later steps {:.2} s ({:.2}x), peak RSS {:.0} MB for {:.0} MB of weights",
                f.seconds,
                f.seconds / r,
                f.cached,
                f.cached / r,
                f.rss_mb,
                f.weights_mb
            );
        }
    }
}

/// The reference script's step time and peak RSS under `class`'s cap.
fn reference_step(script: &Path, dir: &Path, class: &str, threads: usize) -> Option<(f64, f64)> {
    let py = Command::new("python3")
        .arg(script)
        .arg(dir)
        .arg(threads.to_string())
        .envs(torch_env(class))
        .output()
        .expect("python3");
    let py_out = String::from_utf8_lossy(&py.stdout).to_string();
    match field(&py_out, "diffusers_s") {
        Some(s) => Some((s, field(&py_out, "rss_mb").unwrap_or(0.0))),
        None => {
            eprintln!("reference failed: {}", String::from_utf8_lossy(&py.stderr));
            None
        }
    }
}

/// One of our variants, timed in a child process.
#[derive(Clone)]
struct Figures {
    /// A step computing everything, as diffusers' step does.
    seconds: f64,
    /// A step reading the caption's cross-attention K/V kept by an earlier one (the
    /// sampler's steps after its first).
    cached: f64,
    rss_mb: f64,
    weights_mb: f64,
}

fn our_step(dir: &Path, class: &str, ty: &str, threads: usize) -> Option<Figures> {
    let me = std::env::current_exe().expect("exe");
    let o = Command::new(&me)
        .args(["--variant", ty, "--threads", &threads.to_string(), "--dir"])
        .arg(dir)
        .env("SD_CLI_CPU", class)
        .output()
        .expect("child");
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    match field(&text, "ours_s") {
        Some(seconds) => Some(Figures {
            seconds,
            cached: field(&text, "cached_s").unwrap_or(f64::NAN),
            rss_mb: field(&text, "rss_mb").unwrap_or(0.0),
            weights_mb: field(&text, "weights_mb").unwrap_or(0.0),
        }),
        None => {
            eprintln!("{ty}: failed: {}", String::from_utf8_lossy(&o.stderr));
            None
        }
    }
}
