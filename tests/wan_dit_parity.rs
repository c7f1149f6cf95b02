//! Parity of the Wan transformer with diffusers `WanTransformer3DModel`, in both checkpoint
//! layouts. Fixtures: tests/reference/wan_dit_fixtures.py → tests/fixtures/wan_dit/ (tiny
//! random models: 2 heads × 16, 2 layers, 6 → 4 channels, text dim 24; a T2V model with
//! patch (1, 2, 2) and an I2V one with an FLF2V position table and patch (2, 2, 2)).
//! Tolerance: max abs error ≤ 2e-5 × max(1, max |reference|) in f32 (measured ≤ 3.3e-6 with
//! the blocked CPU kernels and with ggml's own); `--fa` (f16 K/V) 2e-3; bf16 weights 2e-2
//! (measured 1.5e-2–2.0e-2 absolute against a scale of 6.65, 2.4e-2 with `--fa`'s bf16
//! attention); segmented runs must
//! equal monolithic ones exactly.

mod common;

use std::path::PathBuf;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::dit::wan::{heads_hint, Wan, WanConfig, WanInputs, WanLayout};
use sd_cli::runner::{
    MemoryOptions, RunOptions, Runner, RunnerError, StoreSource, WeightLoader, WeightSource,
};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const TOL: f32 = 2e-5;
const PREFIX: &str = "model.diffusion_model.";

