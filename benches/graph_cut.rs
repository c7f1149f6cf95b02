//! Time and device memory of monolithic vs segmented vs offloaded execution of a model whose
//! weights are larger than the budget.
//!
//! `cargo bench --bench graph_cut [-- --blocks N --dim D --tokens T --budget-mib B --threads N]`:
//! a chain of N residual MLP blocks (D → 4D → D, f32 weights, a cut mark after each block)
//! on T tokens. Modes: monolithic (weights resident, no budget), segmented (weights
//! resident, segments forced), offloaded under a budget smaller than the weights (streamed
//! segment by segment, evicted from the last segment backward; prefetch is asynchronous only on
//! devices with async copies, so the CPU row "sync prefetch" shows its planning cost), and offloaded with room for
//! everything (uploaded once). Memory is the runner's accounted device memory; on the CPU
//! backend "device" memory is RAM, so this measures the machinery, not a GPU. `--device NAME`
//! runs on a device instead (a name from `sd-cli --list-devices`, e.g. `CUDA0`); `--rpc` (or
//! `--device rpc`) serves this process's CPU over ggml RPC on loopback and runs on `RPC0`,
//! where uploads go through the protocol and prefetch uses the device's second queue.

use std::rc::Rc;
use std::time::Instant;

use sd_cli::ggml::{rpc, Backend, BackendChoice};
use sd_cli::nn::Linear;
use sd_cli::runner::{MemoryOptions, MemorySource, RunOptions, Runner, WeightLoader};

#[path = "common/kernels.rs"]
mod kernels;
use kernels::arg;

/// Small weights: the kernels' pseudo-random values scaled to ±0.025.
fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    kernels::pseudo_random(n, seed)
        .into_iter()
        .map(|v| v * 0.05)
        .collect()
}

