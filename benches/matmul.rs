//! Matmul throughput of ggml on this machine, beside torch's in the same run.
//!
//! `cargo bench --bench matmul [-- --threads N --tokens N --k K --m M --only NAME]`: a
//! 1152×4608 weight (PixArt's FFN shape) times 2048 tokens, weights in f32/f16/bf16/q8_0,
//! activations f32. When python3 with torch is available, torch f32 (and bf16) run the same
//! product with the same thread count and the ratios are printed. `--only` runs just the
//! kernels whose name starts with NAME (`blocked f32`, `torch`), for a profiler. Where this CPU has them, the blocked AVX-512 kernels
//! (`ggml::gemm`, what `Linear` uses on the CPU) run beside ggml's `mul_mat`.

use std::process::Command;
use std::time::Instant;

use sd_cli::dtype::DType;
use sd_cli::ggml::{blocked_gemm_available, Arena, Backend, Context, Gallocr, Graph};
use sd_cli::runner::convert_f32;

/// PixArt's FFN up-projection by default; `--k` and `--m` pick another weight shape.
const DEFAULT_K: usize = 1152;
const DEFAULT_M: usize = 4608;

#[path = "common/kernels.rs"]
mod kernels;
use kernels::{arg, pseudo_random, wanted};

/// Times only the graph compute (weights and input already on the backend).
fn bench_ggml(
    ty: DType,
    blocked: bool,
    (k, m): (usize, usize),
    tokens: usize,
    threads: usize,
    reps: usize,
) -> f64 {
    let backend = Backend::cpu(threads).expect("CPU backend");
    let weights = Arena::new(2).expect("arena");
    let w = weights.add(ty, [k, m, 1, 1], "w").expect("room");
    let x = weights
        .add(DType::F32, [k, tokens, 1, 1], "x")
        .expect("room");
    weights.allocate(&backend, "bench").expect("alloc");
    let wbytes = convert_f32(&pseudo_random(k * m, 1), ty, k).expect("convert");
    weights.get(w).write_bytes(&wbytes).expect("write w");
    weights
        .get(x)
        .write_f32(&pseudo_random(k * tokens, 2))
        .expect("write x");

    let ctx = Context::new(16, 16).expect("ctx");
    let graph = Graph::new(&ctx, 16);
    let (wt, xt) = (weights.get(w), weights.get(x));
    let y = if blocked {
        let kernels = backend.cpu_kernels().expect("AVX-512 CPU");
        kernels.linear(&ctx, wt, xt, None).expect("blocked kernel")
    } else {
        ctx.mul_mat(wt, xt)
    };
    graph.expand(y);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    let mut best = f64::INFINITY;
    for _ in 0..reps + 1 {
        let t0 = Instant::now();
        backend.compute(&graph).expect("compute");
        best = best.min(t0.elapsed().as_secs_f64());
    }
    assert_eq!(y.ne(), [m, tokens, 1, 1]);
    2.0 * (k * m * tokens) as f64 / best / 1e9
}

fn bench_torch(
    (k, m): (usize, usize),
    tokens: usize,
    threads: usize,
    reps: usize,
) -> Option<(f64, f64)> {
    let script = format!(
        "import torch,time\ntorch.set_num_threads({threads})\nw=torch.randn({m},{k})\nx=torch.randn({tokens},{k})\n\
         def run(w,x):\n  best=1e9\n  for _ in range({reps}+1):\n    t=time.perf_counter(); torch.nn.functional.linear(x,w); best=min(best,time.perf_counter()-t)\n  return 2*{k}*{m}*{tokens}/best/1e9\n\
         print(run(w,x), run(w.bfloat16(),x.bfloat16()))"
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .filter_map(|v| v.parse::<f64>().ok());
    Some((it.next()?, it.next()?))
}

fn main() {
    let threads = arg("--threads", 2);
    let tokens = arg("--tokens", 2048);
    let reps = arg("--reps", 5);
    let shape = (arg("--k", DEFAULT_K), arg("--m", DEFAULT_M));
    let (k, m) = shape;
    println!("matmul {k}x{m} weight × {tokens} tokens, {threads} threads (best of {reps})");
    let torch = wanted("torch f32")
        .then(|| bench_torch(shape, tokens, threads, reps))
        .flatten();
    let torch_f32 = torch.map(|t| t.0);
    if let Some((f32_gflops, bf16_gflops)) = torch {
        println!("torch  f32   {f32_gflops:8.1} GFLOP/s");
        println!("torch  bf16  {bf16_gflops:8.1} GFLOP/s");
    } else {
        println!("torch  (python3 with torch not available: no reference in this run)");
    }
    let mut runs: Vec<(DType, bool)> = [DType::F32, DType::F16, DType::BF16, DType::Q8_0]
        .into_iter()
        .filter(|&ty| blocked_gemm_available(ty))
        .map(|ty| (ty, true))
        .collect();
    runs.extend([DType::F32, DType::F16, DType::BF16, DType::Q8_0].map(|ty| (ty, false)));
    for (ty, blocked) in runs {
        let who = if blocked { "blocked" } else { "ggml" };
        if !wanted(&format!("{who} {}", ty.name())) {
            continue;
        }
        let g = bench_ggml(ty, blocked, shape, tokens, threads, reps);
        match torch_f32 {
            Some(t) => println!(
                "{who:<7} {:<5} {g:8.1} GFLOP/s  ({:.2}x torch f32)",
                ty.name(),
                g / t
            ),
            None => println!("{who:<7} {:<5} {g:8.1} GFLOP/s", ty.name()),
        }
    }
}