/// The diffusers folder's weights and its config.json head count.
fn diffusers_store(kind: &str) -> (TensorStore, Option<usize>) {
    let dir = fixture_path(&format!("wan_dit/{kind}"));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let store = TensorStore::open(&dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    (store, heads_hint(&config))
}

/// The original-names single file, assembled from its recipe.
fn single_store(kind: &str, tmp: &std::path::Path) -> TensorStore {
    let base: PathBuf = fixture_path("wan_dit");
    let path = assemble_checkpoint(&base, &format!("{kind}.single"), tmp);
    TensorStore::open(&path).unwrap()
}

fn load_with(
    source: &dyn WeightSource,
    heads: Option<usize>,
    options: RunOptions,
) -> Result<(Wan, Runner), RunnerError> {
    load_as(source, heads, options, None)
}

/// Like [`load_with`], the weights converted to `wtype` (as `--type` does).
fn load_as(
    source: &dyn WeightSource,
    heads: Option<usize>,
    options: RunOptions,
    wtype: Option<DType>,
) -> Result<(Wan, Runner), RunnerError> {
    let backend = cpu();
    let loader = WeightLoader::new(source, wtype);
    let config = WanConfig::detect(&loader.root(""), heads)?;
    let model = Wan::new(&loader.root(""), config)?;
    let weights = loader.finish(&backend, "wan")?;
    Ok((model, Runner::new("wan", backend, Some(weights), options)))
}

fn load(store: &TensorStore, prefix: &str, heads: Option<usize>) -> (Wan, Runner) {
    load_with(
        &StoreSource::new(store, prefix),
        heads,
        RunOptions::default(),
    )
    .unwrap()
}

struct Case {
    latent: HostTensor,
    text: HostTensor,
    image: Option<HostTensor>,
    t: Vec<f32>,
    out: HostTensor,
}

fn case(name: &str) -> Case {
    let store = open_fixture("wan_dit/cases.safetensors");
    let get = |what: &str| tensor(&store, &format!("{name}.{what}"));
    Case {
        latent: get("latent"),
        text: get("text"),
        image: store
            .contains(&format!("{name}.image"))
            .then(|| get("image")),
        t: get("t").data,
        out: get("out"),
    }
}

fn try_run(model: &Wan, runner: &Runner, c: &Case) -> Result<HostTensor, RunnerError> {
    let mut err = None;
    let out = runner.compute(|g| {
        let inputs = WanInputs {
            latent: g.input_f32("latent", c.latent.ne, c.latent.data.clone()),
            text: g.input_f32("text", c.text.ne, c.text.data.clone()),
            image: c
                .image
                .as_ref()
                .map(|i| g.input_f32("image", i.ne, i.data.clone())),
            timestep: c.t[0],
            vace: None,
        };
        let y = if c.t.len() > 1 {
            model.forward_per_frame(g, &inputs, &c.t)
        } else {
            model.forward(g, &inputs)
        };
        match y {
            Ok(y) => vec![y],
            Err(e) => {
                err = Some(e);
                vec![g.input_f32("unused", [1, 1, 1, 1], vec![0.0])]
            }
        }
    })?;
    match err {
        Some(e) => Err(e),
        None => Ok(out.into_iter().next().unwrap()),
    }
}

fn check(model: &Wan, runner: &Runner, name: &str, what: &str) -> HostTensor {
    let c = case(name);
    let got = try_run(model, runner, &c).unwrap();
    assert_close(&format!("{name} ({what})"), &got, &c.out, TOL);
    got
}

const T2V_CASES: [&str; 4] = ["t2v", "t2v_late", "t2v_frames", "t2v_odd"];

#[test]
fn detects_config_both_layouts() {
    let (store, heads) = diffusers_store("t2v");
    assert_eq!(heads, Some(2));
    let (m, _) = load(&store, "", heads);
    let c = m.config();
    assert_eq!(c.layout, WanLayout::Diffusers);
    assert_eq!(
        (
            c.patch,
            c.in_channels,
            c.out_channels,
            c.dim,
            c.heads,
            c.head_dim
        ),
        ([1, 2, 2], 6, 4, 32, 2, 16)
    );
    assert_eq!(
        (c.ffn_dim, c.text_dim, c.freq_dim, c.layers, c.axes_dims),
        (48, 24, 64, 2, [8, 4, 4])
    );
    assert!(c.qk_norm && c.cross_attn_norm && c.image.is_none() && c.vace.is_none());

    let tmp = tempfile::tempdir().unwrap();
    let single = single_store("t2v", tmp.path());
    let (o, _) = load(&single, PREFIX, Some(2));
    assert_eq!(o.config().layout, WanLayout::Original);
    assert_eq!(
        WanConfig {
            layout: WanLayout::Diffusers,
            ..o.config().clone()
        },
        *c
    );

    let (store, heads) = diffusers_store("i2v");
    let (m, _) = load(&store, "", heads);
    let c = m.config();
    assert_eq!((c.patch, c.cross_attn_norm), ([2, 2, 2], false));
    let image = c.image.expect("image branch");
    assert_eq!((image.in_dim, image.pos_len), (20, Some(10)));
    let single = single_store("i2v", tmp.path());
    let (o, _) = load(&single, PREFIX, Some(2));
    assert_eq!(o.config().image, c.image);

    // Without config.json the head count is width / 128, which a width of 32 is not.
    let source = StoreSource::new(&single, PREFIX);
    let loader = WeightLoader::new(&source, None);
    let err = WanConfig::detect(&loader.root(""), None).unwrap_err();
    assert!(err.to_string().contains("num_attention_heads"), "{err}");
    assert_eq!(sd_cli::models::dit::wan::axes_dims(128), [44, 42, 42]);
}

#[test]
fn t2v_matches_diffusers_both_layouts() {
    let (store, heads) = diffusers_store("t2v");
    let (m, r) = load(&store, "", heads);
    let tmp = tempfile::tempdir().unwrap();
    let single = single_store("t2v", tmp.path());
    let (o, ro) = load(&single, PREFIX, Some(2));
    for name in T2V_CASES {
        check(&m, &r, name, "diffusers names");
        check(&o, &ro, name, "original names");
    }
}

#[test]
fn flash_attention_close() {
    let (store, heads) = diffusers_store("t2v");
    let options = RunOptions {
        flash_attn: true,
        ..RunOptions::default()
    };
    let (m, r) = load_with(&StoreSource::new(&store, ""), heads, options).unwrap();
    let c = case("t2v");
    assert_close("t2v (--fa)", &try_run(&m, &r, &c).unwrap(), &c.out, 2e-3);
}

/// With bf16 weights (products round their activations to bf16) `--fa` lets the CPU's
/// attention round its operands to bf16 too, where the CPU has AVX-512 BF16: the result moves,
/// and stays as close to diffusers as the bf16 weights leave it.
#[test]
fn bf16_weights_with_fa_round_attention_too() {
    let (store, heads) = diffusers_store("t2v");
    let c = case("t2v");
    let run = |flash_attn| {
        let options = RunOptions {
            flash_attn,
            ..RunOptions::default()
        };
        let source = StoreSource::new(&store, "");
        let (m, r) = load_as(&source, heads, options, Some(DType::BF16)).unwrap();
        try_run(&m, &r, &c).unwrap()
    };
    let (plain, fa) = (run(false), run(true));
    let plain_err = assert_close("t2v bf16 weights", &plain, &c.out, 2e-2);
    let fa_err = assert_close("t2v bf16 weights (--fa)", &fa, &c.out, 2e-2);
    let apart = max_abs_diff(&plain, &fa);
    if device::on_device() {
        // Another device's `--fa` is ggml's fused f16 kernel, whatever the weights.
    } else if sd_cli::cpu_info::kernel_may_use("avx512bf16") {
        assert!(apart > 0.0, "--fa left the attention exact");
        // The attention's rounding is of the order the weights' already is.
        assert!(
            fa_err < 4.0 * plain_err,
            "--fa error {fa_err} against {plain_err}"
        );
    } else if sd_cli::cpu_info::kernel_may_use("avx2") && sd_cli::cpu_info::kernel_may_use("fma") {
        // The blocked attention without AVX-512 BF16 stays exact (without the blocked
        // kernels `--fa` is ggml's fused f16 kernel, which moves the result too).
        assert_eq!(apart, 0.0, "no bf16 attention without AVX-512 BF16");
    }
}

#[test]
fn i2v_matches_diffusers_both_layouts() {
    let (store, heads) = diffusers_store("i2v");
    let (m, r) = load(&store, "", heads);
    check(&m, &r, "i2v", "diffusers names");
    let tmp = tempfile::tempdir().unwrap();
    let single = single_store("i2v", tmp.path());
    let (o, ro) = load(&single, PREFIX, Some(2));
    check(&o, &ro, "i2v", "original names");
}

#[test]
fn segmented_run_matches_monolithic() {
    let (store, heads) = diffusers_store("i2v");
    let (m, r) = load(&store, "", heads);
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let (ms, rs) = load_with(&StoreSource::new(&store, ""), heads, options).unwrap();
    let c = case("i2v");
    let a = try_run(&m, &r, &c).unwrap();
    let b = try_run(&ms, &rs, &c).unwrap();
    let report = rs.last_report().expect("a planned run");
    assert!(report.segmented && report.segments.len() >= 3, "{report:?}");
    assert_eq!(a, b, "segmented vs monolithic");
}

#[test]
fn missing_tensor_is_an_error_naming_it() {
    let (store, heads) = diffusers_store("i2v");
    for missing in [
        "blocks.1.attn2.add_v_proj.weight",
        "condition_embedder.image_embedder.norm2.weight",
        "scale_shift_table",
        "blocks.0.scale_shift_table",
    ] {
        let source = Without {
            inner: StoreSource::new(&store, ""),
            missing,
        };
        match load_with(&source, heads, RunOptions::default()) {
            Err(RunnerError::MissingTensor { key, .. }) => assert_eq!(key, missing),
            Err(e) => panic!("{missing}: wrong error {e}"),
            Ok(_) => panic!("loaded without {missing}"),
        }
    }
    let empty = TensorStore::new();
    let err = load_with(&StoreSource::new(&empty, ""), None, RunOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, RunnerError::MissingTensor { .. }), "{err}");
}

