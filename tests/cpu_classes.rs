//! The blocked CPU kernels under every class this machine can cap itself to (`SD_CLI_CPU`): a
//! machine with AVX-512 still runs the AVX2 tiles, their strip-packed panels and attention
//! the way an AVX2-only desktop does, so CI checks the paths it would otherwise never take.
//! The cap is read once per process, so each class runs this file's ignored child test in a
//! process of its own.

use std::process::Command;

use sd_cli::dtype::DType;
use sd_cli::ggml::{
    dequantize_rows, Arena, AttentionPrecision, Backend, Context, Gallocr, Graph, Tensor,
};
use sd_cli::runner::convert_f32;

// The kernel benches' reproducible inputs (their flag parser is unused here).
#[path = "../benches/common/kernels.rs"]
#[allow(dead_code)]
mod kernels;
use kernels::pseudo_random;

/// The child test, run once per class.
const CHILD: &str = "blocked_kernels_match_f64";

/// The classes below native this CPU can run, with the instruction each needs.
fn reachable_classes() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| match f {
            "avx2" => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            "avxvnni" => is_x86_feature_detected!("avxvnni"),
            "avx512" => is_x86_feature_detected!("avx512f"),
            "avx512bf16" => is_x86_feature_detected!("avx512bf16"),
            _ => false,
        };
        ["avx2", "avxvnni", "avx512", "avx512bf16"]
            .into_iter()
            .filter(|c| has(c))
            .collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

#[test]
fn every_reachable_class_matches_f64() {
    let classes = reachable_classes();
    if classes.is_empty() {
        eprintln!("no capped class runs the blocked kernels on this CPU; skipped");
        return;
    }
    let exe = std::env::current_exe().expect("this test's executable");
    for class in classes {
        let out = Command::new(&exe)
            .args(["--ignored", "--exact", CHILD, "--nocapture"])
            .env("SD_CLI_CPU", class)
            .output()
            .expect("run the child test");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "SD_CLI_CPU={class}:\n{text}");
        // The child really ran (a filter that matched nothing would pass too).
        assert!(
            text.contains("1 passed"),
            "SD_CLI_CPU={class}: child did not run\n{text}"
        );
        assert!(
            text.contains("products checked"),
            "SD_CLI_CPU={class}: the child skipped its checks\n{text}"
        );
    }
}

/// Builds one node over tensors written into a fresh arena, computes it on the CPU backend
/// with 2 threads and returns its f32 output.
fn run(
    inputs: &[(DType, [usize; 4], Vec<u8>)],
    node: impl for<'c> Fn(&'c Context, &[Tensor<'c>]) -> Option<Tensor<'c>>,
) -> Option<Vec<f32>> {
    let backend = Backend::cpu(2).expect("CPU backend");
    let arena = Arena::new(inputs.len()).expect("arena");
    let ids: Vec<usize> = inputs
        .iter()
        .enumerate()
        .map(|(i, (ty, ne, _))| arena.add(*ty, *ne, &format!("in{i}")).expect("room"))
        .collect();
    arena.allocate(&backend, "inputs").expect("allocate");
    for (id, (_, _, bytes)) in ids.iter().zip(inputs) {
        arena.get(*id).write_bytes(bytes).expect("write input");
    }
    let ctx = Context::new(16, 16).expect("context");
    let tensors: Vec<Tensor<'_>> = ids.iter().map(|&id| arena.get(id)).collect();
    let y = node(&ctx, &tensors)?;
    let graph = Graph::new(&ctx, 16);
    graph.expand(y);
    let mut galloc = Gallocr::new(&backend).expect("graph allocator");
    let _allocation = galloc.alloc(&graph).expect("allocate graph");
    backend.compute(&graph).expect("compute");
    Some(y.read_f32().expect("read output"))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Largest |got − want| over the scale of `want`'s largest magnitude.
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1e-6f64, |m, w| m.max(w.abs()));
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max)
        / scale
}

