//! Graph-cut segmented execution and weight residency on the CPU backend under a simulated
//! budget: segmented (and offloaded) runs of PixArt and the VAE decoder give bit-identical
//! outputs to monolithic runs; budgets below the largest segment fail with a clear
//! out-of-memory error; cache stores made inside a segment survive; VAE tiling composes.
//! Fixtures: the tiny models of tests/fixtures/{pixart,vae}.
//! Tolerance: exact (0.0): segments run the same nodes with the same kernels in the same
//! order, only with their intermediates placed differently.

mod common;

use std::rc::Rc;

use common::*;
use sd_cli::ggml::Backend;
use sd_cli::models::dit::pixart::{PixArt, PixArtConfig, PixArtInputs, PosEmbedParams};
use sd_cli::models::vae::autoencoder_kl::{AutoencoderKl, AutoencoderKlConfig};
use sd_cli::models::vae::tiling::{plan_tiles_latent, tiled_decode, TileSettings};
use sd_cli::nn::Linear;
use sd_cli::runner::{
    MemoryOptions, MemorySource, ModelWeights, RunOptions, RunReport, Runner, RunnerError,
    StoreSource, WeightLoader,
};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

/// How a test run places weights and plans memory.
#[derive(Clone, Copy, Default)]
struct Mode {
    budget: Option<usize>,
    offload: bool,
    force: bool,
    segmented_off: bool,
    prefetch_off: bool,
}