#[test]
fn bad_inputs_are_errors() {
    let (store, heads) = diffusers_store("i2v");
    let (m, r) = load(&store, "", heads);
    let good = case("i2v");
    let no_image = Case {
        image: None,
        ..case("i2v")
    };
    let err = try_run(&m, &r, &no_image).unwrap_err();
    assert!(err.to_string().contains("image"), "{err}");
    let wrong_channels = Case {
        latent: HostTensor::zeros([12, 8, 4, 5]),
        ..case("i2v")
    };
    assert!(try_run(&m, &r, &wrong_channels).is_err());
    let long_image = Case {
        image: Some(HostTensor::zeros([20, 11, 1, 1])),
        ..case("i2v")
    };
    assert!(try_run(&m, &r, &long_image).is_err());
    let frames = Case {
        t: vec![1.0, 2.0, 3.0],
        ..case("i2v")
    };
    let err = try_run(&m, &r, &frames).unwrap_err();
    assert!(err.to_string().contains("frame timesteps"), "{err}");
    // The good case still runs on the same runner.
    assert_close(
        "i2v after errors",
        &try_run(&m, &r, &good).unwrap(),
        &good.out,
        TOL,
    );

    let (store, heads) = diffusers_store("t2v");
    let (m, r) = load(&store, "", heads);
    let with_image = Case {
        image: Some(HostTensor::zeros([20, 5, 1, 1])),
        ..case("t2v")
    };
    assert!(try_run(&m, &r, &with_image).is_err());
}