/// Products of each weight type (several k-blocks, a partial last panel, partial token strips,
/// a bias, two batch items) against f64 over the stored weights.
fn check_products(kernels: sd_cli::ggml::CpuKernels) {
    let (k, m, n, b) = (1216, 200, 37, 2);
    let values = pseudo_random(k * m, 3);
    let x = pseudo_random(k * n * b, 4);
    let bias = pseudo_random(m, 5);
    for ty in [DType::F32, DType::F16, DType::BF16, DType::Q8_0] {
        let bytes = convert_f32(&values, ty, k).expect("convert weights");
        let w = match ty {
            DType::F32 => values.clone(),
            _ => dequantize_rows(ty, &bytes, k).expect("stored weights"),
        };
        let inputs = [
            (ty, [k, m, 1, 1], bytes),
            (DType::F32, [k, n, b, 1], f32_bytes(&x)),
            (DType::F32, [m, 1, 1, 1], f32_bytes(&bias)),
        ];
        let got = run(&inputs, |ctx, t| {
            kernels.linear(ctx, t[0], t[1], Some(t[2]))
        })
        .unwrap_or_else(|| panic!("{}: the blocked kernels declined", ty.name()));
        let want: Vec<f64> = (0..n * b)
            .flat_map(|r| (0..m).map(move |j| (r, j)))
            .map(|(r, j)| {
                let dot: f64 = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[j * k + i] as f64)
                    .sum();
                dot + bias[j] as f64
            })
            .collect();
        let err = relative_error(&got, &want);
        // Widened weights against f32 activations: f32 sums of 1216 products, ~1e-6 of the
        // largest output. Where the CPU multiplies bf16 pairs or q8_0 blocks natively the
        // activations are rounded to that type as ggml rounds them (~1e-3).
        let rounded = match ty {
            DType::BF16 => sd_cli::cpu_info::bf16_pairs(),
            DType::Q8_0 => sd_cli::cpu_info::kernel_may_use("avxvnni"),
            _ => false,
        };
        let tolerance = if rounded { 1e-2 } else { 2e-5 };
        assert!(err < tolerance, "{}: relative error {err:e}", ty.name());
    }
}

/// Attention (head sizes 72: a 64-wide and a 16-wide panel of V; 40: one 48-wide panel),
/// masked, against f64.
fn check_attention(kernels: sd_cli::ggml::CpuKernels) {
    for (heads, hd, n_q, n_kv) in [(2, 72, 45, 70), (3, 40, 13, 150)] {
        let dim = heads * hd;
        let (q, k, v) = (
            pseudo_random(dim * n_q, 6),
            pseudo_random(dim * n_kv, 7),
            pseudo_random(dim * n_kv, 8),
        );
        // Every third key of the odd queries masked out.
        let mask: Vec<f32> = (0..n_q * n_kv)
            .map(|i| {
                let (r, c) = (i / n_kv, i % n_kv);
                if r % 2 == 1 && c % 3 == 0 {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let inputs = [
            (DType::F32, [dim, n_q, 1, 1], f32_bytes(&q)),
            (DType::F32, [dim, n_kv, 1, 1], f32_bytes(&k)),
            (DType::F32, [dim, n_kv, 1, 1], f32_bytes(&v)),
            (DType::F32, [n_kv, n_q, 1, 1], f32_bytes(&mask)),
        ];
        let got = run(&inputs, |ctx, t| {
            let exact = AttentionPrecision::Exact;
            kernels.attention(ctx, t[0], t[1], t[2], heads, Some(t[3]), scale, exact)
        })
        .unwrap_or_else(|| panic!("head size {hd}: the blocked attention declined"));
        let mut want = vec![0f64; dim * n_q];
        for h in 0..heads {
            for r in 0..n_q {
                let at = |t: &[f32], row: usize, i: usize| t[row * dim + h * hd + i] as f64;
                let scores: Vec<f64> = (0..n_kv)
                    .map(|c| {
                        let dot: f64 = (0..hd).map(|i| at(&q, r, i) * at(&k, c, i)).sum();
                        dot * scale as f64 + mask[r * n_kv + c] as f64
                    })
                    .collect();
                let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for i in 0..hd {
                    let o: f64 = (0..n_kv).map(|c| exps[c] * at(&v, c, i)).sum();
                    want[r * dim + h * hd + i] = o / sum;
                }
            }
        }
        let err = relative_error(&got, &want);
        assert!(err < 1e-4, "head size {hd}: relative error {err:e}");
    }
}

#[test]
#[ignore = "run by every_reachable_class_matches_f64, once per SD_CLI_CPU class"]
fn blocked_kernels_match_f64() {
    let backend = Backend::cpu(2).expect("CPU backend");
    let Some(kernels) = backend.cpu_kernels() else {
        eprintln!("no blocked kernels under this cap; skipped");
        return;
    };
    eprintln!("{}", sd_cli::cpu_info::cpu_line(2));
    check_products(kernels);
    check_attention(kernels);
    eprintln!("products checked, attention checked");
}