struct Setup {
    blocks: usize,
    dim: usize,
    tokens: usize,
    threads: usize,
    /// `--device` / `--rpc`: the device to run on; `None`: the CPU.
    device: Option<String>,
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Runs `calls` calls in one runner; returns (seconds per call after the first, first call
/// seconds, report of the last call, output checksum).
fn run(
    s: &Setup,
    offload: bool,
    opts: RunOptions,
    calls: usize,
) -> (f64, f64, sd_cli::runner::RunReport, f64) {
    let d = s.dim;
    let mut src = MemorySource::new();
    for b in 0..s.blocks {
        src.insert(
            format!("b.{b}.up.weight"),
            [d, 4 * d, 1, 1],
            pseudo_random(4 * d * d, 2 * b as u32),
        );
        src.insert(
            format!("b.{b}.up.bias"),
            [4 * d, 1, 1, 1],
            vec![0.01; 4 * d],
        );
        src.insert(
            format!("b.{b}.down.weight"),
            [4 * d, d, 1, 1],
            pseudo_random(4 * d * d, 2 * b as u32 + 1),
        );
        src.insert(format!("b.{b}.down.bias"), [d, 1, 1, 1], vec![0.0; d]);
    }
    let backend = Rc::new(match &s.device {
        Some(name) => {
            Backend::new(&BackendChoice::Named(name.clone()), s.threads).expect("the device")
        }
        None => Backend::cpu(s.threads).expect("CPU backend"),
    });
    let loader = WeightLoader::new(&src, None);
    let layers: Vec<(Linear, Linear)> = (0..s.blocks)
        .map(|b| {
            let wb = loader.root("b").pp(b);
            (
                Linear::new(&wb.pp("up"), d, 4 * d, true).unwrap(),
                Linear::new(&wb.pp("down"), 4 * d, d, true).unwrap(),
            )
        })
        .collect();
    let weights = if offload {
        loader.finish_offloaded(&backend, "chain").unwrap()
    } else {
        loader.finish(&backend, "chain").unwrap()
    };
    let runner = Runner::new("chain", backend, Some(weights), opts);
    let x = pseudo_random(d * s.tokens, 99);
    let mut times = Vec::new();
    let mut sum = 0.0;
    for _ in 0..calls {
        let t0 = Instant::now();
        let out = runner
            .compute(|g| {
                let mut h = g.input_f32("x", [d, s.tokens, 1, 1], x.clone());
                for (b, (up, down)) in layers.iter().enumerate() {
                    h = g.add(h, down.forward(g, g.gelu(up.forward(g, h))));
                    h = g.cut(&format!("chain.{b}"), "x", h);
                }
                vec![h]
            })
            .unwrap();
        times.push(t0.elapsed().as_secs_f64());
        sum = out[0].data.iter().map(|&v| v as f64).sum();
    }
    let first = times[0];
    let rest = if times.len() > 1 {
        times[1..].iter().sum::<f64>() / (times.len() - 1) as f64
    } else {
        first
    };
    (rest, first, runner.last_report().unwrap_or_default(), sum)
}

/// `--device NAME`, `--device rpc` or `--rpc`.
fn device_arg() -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let named = args
        .iter()
        .position(|a| a == "--device")
        .and_then(|i| args.get(i + 1))
        .cloned();
    match named {
        Some(name) if !name.eq_ignore_ascii_case("rpc") => Some(name),
        Some(_) => Some(rpc::serve_loopback(arg("--threads", 2)).expect("RPC server")),
        None if args.iter().any(|a| a == "--rpc") => {
            Some(rpc::serve_loopback(arg("--threads", 2)).expect("RPC server"))
        }
        None => None,
    }
}

fn main() {
    let s = Setup {
        blocks: arg("--blocks", 24),
        dim: arg("--dim", 512),
        tokens: arg("--tokens", 64),
        threads: arg("--threads", 2),
        device: device_arg(),
    };
    let budget = arg("--budget-mib", 64) << 20;
    let calls = arg("--calls", 3);
    let weight_bytes = s.blocks * (8 * s.dim * s.dim + 5 * s.dim) * 4;
    println!(
        "on {}: chain of {} MLP blocks, dim {}, {} tokens, {} threads: weights {:.1} MiB (f32); budget {:.0} MiB; {calls} calls each",
        s.device.as_deref().unwrap_or("the CPU"),
        s.blocks,
        s.dim,
        s.tokens,
        s.threads,
        mib(weight_bytes),
        mib(budget)
    );
    let opts = |budget: Option<usize>, force: bool, offload: bool| RunOptions {
        memory_budget: budget,
        memory: MemoryOptions {
            force_segmented: force,
            offload_to_cpu: offload,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let modes: [(&str, bool, RunOptions); 5] = [
        (
            "monolithic",
            false,
            opts(Some(usize::MAX / 4), false, false),
        ),
        ("segmented (forced)", false, opts(None, true, false)),
        (
            "offloaded, budget < weights",
            true,
            opts(Some(budget), false, true),
        ),
        ("offloaded, sync prefetch", true, {
            let mut o = opts(Some(budget), false, true);
            o.memory.sync_prefetch = true;
            o
        }),
        ("offloaded, room for all", true, opts(None, false, true)),
    ];
    println!(
        "{:<30} {:>9} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11}",
        "mode",
        "segments",
        "s/call",
        "1st call",
        "peak MiB",
        "loaded/call",
        "prefetched",
        "evicted"
    );
    let mut reference = None;
    for (name, offload, o) in modes {
        let (t, first, r, sum) = run(&s, offload, o, calls);
        let same = *reference.get_or_insert(sum) == sum;
        println!(
            "{:<30} {:>9} {:>9.3} {:>9.3} {:>11.1} {:>11.1} {:>11.1} {:>11.1}{}",
            name,
            r.segments.len(),
            t,
            first,
            mib(r.peak_bytes),
            mib(r.loaded_bytes()),
            mib(r.prefetched_bytes()),
            mib(r.evicted_bytes()),
            if same { "" } else { "  OUTPUT DIFFERS" }
        );
    }
}
