//! Parity of the UNet against diffusers' `UNet2DConditionModel`, in both weight layouts, for
//! SD1-, SD2-, SDXL-, refiner- and SSD-1B-like tiny models.
//! Fixtures: tests/reference/unet_fixtures.py → tests/fixtures/unet/<variant>/{diffusers/,
//! ldm.safetensors, io.safetensors} (weights stored f16; the references are f32 computations
//! over those exact values, with diffusers' GroupNorm eps 1e-5 and exact-GELU GEGLU).
//! Tolerances, as max abs error ≤ tol × max(1, max |reference|), batch 2 with two timesteps:
//! - f32 (weights upcast from the f16 files): 1e-4, blocked CPU kernels and ggml's own;
//! - the f16 files as they are (f16 matmuls and convs): 1e-2;
//! - bf16 matmul weights (`--type`), f32 convs: 3e-2; q8_0 matmul weights: 5e-2 (a sanity
//!   bound: q8_0 products also quantize their activations, and the random tiny nets amplify).
//!
//! Segmented (graph-cut) runs are bit-identical to monolithic ones.

mod common;

use std::path::PathBuf;
use std::rc::Rc;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::unet::{
    sdxl_time_ids, UNet, UNetConfig, UNetHparams, UNetLayout, CONV_PROJECTION_HEADS,
};
use sd_cli::runner::convert_f32;
use sd_cli::runner::{
    MemoryOptions, MemorySource, RunOptions, Runner, RunnerError, StoreSource, WeightLoader,
    WeightSource,
};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, GgufWriter, TensorStore};

const F32_TOL: f32 = 1e-4;
const F16_TOL: f32 = 1e-2;
const BF16_TOL: f32 = 3e-2;
const Q8_0_TOL: f32 = 5e-2;
/// The fixtures' `norm_num_groups` (diffusers' config says it; the LDM files do not).
const GROUPS: usize = 4;
const VARIANTS: [&str; 5] = ["sd1", "sd2", "sdxl", "refiner", "ssd1b"];
const ROOT: &str = "model.diffusion_model.";

fn dir(variant: &str) -> PathBuf {
    fixture_path(&format!("unet/{variant}"))
}

/// The variant's weights as a model file puts them in the store: the diffusers folder added
/// under the diffusion prefix (as `--diffusion-model` does), the LDM file with its own
/// `model.diffusion_model.` names.
fn store(variant: &str, layout: UNetLayout) -> TensorStore {
    let mut store = TensorStore::new();
    match layout {
        UNetLayout::Diffusers => store
            .add_file(
                &dir(variant).join("diffusers"),
                Component::Diffusion.prefix(),
            )
            .unwrap(),
        UNetLayout::Ldm => store
            .add_file(&dir(variant).join("ldm.safetensors"), "")
            .unwrap(),
    }
    store
}

/// What a caller passes for the layout: the folder's config.json, or for a single file the
/// overrides a user would give (norm groups, and heads unless upstream's rule gives them).
fn hparams(variant: &str, store: &TensorStore, layout: UNetLayout) -> UNetHparams {
    match layout {
        UNetLayout::Diffusers => {
            let config = store.files().iter().find_map(|f| f.config.as_ref());
            UNetHparams::from_diffusers_config(config.expect("config.json")).unwrap()
        }
        UNetLayout::Ldm => UNetHparams {
            norm_groups: Some(GROUPS),
            heads: match variant {
                "sd1" => Some(vec![4]),
                "sd2" => Some(vec![2, 4]),
                "sdxl" => Some(vec![1, 2, 4]),
                "ssd1b" => Some(vec![1, 2, 2]),
                _ => None,
            },
            ..UNetHparams::default()
        },
    }
}

/// Every tensor of `store` under `prefix` as f32 in memory (names relative to `prefix`).
fn upcast(store: &TensorStore, prefix: &str) -> MemorySource {
    let mut src = MemorySource::new();
    for info in store.with_prefix(prefix) {
        let name = info.name.strip_prefix(prefix).unwrap();
        src.insert(name, info.ne, store.to_f32(info).unwrap());
    }
    src
}

