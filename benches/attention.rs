//! Attention throughput on this CPU: the blocked kernel (`ggml::gemm`'s attention, what
//! `nn::attention` runs on the CPU) exact in f32 and, where the CPU has AVX-512 BF16, on bf16
//! operands (what `--fa` asks for), and ggml's fused kernel with f32 and with f16 K/V (the
//! latter is upstream's `--fa`), beside torch's f32 `scaled_dot_product_attention` in the
//! same run.
//!
//! `cargo bench --bench attention [-- --tokens N --keys N --heads H --head-dim D --threads N
//! --reps R --only NAME]`: `--keys` gives a cross-attention's key count (else the tokens
//! attend to themselves), `--only` runs just the kernels whose name starts with NAME (e.g.
//! `blocked f32`, `torch`; for a profiler). The default is one Wan 2.1 1.3B self-attention at
//! 480×832 and 33 frames (14040 tokens, 12 heads of 128). GFLOP/s count 4 · tokens · keys ·
//! heads · D (the two products).

use std::process::Command;
use std::time::Instant;

use sd_cli::dtype::DType;
use sd_cli::ggml::{Arena, AttentionPrecision, Backend, Context, Gallocr, Graph};

#[path = "common/kernels.rs"]
mod kernels;
use kernels::{arg, pseudo_random, wanted};

/// Which attention runs.
#[derive(Clone, Copy)]
enum Kernel {
    Blocked(AttentionPrecision),
    /// ggml's fused kernel with K/V of this type.
    Fused(DType),
}

/// Best seconds of the attention through `kernel`.
fn bench_ours(kernel: Kernel, shape: Shape, threads: usize, reps: usize) -> f64 {
    let Shape { heads, hd, .. } = shape;
    let (n, keys) = (shape.queries, shape.keys);
    let dim = heads * hd;
    let backend = Backend::cpu(threads).expect("CPU backend");
    let inputs = Arena::new(3).expect("arena");
    let ids: Vec<_> = [("q", n), ("k", keys), ("v", keys)]
        .iter()
        .map(|&(name, rows)| {
            let id = inputs
                .add(DType::F32, [dim, rows, 1, 1], name)
                .expect("room");
            (id, rows)
        })
        .collect();
    inputs.allocate(&backend, "bench").expect("alloc");
    for (i, &(id, rows)) in ids.iter().enumerate() {
        inputs
            .get(id)
            .write_f32(&pseudo_random(dim * rows, i as u32 + 1))
            .expect("write");
    }
    let ids: Vec<_> = ids.into_iter().map(|(id, _)| id).collect();
    let (q, k, v) = (inputs.get(ids[0]), inputs.get(ids[1]), inputs.get(ids[2]));
    let ctx = Context::new(64, 64).expect("ctx");
    let graph = Graph::new(&ctx, 64);
    let scale = 1.0 / (hd as f32).sqrt();
    let y = match kernel {
        Kernel::Blocked(precision) => {
            let kernels = backend
                .cpu_kernels()
                .expect("a CPU with the blocked kernels");
            kernels
                .attention(&ctx, q, k, v, heads, None, scale, precision)
                .expect("the blocked kernel takes this shape")
        }
        Kernel::Fused(kv) => {
            // [d, H, n] -> [d, n, H], the fused kernel's layout.
            let split = |t, rows| ctx.permute(ctx.reshape(t, [hd, heads, rows, 1]), [0, 2, 1, 3]);
            let whole = |t| ctx.cont_reshape(split(t, keys), [hd, keys, heads, 1]);
            let (qs, ks, vs) = (split(q, n), whole(k), whole(v));
            let (ks, vs) = if kv == DType::F32 {
                (ks, vs)
            } else {
                (ctx.cast(ks, kv), ctx.cast(vs, kv))
            };
            ctx.flash_attn_ext(qs, ks, vs, None, scale)
        }
    };
    graph.expand(y);
    let mut galloc = Gallocr::new(&backend).expect("gallocr");
    let _allocation = galloc.alloc(&graph).expect("alloc graph");
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t0 = Instant::now();
        backend.compute(&graph).expect("compute");
        best = best.min(t0.elapsed().as_secs_f64());
    }
    best
}

fn bench_torch(shape: Shape, threads: usize, reps: usize) -> Option<f64> {
    let Shape { heads, hd, .. } = shape;
    let (n, keys) = (shape.queries, shape.keys);
    let script = format!(
        "import torch,time\ntorch.set_num_threads({threads})\n\
         q=torch.randn(1,{heads},{n},{hd})\nk,v=(torch.randn(1,{heads},{keys},{hd}) for _ in range(2))\nbest=1e9\n\
         for _ in range({reps}):\n  t=time.perf_counter(); torch.nn.functional.scaled_dot_product_attention(q,k,v); best=min(best,time.perf_counter()-t)\n\
         print(best)"
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// One attention's sizes.
#[derive(Clone, Copy)]
struct Shape {
    queries: usize,
    keys: usize,
    heads: usize,
    hd: usize,
}

fn main() {
    let n = arg("--tokens", 14040);
    let shape = Shape {
        queries: n,
        keys: arg("--keys", n),
        heads: arg("--heads", 12),
        hd: arg("--head-dim", 128),
    };
    let threads = arg("--threads", 2);
    let reps = arg("--reps", 2);
    let Shape {
        keys, heads, hd, ..
    } = shape;
    let flops = 4.0 * (n * keys * heads * hd) as f64;
    let rate = |s: f64| flops / s / 1e9;
    println!("attention, {n} queries over {keys} keys, {heads} heads of {hd}, {threads} threads:");
    let torch = wanted("torch sdpa f32")
        .then(|| bench_torch(shape, threads, reps))
        .flatten();
    if let Some(t) = torch {
        println!("  torch sdpa f32   {t:.2} s ({:.0} GFLOP/s)", rate(t));
    }
    let mut kernels = vec![("blocked f32", Kernel::Blocked(AttentionPrecision::Exact))];
    if sd_cli::cpu_info::kernel_may_use("avx512bf16") {
        kernels.push(("blocked bf16", Kernel::Blocked(AttentionPrecision::Bf16)));
    }
    kernels.push(("ggml fused f32", Kernel::Fused(DType::F32)));
    kernels.push(("ggml fused f16", Kernel::Fused(DType::F16)));
    for (name, kernel) in kernels.into_iter().filter(|(name, _)| wanted(name)) {
        let s = bench_ours(kernel, shape, threads, reps);
        let vs = torch.map_or(String::new(), |t| format!(", {:.2}x torch", s / t));
        println!("  {name:<16} {s:.2} s ({:.0} GFLOP/s{vs})", rate(s));
    }
}