fn options(mode: Mode) -> RunOptions {
    RunOptions {
        memory_budget: mode.budget,
        memory: MemoryOptions {
            offload_to_cpu: mode.offload,
            force_segmented: mode.force,
            segmented: !mode.segmented_off,
            prefetch: !mode.prefetch_off,
            sync_prefetch: !mode.prefetch_off,
            // The fixtures are KiB-sized: without this every budget below 128 MiB would
            // force segments, and the tests would not see the real boundary.
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    }
}

fn finish(loader: WeightLoader<'_>, backend: &Backend, offload: bool) -> ModelWeights {
    if offload {
        loader.finish_offloaded(backend, "test").unwrap()
    } else {
        loader.finish(backend, "test").unwrap()
    }
}

fn exact(what: &str, a: &[HostTensor], b: &[HostTensor]) {
    assert_eq!(a.len(), b.len(), "{what}: output count");
    for (x, y) in a.iter().zip(b) {
        let d = max_abs_diff(x, y);
        assert!(d == 0.0, "{what}: segmented differs from monolithic by {d}");
    }
    eprintln!("{what}: max abs difference 0 (bit-identical)");
}

/// `t` repeated `k`×`k` times over its two inner (spatial) axes: a larger input for the same
/// tiny model, so that activations outweigh weights as in real models.
fn tiled(t: &HostTensor, k: usize) -> HostTensor {
    let [w, h, c, b] = t.ne;
    let mut data = Vec::with_capacity(t.len() * k * k);
    for plane in t.data.chunks(w * h).take(c * b) {
        for y in 0..h * k {
            for x in 0..w * k {
                data.push(plane[(y % h) * w + x % w]);
            }
        }
    }
    HostTensor::new([w * k, h * k, c, b], data).unwrap()
}

fn max_required(r: &RunReport) -> usize {
    r.segments.iter().map(|s| s.required_bytes).max().unwrap()
}

// ---------------------------------------------------------------- PixArt

struct PixArtCase {
    case: TensorStore,
    /// Input latent repeated k×k over its spatial axes.
    k: usize,
}

impl PixArtCase {
    fn new(k: usize) -> Self {
        Self {
            case: open_fixture("pixart/sigma.safetensors"),
            k,
        }
    }

    /// Builds a runner for the fixture model; the closure runs it.
    fn runner(&self, mode: Mode) -> (PixArt, Runner) {
        let backend = cpu();
        let source = StoreSource::new(&self.case, "w.");
        let loader = WeightLoader::new(&source, None);
        let config = PixArtConfig::detect_with_head_dim(&loader.root(""), 8).unwrap();
        let model = PixArt::new(&loader.root(""), config).unwrap();
        let w = finish(loader, &backend, mode.offload);
        (
            model,
            Runner::new("pixart", backend, Some(w), options(mode)),
        )
    }

    fn call(&self, model: &PixArt, runner: &Runner) -> Result<Vec<HostTensor>, RunnerError> {
        self.call_cached(model, runner, None)
    }

    /// A call keeping the caption's cross-attention K/V in the runner's cache under `key`.
    fn call_cached(
        &self,
        model: &PixArt,
        runner: &Runner,
        key: Option<&str>,
    ) -> Result<Vec<HostTensor>, RunnerError> {
        let x = tiled(&tensor(&self.case, "in.x"), self.k);
        let t = tensor(&self.case, "in.t");
        let ctx = tensor(&self.case, "in.context");
        let mask = tensor(&self.case, "in.mask");
        let pos = PosEmbedParams::for_sample_size(8 * self.k, model.config().patch_size);
        runner.compute(|g| {
            let inputs = PixArtInputs {
                x: g.input_f32("x", x.ne, x.data.clone()),
                timesteps: g.input_f32("t", t.ne, t.data.clone()),
                context: g.input_f32("context", ctx.ne, ctx.data.clone()),
                context_mask: Some(g.input_f32("mask", mask.ne, mask.data.clone())),
                micro: None,
            };
            let y = model.forward_cached(g, &inputs, pos, key);
            vec![y, model.noise_prediction(g, y)]
        })
    }

    fn run(&self, mode: Mode) -> Result<(Vec<HostTensor>, Option<RunReport>), RunnerError> {
        let (model, runner) = self.runner(mode);
        let out = self.call(&model, &runner)?;
        Ok((out, runner.last_report()))
    }
}

/// The whole-graph need and the largest segment's need, from a monolithic and a forced
/// segmented run.
fn needs(
    run: impl Fn(Mode) -> Result<(Vec<HostTensor>, Option<RunReport>), RunnerError>,
    offload: bool,
) -> (usize, usize, usize) {
    let mono = run(Mode {
        budget: Some(usize::MAX / 4),
        offload,
        ..Mode::default()
    })
    .unwrap()
    .1
    .unwrap();
    assert!(!mono.segmented);
    let forced = run(Mode {
        offload,
        force: true,
        ..Mode::default()
    })
    .unwrap()
    .1
    .unwrap();
    assert!(forced.segmented);
    (
        mono.peak_bytes,
        max_required(&forced),
        forced.segments.len(),
    )
}

#[test]
fn pixart_segmented_matches_monolithic() {
    // A 32×24 latent: activations outweigh the tiny weights, as in real models. With the
    // weights resident, segments do not need less memory than the whole graph (ggml's
    // allocator already reuses a block's intermediates), so segments are forced here; the
    // budget-driven runs below offload the weights.
    let case = PixArtCase::new(4);
    let (plain, report) = case.run(Mode::default()).unwrap();
    if common::device::on_device() {
        // A device always plans against its free memory; it fits whole here.
        assert!(report.is_some_and(|r| !r.segmented));
    } else {
        assert!(report.is_none(), "no budget on the CPU: the plain path");
    }
    let (seg, report) = case
        .run(Mode {
            force: true,
            ..Mode::default()
        })
        .unwrap();
    let report = report.unwrap();
    assert!(report.segmented);
    assert_eq!(
        report.segments.len(),
        3,
        "2 blocks: block 0 | block 1 | final layer"
    );
    assert!(report.segments.iter().all(|s| s.pinned_bytes > 0));
    exact("pixart segmented", &plain, &seg);
}

#[test]
fn pixart_offloaded_weights_stream_through_a_small_budget() {
    let case = PixArtCase::new(1);
    let (plain, _) = case.run(Mode::default()).unwrap();
    let (mono_need, seg_need, n) = needs(|m| case.run(m), true);
    eprintln!("pixart offloaded: monolithic needs {mono_need} B, largest segment {seg_need} B, {n} segments");
    assert!(seg_need < mono_need);
    for prefetch_off in [false, true] {
        let mode = Mode {
            budget: Some(seg_need),
            offload: true,
            prefetch_off,
            ..Mode::default()
        };
        let (model, runner) = case.runner(mode);
        for call in 0..2 {
            let out = case.call(&model, &runner).unwrap();
            exact(
                &format!("pixart offloaded (call {call}, prefetch {})", !prefetch_off),
                &plain,
                &out,
            );
            let r = runner.last_report().unwrap();
            assert!(r.segmented);
            assert!(r.peak_bytes <= seg_need, "{} > {seg_need}", r.peak_bytes);
            assert!(
                r.loaded_bytes() + r.prefetched_bytes() > 0,
                "weights streamed each call"
            );
            if prefetch_off {
                assert_eq!(r.prefetched_bytes(), 0);
            } else {
                assert!(r.prefetched_bytes() > 0);
            }
            eprintln!(
                "call {call}: loaded {} B, prefetched {} B, evicted {} B, peak {} B",
                r.loaded_bytes(),
                r.prefetched_bytes(),
                r.evicted_bytes(),
                r.peak_bytes
            );
        }
        assert!(runner.resident_weight_bytes() <= seg_need);
    }
}

/// `--offload-to-cpu` keeps the weights in the device's pinned host memory when the device
/// offers one (ggml's Vulkan and CUDA backends do: uploads go straight from it by DMA, and can
/// overlap compute on the second queue), in plain RAM otherwise; resident weights sit in the
/// device's own memory.
#[test]
fn offloaded_weights_sit_in_the_devices_pinned_host_memory() {
    let case = open_fixture("pixart/sigma.safetensors");
    let backend = cpu();
    let pinned = backend.pinned_host_memory();
    if backend.name().starts_with("Vulkan") {
        assert_eq!(pinned.as_deref(), Some("Vulkan_Host"), "{}", backend.name());
    }
    for offload in [false, true] {
        let source = StoreSource::new(&case, "w.");
        let loader = WeightLoader::new(&source, None);
        let config = PixArtConfig::detect_with_head_dim(&loader.root(""), 8).unwrap();
        let _model = PixArt::new(&loader.root(""), config).unwrap();
        let w = finish(loader, &backend, offload);
        let (memory, host) = w.memory();
        eprintln!(
            "{}: offload {offload}: weights in {memory} (host {host}), pinned type {pinned:?}",
            backend.name()
        );
        if offload {
            assert!(host, "offloaded weights must be host memory, got {memory}");
            assert_eq!(memory, pinned.clone().unwrap_or_else(|| "CPU".into()));
        } else {
            assert_eq!(host, backend.is_cpu(), "resident weights in {memory}");
            assert_ne!(Some(&memory), pinned.as_ref());
        }
    }
}

#[test]
fn pixart_offloaded_without_budget_uploads_once() {
    let case = PixArtCase::new(2);
    let (plain, _) = case.run(Mode::default()).unwrap();
    let (model, runner) = case.runner(Mode {
        offload: true,
        ..Mode::default()
    });
    let first = case.call(&model, &runner).unwrap();
    let r1 = runner.last_report().unwrap();
    assert!(!r1.segmented && r1.loaded_bytes() > 0);
    let second = case.call(&model, &runner).unwrap();
    let r2 = runner.last_report().unwrap();
    assert_eq!(r2.loaded_bytes(), 0, "weights stay resident between calls");
    exact("pixart offloaded monolithic", &plain, &first);
    exact("pixart offloaded monolithic, second call", &plain, &second);
    runner.release_weights();
    assert_eq!(runner.resident_weight_bytes(), 0);
    let third = case.call(&model, &runner).unwrap();
    exact("pixart after releasing weights", &plain, &third);
}

/// The caption's cross-attention K/V kept in the runner's cache (stored by the first call,
/// read by the next) in forced segments with offloaded weights: every call equals the
/// monolithic run without a cache.
#[test]
fn pixart_segmented_cross_cache_matches_monolithic() {
    let case = PixArtCase::new(2);
    let (plain, _) = case.run(Mode::default()).unwrap();
    let (model, runner) = case.runner(Mode {
        offload: true,
        force: true,
        ..Mode::default()
    });
    for call in 0..3 {
        let got = case.call_cached(&model, &runner, Some("cross")).unwrap();
        assert!(runner.last_report().unwrap().segmented);
        assert!(runner.has_cache("cross.0.k") && runner.has_cache("cross.1.v"));
        exact(
            &format!("pixart cached cross K/V, call {call}"),
            &plain,
            &got,
        );
    }
}

#[test]
fn budget_below_the_largest_segment_fails_cleanly() {
    let case = PixArtCase::new(1);
    let (_, seg_need, _) = needs(|m| case.run(m), true);
    let e = case
        .run(Mode {
            budget: Some(seg_need - 1),
            offload: true,
            ..Mode::default()
        })
        .unwrap_err();
    assert!(e.is_alloc_failure(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("segment") && msg.contains("budget"), "{msg}");
    eprintln!("{msg}");

    let e = case
        .run(Mode {
            budget: Some(seg_need),
            offload: true,
            segmented_off: true,
            ..Mode::default()
        })
        .unwrap_err();
    assert!(e.is_alloc_failure(), "{e}");
    assert!(
        e.to_string().contains("segmented compute is disabled"),
        "{e}"
    );
}

// ---------------------------------------------------------------- VAE

struct VaeCase {
    store: TensorStore,
    z: HostTensor,
}

impl VaeCase {
    fn new() -> Self {
        let mut store = TensorStore::new();
        store
            .add_file(
                &fixture_path("vae/diffusers.safetensors"),
                Component::Vae.prefix(),
            )
            .unwrap();
        let io = open_fixture("vae/io.safetensors");
        Self {
            store,
            z: tensor(&io, "decode.z"),
        }
    }

    fn runner(&self, mode: Mode) -> (AutoencoderKl, Runner) {
        let backend = cpu();
        let source = StoreSource::new(&self.store, Component::Vae.prefix());
        let loader = WeightLoader::new(&source, None);
        let mut config = AutoencoderKlConfig::detect(&loader.root("")).unwrap();
        config.norm_groups = 8;
        config.encoder = false;
        let vae = AutoencoderKl::new(&loader.root(""), config).unwrap();
        let w = finish(loader, &backend, mode.offload);
        (vae, Runner::new("vae", backend, Some(w), options(mode)))
    }

    fn decode(
        vae: &AutoencoderKl,
        runner: &Runner,
        z: &HostTensor,
    ) -> Result<Vec<HostTensor>, RunnerError> {
        runner.compute(|g| vec![vae.decode(g, g.input_f32("z", z.ne, z.data.clone()))])
    }

    fn run(&self, mode: Mode) -> Result<(Vec<HostTensor>, Option<RunReport>), RunnerError> {
        let (vae, runner) = self.runner(mode);
        let out = Self::decode(&vae, &runner, &self.z)?;
        Ok((out, runner.last_report()))
    }
}

#[test]
fn vae_decoder_segmented_matches_monolithic() {
    let case = VaeCase::new();
    let (plain, _) = case.run(Mode::default()).unwrap();
    let (forced, report) = case
        .run(Mode {
            force: true,
            ..Mode::default()
        })
        .unwrap();
    let n = report.unwrap().segments.len();
    assert!(
        n >= 4,
        "mid block and up blocks are cut points ({n} segments)"
    );
    exact("vae decode, forced segments", &plain, &forced);

    let (mono_need, seg_need, n) = needs(|m| case.run(m), true);
    eprintln!(
        "vae offloaded: monolithic {mono_need} B, largest segment {seg_need} B, {n} segments"
    );
    assert!(seg_need < mono_need);
    let (out, report) = case
        .run(Mode {
            budget: Some(seg_need),
            offload: true,
            ..Mode::default()
        })
        .unwrap();
    let report = report.unwrap();
    assert!(report.segmented && report.peak_bytes <= seg_need);
    exact("vae decode, offloaded under a budget", &plain, &out);
}

#[test]
fn vae_tiled_decode_runs_segmented_tiles() {
    let case = VaeCase::new();
    let [w, h, c, _] = case.z.ne;
    let latent = HostTensor::image(w, h, c, case.z.data.clone()).unwrap();
    let scale = 4;
    // 4×4-latent tiles (the minimum) over the 8×6 latent.
    let settings = TileSettings::new(16, 16, None, 0.25);
    let grid = plan_tiles_latent(w, h, scale, &settings).unwrap();
    let decode_all = |mode: Mode| -> (HostTensor, Option<RunReport>) {
        let (vae, runner) = case.runner(mode);
        let out = tiled_decode(
            &latent,
            scale,
            &grid,
            |tile: &HostTensor| -> Result<HostTensor, sd_cli::error::Error> {
                Ok(VaeCase::decode(&vae, &runner, tile)?.remove(0))
            },
            |_, _| {},
        )
        .unwrap();
        (out, runner.last_report())
    };
    let (plain, _) = decode_all(Mode::default());
    let (_, forced) = decode_all(Mode {
        force: true,
        offload: true,
        ..Mode::default()
    });
    let budget = max_required(&forced.unwrap());
    let (seg, report) = decode_all(Mode {
        budget: Some(budget),
        offload: true,
        ..Mode::default()
    });
    assert!(report.unwrap().segmented);
    eprintln!(
        "tiled decode ({} tiles) under a {budget} B budget: bit-identical",
        grid.len()
    );
    assert_eq!(plain.data, seg.data, "tiled decode: segmented tiles differ");
}

// ---------------------------------------------------------------- cache stores, hand-overs

/// A chain of 4 linear blocks with cut marks; block 1 stores its output in the named cache
/// (like a layer's prefix K/V), and a shared tensor made before block 0 is read by every block
/// (like PixArt's adaLN vector).
fn chain(mode: Mode) -> (Vec<HostTensor>, Vec<HostTensor>, Option<RunReport>) {
    let mut src = MemorySource::new();
    for b in 0..4 {
        src.insert(
            format!("b.{b}.weight"),
            [16, 16, 1, 1],
            (0..256)
                .map(|i| (((i * (b + 3)) % 23) as f32 - 11.0) / 16.0)
                .collect(),
        );
        src.insert(
            format!("b.{b}.bias"),
            [16, 1, 1, 1],
            (0..16).map(|i| i as f32 / 64.0).collect(),
        );
    }
    let backend = cpu();
    let loader = WeightLoader::new(&src, None);
    let blocks: Vec<Linear> = (0..4)
        .map(|b| Linear::new(&loader.root("b").pp(b), 16, 16, true).unwrap())
        .collect();
    let w = finish(loader, &backend, mode.offload);
    let runner = Runner::new("chain", Rc::clone(&backend), Some(w), options(mode));
    let x: Vec<f32> = (0..16 * 5).map(|i| (i as f32 * 0.21).cos()).collect();
    let out = runner
        .compute(|g| {
            let x = g.input_f32("x", [16, 5, 1, 1], x.clone());
            let shared = g.scale(g.input_f32("s", [16, 1, 1, 1], vec![0.5; 16]), 2.0);
            let mut h = x;
            for (b, lin) in blocks.iter().enumerate() {
                h = g.add(g.gelu(lin.forward(g, h)), shared);
                if b == 1 {
                    g.cache_store("kv.1", g.scale(h, 3.0));
                }
                h = g.cut(&format!("chain.{b}"), "x", h);
            }
            vec![h]
        })
        .unwrap();
    let report = runner.last_report();
    let cached = runner
        .compute(|g| vec![g.scale(g.cache_get("kv.1").expect("cache entry"), 1.0)])
        .unwrap();
    (out, cached, report)
}

#[test]
fn cache_stores_and_shared_tensors_cross_segments() {
    let (plain, plain_cache, _) = chain(Mode::default());
    for offload in [false, true] {
        let (out, cache, report) = chain(Mode {
            force: true,
            offload,
            ..Mode::default()
        });
        let report = report.unwrap();
        assert!(report.segmented);
        assert_eq!(report.segments.len(), 4);
        exact("chain output", &plain, &out);
        exact("chain cache store", &plain_cache, &cache);
    }
}