struct Io {
    x: HostTensor,
    t: HostTensor,
    context: HostTensor,
    /// (pooled [P, B], time_ids [k, B]) for SDXL-style variants.
    vector: Option<(HostTensor, HostTensor)>,
    y: HostTensor,
}

fn io(variant: &str) -> (TensorStore, Io) {
    let s = TensorStore::open(&dir(variant).join("io.safetensors")).unwrap();
    let vector = s
        .contains("in.pooled")
        .then(|| (tensor(&s, "in.pooled"), tensor(&s, "in.time_ids")));
    let io = Io {
        x: tensor(&s, "in.x"),
        t: tensor(&s, "in.t"),
        context: tensor(&s, "in.context"),
        vector,
        y: tensor(&s, "out.y"),
    };
    (s, io)
}

/// `y` [adm, B] from the pooled embeddings and micro-conditions, one batch element at a time.
fn adm(config: &UNetConfig, vector: &(HostTensor, HostTensor)) -> HostTensor {
    let (pooled, ids) = vector;
    let (p, k, b) = (pooled.ne[0], ids.ne[0], pooled.ne[1]);
    let mut y = Vec::new();
    for i in 0..b {
        let row = config
            .adm_vector(
                &pooled.data[i * p..(i + 1) * p],
                &ids.data[i * k..(i + 1) * k],
            )
            .unwrap();
        y.extend(row);
    }
    HostTensor::new([y.len() / b, b, 1, 1], y).unwrap()
}

/// How a run loads and executes the model.
#[derive(Clone, Copy)]
struct Mode {
    /// Weights as f32 (upcast) rather than the files' f16.
    f32: bool,
    wtype: Option<DType>,
    blocked: bool,
    force_segmented: bool,
    /// Weights in host memory, copied to the device as segments need them.
    offload: bool,
    /// A simulated device budget in bytes.
    budget: Option<usize>,
}

const F32: Mode = Mode {
    f32: true,
    wtype: None,
    blocked: true,
    force_segmented: false,
    offload: false,
    budget: None,
};

fn load(
    source: &dyn WeightSource,
    variant: &str,
    store: &TensorStore,
    layout: UNetLayout,
    mode: Mode,
) -> (UNet, Runner) {
    let loader = WeightLoader::new(source, mode.wtype);
    let config = UNetConfig::detect(&loader.root(""), &hparams(variant, store, layout)).unwrap();
    assert_eq!(config.layout, layout);
    let unet = UNet::new(&loader.root(""), config).unwrap();
    let backend = cpu();
    let weights = if mode.offload {
        loader.finish_offloaded(&backend, "unet").unwrap()
    } else {
        loader.finish(&backend, "unet").unwrap()
    };
    let options = RunOptions {
        blocked_kernels: mode.blocked,
        memory_budget: mode.budget,
        memory: MemoryOptions {
            force_segmented: mode.force_segmented,
            offload_to_cpu: mode.offload,
            // KiB-sized fixtures: no headroom, so budgets meet the real segment boundary.
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    (
        unet,
        Runner::new("unet", Rc::clone(&backend), Some(weights), options),
    )
}

fn call(unet: &UNet, runner: &Runner, io: &Io, x: &HostTensor) -> HostTensor {
    let y = io.vector.as_ref().map(|v| adm(unet.config(), v));
    call_with(unet, runner, x, &io.t, &io.context, y.as_ref())
}

fn call_with(
    unet: &UNet,
    runner: &Runner,
    x: &HostTensor,
    t: &HostTensor,
    context: &HostTensor,
    y: Option<&HostTensor>,
) -> HostTensor {
    unet.check_inputs(x.ne, t.len(), context.ne, y.map(|y| y.ne))
        .unwrap();
    runner
        .compute(|g| {
            let x = g.input_f32("x", x.ne, x.data.clone());
            let t = g.input_f32("t", t.ne, t.data.clone());
            let c = g.input_f32("context", context.ne, context.data.clone());
            let y = y.map(|y| g.input_f32("y", y.ne, y.data.clone()));
            vec![unet.forward(g, x, t, c, y)]
        })
        .unwrap()
        .remove(0)
}

/// Runs `variant` from `layout` in `mode` on the fixture input `x_name`.
fn run(variant: &str, layout: UNetLayout, mode: Mode, x_name: &str) -> (HostTensor, Io) {
    let st = store(variant, layout);
    let (io_store, io) = io(variant);
    let x = tensor(&io_store, x_name);
    let (unet, runner) = if mode.f32 {
        let src = upcast(&st, ROOT);
        load(&src, variant, &st, layout, mode)
    } else {
        let src = StoreSource::new(&st, ROOT);
        load(&src, variant, &st, layout, mode)
    };
    (call(&unet, &runner, &io, &x), io)
}

fn check(variant: &str, layout: UNetLayout, mode: Mode, tol: f32, what: &str) {
    let (got, io) = run(variant, layout, mode, "in.x");
    assert_close(&format!("{variant} {layout:?} {what}"), &got, &io.y, tol);
}

#[test]
fn diffusers_layout_matches_diffusers() {
    for v in VARIANTS {
        check(v, UNetLayout::Diffusers, F32, F32_TOL, "f32");
    }
}

#[test]
fn ldm_layout_matches_diffusers() {
    for v in VARIANTS {
        check(v, UNetLayout::Ldm, F32, F32_TOL, "f32");
    }
}

#[test]
fn ggml_kernels_match_diffusers() {
    let mode = Mode {
        blocked: false,
        ..F32
    };
    for v in ["sd1", "sdxl"] {
        check(v, UNetLayout::Diffusers, mode, F32_TOL, "f32, ggml kernels");
    }
}

#[test]
fn odd_latent_sizes_resize_to_the_skip_tensors() {
    // 10×6 → 5×3 → 3×2 on the way down; the up-samplers go 3×2 → 5×3 → 10×6.
    for layout in [UNetLayout::Diffusers, UNetLayout::Ldm] {
        let (got, _) = run("sdxl", layout, F32, "in.x_odd");
        let (s, _) = io("sdxl");
        assert_close(
            &format!("sdxl {layout:?} 10x6"),
            &got,
            &tensor(&s, "out.y_odd"),
            F32_TOL,
        );
    }
}

#[test]
fn reduced_precision_weights_stay_close() {
    for v in ["sd1", "sdxl"] {
        let f16 = Mode { f32: false, ..F32 };
        check(v, UNetLayout::Diffusers, f16, F16_TOL, "f16 file");
        for (ty, tol) in [(DType::BF16, BF16_TOL), (DType::Q8_0, Q8_0_TOL)] {
            let mode = Mode {
                wtype: Some(ty),
                ..F32
            };
            check(v, UNetLayout::Ldm, mode, tol, &format!("{ty} matmuls"));
        }
    }
}

/// The sd1 LDM weights as a quantized GGUF would hold them: Q8_0 matrices where rows split
/// into 32-blocks, bf16 conv kernels (a type ggml's conv does not take: dequantized on load),
/// f16 elsewhere.
fn write_quantized_gguf(path: &std::path::Path) {
    let st = store("sd1", UNetLayout::Ldm);
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    for info in st.iter() {
        let ne: Vec<u64> = info.ne[..info.n_dims].iter().map(|&d| d as u64).collect();
        let values = st.to_f32(info).unwrap();
        let ty = match info.n_dims {
            2 if info.ne[0].is_multiple_of(32) => DType::Q8_0,
            4 => DType::BF16,
            _ => DType::F16,
        };
        w.add_tensor(&info.name, ty, &ne).unwrap();
        data.push(convert_f32(&values, ty, info.ne[0]).unwrap());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    w.write(path, &refs).unwrap();
}

#[test]
fn quantized_gguf_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sd1_q8_0.gguf");
    write_quantized_gguf(&path);
    let mut st = TensorStore::new();
    st.add_file(&path, "").unwrap();
    let quantized = st.iter().filter(|t| t.dtype == DType::Q8_0).count();
    assert!(quantized > 10, "{quantized} Q8_0 tensors");
    let src = StoreSource::new(&st, ROOT);
    let (io_store, io) = io("sd1");
    let mode = Mode { f32: false, ..F32 };
    let (unet, runner) = load(&src, "sd1", &st, UNetLayout::Ldm, mode);
    let got = call(&unet, &runner, &io, &tensor(&io_store, "in.x"));
    assert_close("sd1 Q8_0 GGUF", &got, &io.y, Q8_0_TOL);
}

fn detect(variant: &str, layout: UNetLayout, hp: &UNetHparams) -> Result<UNetConfig, RunnerError> {
    let st = store(variant, layout);
    let src = StoreSource::new(&st, ROOT);
    let loader = WeightLoader::new(&src, None);
    UNetConfig::detect(&loader.root(""), hp)
}

fn depths(c: &UNetConfig) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
    (c.transformer_depths(), c.up_transformer_depths())
}

fn heads(c: &UNetConfig) -> Vec<usize> {
    let mut h: Vec<usize> = c
        .down
        .iter()
        .chain(&c.up)
        .flat_map(|l| &l.blocks)
        .filter_map(|b| b.attention.as_ref().map(|a| a.heads))
        .collect();
    if let Some(m) = &c.mid {
        h.extend(m.stages.iter().map(|s| s.0.heads));
    }
    h
}

#[test]
fn config_is_read_from_the_tensors() {
    for v in VARIANTS {
        let hp_d = hparams(v, &store(v, UNetLayout::Diffusers), UNetLayout::Diffusers);
        let d = detect(v, UNetLayout::Diffusers, &hp_d).unwrap();
        let l = detect(
            v,
            UNetLayout::Ldm,
            &hparams(v, &store(v, UNetLayout::Ldm), UNetLayout::Ldm),
        )
        .unwrap();
        // Same structure and sizes, whatever the names.
        assert_eq!(d.block_channels(), l.block_channels(), "{v}");
        assert_eq!(depths(&d), depths(&l), "{v}");
        assert_eq!(heads(&d), heads(&l), "{v}");
        assert_eq!(d.mid.is_some(), l.mid.is_some(), "{v}");
        for c in [&d, &l] {
            assert_eq!((c.in_channels, c.out_channels, c.context_dim), (4, 4, 32));
            assert_eq!((c.model_channels, c.time_embed_dim), (8, 32));
            assert_eq!(c.norm_groups, GROUPS);
            assert_eq!(c.linear_projection, v != "sd1", "{v}");
            let up: Vec<usize> = c.up.iter().map(|l| l.blocks.len()).collect();
            let down: Vec<usize> = c.down.iter().map(|l| l.blocks.len() + 1).collect();
            assert_eq!(
                up,
                down.into_iter().rev().collect::<Vec<_>>(),
                "{v}: up levels"
            );
        }
    }
    let c = |v: &str| {
        detect(
            v,
            UNetLayout::Ldm,
            &hparams(v, &store(v, UNetLayout::Ldm), UNetLayout::Ldm),
        )
        .unwrap()
    };
    let sd1 = c("sd1");
    assert_eq!(sd1.block_channels(), vec![8, 16]);
    assert_eq!(
        depths(&sd1),
        (
            vec![vec![1, 1], vec![0, 0]],
            vec![vec![0, 0, 0], vec![1, 1, 1]]
        )
    );
    assert_eq!(sd1.adm_in_channels, None);
    assert_eq!(sd1.mid.as_ref().unwrap().stages.len(), 1);
    let sdxl = c("sdxl");
    assert_eq!(sdxl.adm_in_channels, Some(16 + 6 * 8));
    assert_eq!(
        depths(&sdxl),
        (
            vec![vec![0], vec![2], vec![2]],
            vec![vec![2, 2], vec![2, 2], vec![0, 0]]
        )
    );
    assert_eq!(sdxl.micro_condition_width(16, 6).unwrap(), 8);
    let refiner = c("refiner");
    assert_eq!(refiner.adm_in_channels, Some(24 + 5 * 8));
    assert_eq!(refiner.micro_condition_width(24, 5).unwrap(), 8);
    let ssd = c("ssd1b");
    assert!(
        ssd.mid.as_ref().unwrap().stages.is_empty(),
        "SSD-1B: resnet-only mid block"
    );
    assert_eq!(
        depths(&ssd),
        (
            vec![vec![0, 0], vec![1, 2], vec![2, 1]],
            vec![vec![1, 2, 1], vec![2, 1, 1], vec![0, 0, 0]]
        )
    );
    assert_eq!(ssd.downscale_factor(), 4);
}

#[test]
fn heads_follow_upstreams_rule_without_a_config() {
    let groups = UNetHparams {
        norm_groups: Some(GROUPS),
        ..UNetHparams::default()
    };
    // 1×1-conv projections: 8 heads per transformer.
    let sd1 = detect("sd1", UNetLayout::Ldm, &groups).unwrap();
    assert!(heads(&sd1).iter().all(|&h| h == CONV_PROJECTION_HEADS));
    // Linear projections: head size 64, at least one head (the fixture widths are 8 and 16).
    let sd2 = detect("sd2", UNetLayout::Ldm, &groups).unwrap();
    assert!(heads(&sd2).iter().all(|&h| h == 1));
    // A head size override; explicit heads win over config.json.
    let hd = UNetHparams {
        head_dim: Some(4),
        ..groups.clone()
    };
    let sd2 = detect("sd2", UNetLayout::Ldm, &hd).unwrap();
    assert_eq!(sd2.down[0].blocks[0].attention.as_ref().unwrap().heads, 2);
    assert_eq!(sd2.down[1].blocks[0].attention.as_ref().unwrap().heads, 4);
    let st = store("sd2", UNetLayout::Diffusers);
    let from_json = hparams("sd2", &st, UNetLayout::Diffusers);
    assert_eq!(from_json.heads, Some(vec![2, 4]));
    let over = UNetHparams {
        heads: Some(vec![1]),
        ..UNetHparams::default()
    }
    .or(from_json);
    assert_eq!(over.heads, Some(vec![1]));
    assert_eq!(over.norm_groups, Some(GROUPS));
    // The refiner fixture's heads are the rule's: no override needed for parity.
    check(
        "refiner",
        UNetLayout::Ldm,
        F32,
        F32_TOL,
        "f32, default heads",
    );
}

#[test]
fn micro_conditions_build_the_vector_as_diffusers() {
    let (s, io) = io("sdxl");
    let ids = tensor(&s, "in.time_ids");
    let [w, h, _, _] = io.x.ne;
    let px = ((8 * h) as f32, (8 * w) as f32);
    assert_eq!(&ids.data[..6], &sdxl_time_ids(px, (0.0, 0.0), px));
    let c = detect(
        "sdxl",
        UNetLayout::Ldm,
        &hparams("sdxl", &store("sdxl", UNetLayout::Ldm), UNetLayout::Ldm),
    )
    .unwrap();
    // A pooled width that leaves no whole micro-condition width is refused.
    let e = c.adm_vector(&[0.0; 15], &ids.data[..6]).unwrap_err();
    assert!(e.to_string().contains("micro-condition"), "{e}");
    let sd1 = detect(
        "sd1",
        UNetLayout::Ldm,
        &hparams("sd1", &store("sd1", UNetLayout::Ldm), UNetLayout::Ldm),
    )
    .unwrap();
    assert!(sd1.adm_vector(&[0.0; 16], &ids.data[..6]).is_err());
}

#[test]
fn segmented_execution_matches_monolithic() {
    // The skip tensors, the timestep embedding and the context cross segment boundaries.
    for v in ["sdxl", "ssd1b"] {
        let st = store(v, UNetLayout::Diffusers);
        let (io_store, io) = io(v);
        let x = tensor(&io_store, "in.x");
        let src = upcast(&st, ROOT);
        let run = |mode: Mode| {
            let (unet, runner) = load(&src, v, &st, UNetLayout::Diffusers, mode);
            let out = call(&unet, &runner, &io, &x);
            (out, runner.last_report(), unet)
        };
        let (plain, _, _) = run(F32);
        let (seg, report, unet) = run(Mode {
            force_segmented: true,
            ..F32
        });
        let report = report.unwrap();
        let c = unet.config();
        let blocks: usize = c.down.iter().chain(&c.up).map(|l| l.blocks.len()).sum();
        assert!(report.segmented);
        assert!(
            report.segments.len() > blocks,
            "{v}: {} segments",
            report.segments.len()
        );
        assert_eq!(plain.data, seg.data, "{v}: forced segments differ");

        // Offloaded weights streamed through a budget of the largest segment's need.
        let (_, forced, _) = run(Mode {
            force_segmented: true,
            offload: true,
            ..F32
        });
        let need = forced
            .unwrap()
            .segments
            .iter()
            .map(|s| s.required_bytes)
            .max()
            .unwrap();
        let (budgeted, report, _) = run(Mode {
            offload: true,
            budget: Some(need),
            ..F32
        });
        let report = report.unwrap();
        assert!(report.segmented && report.peak_bytes <= need);
        assert_eq!(plain.data, budgeted.data, "{v}: budgeted segments differ");
        eprintln!(
            "{v}: {} segments, {need} B budget, bit-identical",
            report.segments.len()
        );
    }
}

#[test]
fn a_shared_context_broadcasts_over_the_batch() {
    // Context and y of batch 1 against the same rows given for both batch elements.
    let st = store("sdxl", UNetLayout::Ldm);
    let src = upcast(&st, ROOT);
    let (_, io) = io("sdxl");
    let (unet, runner) = load(&src, "sdxl", &st, UNetLayout::Ldm, F32);
    let y = adm(unet.config(), io.vector.as_ref().unwrap());
    let first = |t: &HostTensor, axis: usize| {
        let mut ne = t.ne;
        ne[axis] = 1;
        let n: usize = ne.iter().product();
        HostTensor::new(ne, t.data[..n].to_vec()).unwrap()
    };
    let twice = |t: &HostTensor, axis: usize| {
        let mut ne = t.ne;
        ne[axis] = 2;
        HostTensor::new(ne, t.data.repeat(2)).unwrap()
    };
    let (c1, y1) = (first(&io.context, 2), first(&y, 1));
    let shared = call_with(&unet, &runner, &io.x, &io.t, &c1, Some(&y1));
    let (c2, y2) = (twice(&c1, 2), twice(&y1, 1));
    let repeated = call_with(&unet, &runner, &io.x, &io.t, &c2, Some(&y2));
    assert_eq!(shared.data, repeated.data);
}

/// A copy of the sd2 LDM weights (f32) with `edit` applied.
fn edited(edit: impl FnOnce(&mut MemorySource)) -> Result<UNetConfig, RunnerError> {
    let st = store("sd2", UNetLayout::Ldm);
    let mut src = upcast(&st, ROOT);
    edit(&mut src);
    let loader = WeightLoader::new(&src, None);
    let hp = hparams("sd2", &st, UNetLayout::Ldm);
    let config = UNetConfig::detect(&loader.root(""), &hp)?;
    UNet::new(&loader.root(""), config.clone())?;
    Ok(config)
}

#[test]
fn bad_weights_are_clean_errors() {
    // Not a UNet at all.
    let nn = open_fixture("nn/blocks.safetensors");
    let src = StoreSource::new(&nn, "");
    let loader = WeightLoader::new(&src, None);
    let e = UNetConfig::detect(&loader.root(""), &UNetHparams::default()).unwrap_err();
    assert!(e.to_string().contains("conv_in.weight"), "{e}");

    assert!(edited(|_| {}).is_ok());
    // A resnet conv of the wrong width.
    let e = edited(|s| {
        s.insert(
            "output_blocks.1.0.in_layers.2.weight",
            [3, 3, 20, 16],
            vec![0.0; 2880],
        );
    })
    .unwrap_err();
    assert!(
        matches!(e, RunnerError::ShapeMismatch { ref key, .. } if key.contains("output_blocks")),
        "{e}"
    );
    // A cross-attention key projection reading another context width.
    let e = edited(|s| {
        s.insert(
            "output_blocks.2.1.transformer_blocks.0.attn2.to_k.weight",
            [24, 8, 1, 1],
            vec![0.0; 192],
        );
    })
    .unwrap_err();
    assert!(e.to_string().contains("attn2.to_k"), "{e}");
    // An up level too many: the skip tensors do not balance.
    let e = edited(|s| {
        s.insert(
            "output_blocks.4.0.in_layers.2.weight",
            [3, 3, 16, 8],
            vec![0.0; 1152],
        );
    })
    .unwrap_err();
    assert!(e.to_string().contains("skip"), "{e}");

    // Default 32 norm groups do not divide the 8-channel levels.
    let c = detect("sd2", UNetLayout::Ldm, &UNetHparams::default()).unwrap();
    assert_eq!(c.norm_groups, 32);
    let st = store("sd2", UNetLayout::Ldm);
    let src = StoreSource::new(&st, ROOT);
    let loader = WeightLoader::new(&src, None);
    let e = UNet::new(&loader.root(""), c).unwrap_err();
    assert!(e.to_string().contains("groups"), "{e}");
    // Heads that do not divide the width, or one list entry per level missing.
    for heads in [vec![3], vec![1, 2, 4]] {
        let hp = UNetHparams {
            heads: Some(heads),
            norm_groups: Some(GROUPS),
            ..UNetHparams::default()
        };
        let e = detect("sd2", UNetLayout::Ldm, &hp).unwrap_err();
        assert!(e.to_string().contains("head"), "{e}");
    }
    // A config.json with a nonsense head count.
    let e = UNetHparams::from_diffusers_config(&serde_json::json!({"attention_head_dim": [8, -1]}))
        .unwrap_err();
    assert!(e.to_string().contains("attention_head_dim"), "{e}");
}

#[test]
fn bad_inputs_are_clean_errors() {
    let st = store("sdxl", UNetLayout::Ldm);
    let src = StoreSource::new(&st, ROOT);
    let (unet, _) = load(
        &src,
        "sdxl",
        &st,
        UNetLayout::Ldm,
        Mode { f32: false, ..F32 },
    );
    let adm = 16 + 6 * 8;
    assert!(unet
        .check_inputs([12, 8, 4, 2], 2, [32, 5, 2, 1], Some([adm, 2, 1, 1]))
        .is_ok());
    assert!(unet
        .check_inputs([12, 8, 4, 2], 2, [32, 5, 1, 1], Some([adm, 1, 1, 1]))
        .is_ok());
    for (x, t, c, y, what) in [
        ([12, 8, 3, 2], 2, [32, 5, 2, 1], None, "x"),
        ([12, 8, 4, 2], 1, [32, 5, 2, 1], None, "timesteps"),
        ([12, 8, 4, 2], 2, [48, 5, 2, 1], None, "context"),
        ([12, 8, 4, 2], 2, [32, 5, 3, 1], None, "context"),
        (
            [12, 8, 4, 2],
            2,
            [32, 5, 2, 1],
            Some([adm + 1, 2, 1, 1]),
            "y",
        ),
    ] {
        let e = unet.check_inputs(x, t, c, y).unwrap_err();
        assert!(e.to_string().contains(&format!("'{what}'")), "{what}: {e}");
    }
    let st = store("sd1", UNetLayout::Ldm);
    let src = StoreSource::new(&st, ROOT);
    let (sd1, _) = load(
        &src,
        "sd1",
        &st,
        UNetLayout::Ldm,
        Mode { f32: false, ..F32 },
    );
    let e = sd1
        .check_inputs([12, 8, 4, 1], 1, [32, 5, 1, 1], Some([64, 1, 1, 1]))
        .unwrap_err();
    assert!(e.to_string().contains("vector conditioning"), "{e}");
}
