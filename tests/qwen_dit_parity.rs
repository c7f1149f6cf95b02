//! Parity of the Qwen Image 2.1 transformer with diffusers `QwenImage21Transformer2DModel`,
//! and the prefix K/V cache.
//! Fixtures: tests/reference/qwen_dit_fixtures.py → tests/fixtures/qwen_dit/ (a tiny random
//! model: 2 heads × 16, 2 layers, 16 channels, text dim 24, rope axes [4, 6, 6]; a 6×4
//! (W×H) latent, 5 text tokens, t = 0.37; batch 2 with t = [0.37, 0.81]).
//! Tolerances (× max(1, max |reference|)): 1e-4 against diffusers in f32; a reused f32 cache
//! 1e-5 against the full sequence; f16 storage 5e-4 and q8_0 storage 3e-3 against the full
//! sequence (the stored K/V are rounded), while reuse repeats the storing call's output
//! (1e-5) because that call already attends to the stored values.

mod common;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::dit::qwen_image_2_1::{
    cache_names, KvMode, PrefixCache, PrefixCacheError, QwenImage21, QwenImage21Config,
    QwenImage21Inputs,
};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const TOL: f32 = 1e-4;
const AXES: [usize; 3] = [4, 6, 6];

fn cases() -> TensorStore {
    open_fixture("qwen_dit/cases.safetensors")
}

fn load(file: &str, prefix: &str, options: RunOptions) -> (QwenImage21, Runner) {
    load_typed(file, prefix, options, None)
}

fn load_typed(
    file: &str,
    prefix: &str,
    options: RunOptions,
    wtype: Option<DType>,
) -> (QwenImage21, Runner) {
    let backend = cpu();
    let store = open_fixture(file);
    let source = StoreSource::new(&store, prefix);
    let loader = WeightLoader::new(&source, wtype);
    let config = QwenImage21Config::detect(&loader.root("")).unwrap();
    let model = QwenImage21::new(&loader.root(""), config).unwrap();
    let weights = loader.finish(&backend, "qwen21").unwrap();
    let runner = Runner::new("qwen21", backend, Some(weights), options);
    (model, runner)
}

fn model() -> (QwenImage21, Runner) {
    load("qwen_dit/weights.safetensors", "", RunOptions::default())
}

struct Case {
    x: HostTensor,
    text: HostTensor,
    t: Vec<f32>,
    out: HostTensor,
}

fn case(store: &TensorStore, name: &str) -> Case {
    Case {
        x: tensor(store, &format!("{name}.x")),
        text: tensor(store, &format!("{name}.text")),
        t: tensor(store, &format!("{name}.t")).data,
        out: tensor(store, &format!("{name}.out")),
    }
}

fn run(model: &QwenImage21, runner: &Runner, c: &Case, kv: KvMode<'_>) -> HostTensor {
    try_run(model, runner, c, kv).unwrap()
}

fn try_run(
    model: &QwenImage21,
    runner: &Runner,
    c: &Case,
    kv: KvMode<'_>,
) -> Result<HostTensor, PrefixCacheError> {
    let mut err = None;
    let out = runner
        .compute(|g| {
            let inputs = QwenImage21Inputs {
                latent: g.input_f32("x", c.x.ne, c.x.data.clone()),
                text: Some(g.input_f32("text", c.text.ne, c.text.data.clone())),
                timesteps: &c.t,
                kv,
                refs: &[],
                layout: None,
            };
            match model.forward(g, &inputs) {
                Ok(y) => vec![y],
                Err(e) => {
                    err = Some(e);
                    vec![g.input_f32("unused", [1, 1, 1, 1], vec![0.0])]
                }
            }
        })
        .unwrap();
    match err {
        Some(e) => Err(e),
        None => Ok(out.into_iter().next().unwrap()),
    }
}

/// A cache entry read back as f32.
fn cache_entry(runner: &Runner, name: &str) -> HostTensor {
    runner
        .compute(|g| vec![g.scale(g.cast(g.cache_get(name).unwrap(), DType::F32), 1.0)])
        .unwrap()
        .remove(0)
}

#[test]
fn detects_config_both_layouts() {
    let (m, _) = model();
    let c = m.config();
    assert_eq!(
        (c.in_channels, c.out_channels, c.hidden_size, c.text_dim),
        (16, 16, 32, 24)
    );
    assert_eq!(
        (c.heads, c.head_dim, c.layers, c.intermediate_size),
        (2, 16, 2, 96)
    );
    assert_eq!(c.axes_dims, AXES);
    assert_eq!(
        sd_cli::models::dit::qwen_image_2_1::default_axes_dims(128),
        [16, 56, 56]
    );
    let (f, _) = load(
        "qwen_dit/weights_fused.safetensors",
        "model.diffusion_model.",
        RunOptions::default(),
    );
    assert_eq!(
        f.config().ffn,
        sd_cli::models::dit::qwen_image_2_1::FfnLayout::Fused
    );
    assert_eq!(f.config().intermediate_size, 96);
}

#[test]
fn matches_diffusers_batch1() {
    let (m, r) = model();
    let c = case(&cases(), "b1");
    assert_eq!(c.x.ne, [6, 4, 16, 1]);
    assert_close("b1 full", &run(&m, &r, &c, KvMode::Full), &c.out, TOL);
    let late = case(&cases(), "b1_late");
    assert_close(
        "b1_late full",
        &run(&m, &r, &late, KvMode::Full),
        &late.out,
        TOL,
    );
}

#[test]
fn matches_diffusers_batch2() {
    let (m, r) = model();
    let c = case(&cases(), "b2");
    assert_close("b2 full", &run(&m, &r, &c, KvMode::Full), &c.out, TOL);
}

#[test]
fn matches_diffusers_fused_single_file() {
    let (m, r) = load(
        "qwen_dit/weights_fused.safetensors",
        "model.diffusion_model.",
        RunOptions::default(),
    );
    let c = case(&cases(), "b1");
    assert_close("fused full", &run(&m, &r, &c, KvMode::Full), &c.out, TOL);
}

#[test]
fn flash_attention_close() {
    let (m, _) = model();
    let (_, r) = load(
        "qwen_dit/weights.safetensors",
        "",
        RunOptions {
            flash_attn: true,
            ..RunOptions::default()
        },
    );
    let c = case(&cases(), "b1");
    assert_close("b1 flash", &run(&m, &r, &c, KvMode::Full), &c.out, 2e-3);
}

/// Store, then reuse at a different timestep; `tol_full` bounds both against Full.
fn cache_round_trip(ty: DType, tol_full: f32) {
    let (m, r) = model();
    let store = cases();
    for name in ["b1", "b2"] {
        let c = case(&store, name);
        let key = format!("qwen21.test.{name}");
        let stored = run(&m, &r, &c, KvMode::Store { key: &key, ty });
        assert_close(
            &format!("{name} {ty} store vs diffusers"),
            &stored,
            &c.out,
            tol_full,
        );
        for i in 0..2 {
            let (k, v) = cache_names(&key, i);
            let b = c.x.ne[3];
            assert_eq!(r.cache_info(&k), Some((ty, [32, 5, b, 1])));
            assert_eq!(r.cache_info(&v), Some((ty, [32, 5, b, 1])));
        }
        // Same timestep: reuse repeats the storing call.
        let reused = run(&m, &r, &c, KvMode::Reuse { key: &key });
        assert_close(
            &format!("{name} {ty} reuse vs store"),
            &reused,
            &stored,
            1e-5,
        );
        // Another timestep: reuse vs the full sequence.
        let mut later = case(&store, name);
        later.t = later.t.iter().map(|t| t * 0.5 + 0.1).collect();
        let full = run(&m, &r, &later, KvMode::Full);
        let reused = run(&m, &r, &later, KvMode::Reuse { key: &key });
        let tol = if ty == DType::F32 { 1e-5 } else { tol_full };
        assert_close(&format!("{name} {ty} reuse vs full"), &reused, &full, tol);
        // A Reuse call must not recompute (or need) the text.
        let no_text = {
            let mut err = None;
            let out = r
                .compute(|g| {
                    let inputs = QwenImage21Inputs {
                        latent: g.input_f32("x", later.x.ne, later.x.data.clone()),
                        text: None,
                        timesteps: &later.t,
                        kv: KvMode::Reuse { key: &key },
                        refs: &[],
                        layout: None,
                    };
                    match m.forward(g, &inputs) {
                        Ok(y) => vec![y],
                        Err(e) => {
                            err = Some(e);
                            vec![]
                        }
                    }
                })
                .unwrap();
            assert!(err.is_none());
            out.into_iter().next().unwrap()
        };
        assert_close(
            &format!("{name} {ty} reuse without text"),
            &no_text,
            &reused,
            0.0,
        );
    }
}

#[test]
fn prefix_cache_f32() {
    cache_round_trip(DType::F32, TOL);
}

#[test]
fn prefix_cache_f16() {
    cache_round_trip(DType::F16, 5e-4);
}

#[test]
fn prefix_cache_q8_0() {
    cache_round_trip(DType::Q8_0, 3e-3);
}

#[test]
fn prefix_cache_with_f16_weights() {
    // f16 matmul weights: the cached step must still equal the full one.
    let (m, r) = load_typed(
        "qwen_dit/weights.safetensors",
        "",
        RunOptions::default(),
        Some(DType::F16),
    );
    let c = case(&cases(), "b1");
    let full = run(&m, &r, &c, KvMode::Full);
    assert_close("f16 weights vs diffusers", &full, &c.out, 1e-2);
    let stored = run(
        &m,
        &r,
        &c,
        KvMode::Store {
            key: "w16",
            ty: DType::F32,
        },
    );
    assert_close("f16 weights store vs full", &stored, &full, 1e-6);
    let reused = run(&m, &r, &c, KvMode::Reuse { key: "w16" });
    assert_close("f16 weights reuse vs full", &reused, &full, 1e-6);
}

#[test]
fn text_queries_are_causal() {
    // b1_late differs from b1 only in its last text token: layer 1's text K/V (which depend
    // on layer 0's text attention) must agree on every earlier token.
    let (m, r) = model();
    let store = cases();
    let (a, b) = (case(&store, "b1"), case(&store, "b1_late"));
    run(
        &m,
        &r,
        &a,
        KvMode::Store {
            key: "a",
            ty: DType::F32,
        },
    );
    run(
        &m,
        &r,
        &b,
        KvMode::Store {
            key: "b",
            ty: DType::F32,
        },
    );
    for name in ["1.k", "1.v"] {
        let ka = cache_entry(&r, &format!("a.{name}"));
        let kb = cache_entry(&r, &format!("b.{name}"));
        let d = 32;
        let early = (0..4 * d)
            .map(|i| (ka.data[i] - kb.data[i]).abs())
            .fold(0.0, f32::max);
        let last = (4 * d..5 * d)
            .map(|i| (ka.data[i] - kb.data[i]).abs())
            .fold(0.0, f32::max);
        eprintln!("layer {name}: earlier tokens differ by {early:.2e}, the last by {last:.2e}");
        assert!(
            early <= 1e-6,
            "text token attended to a later one ({early})"
        );
        assert!(last > 1e-3, "the changed token left no trace ({last})");
    }
}

#[test]
fn reuse_without_cache_is_an_error() {
    let (m, r) = model();
    let c = case(&cases(), "b1");
    match try_run(&m, &r, &c, KvMode::Reuse { key: "nothing" }) {
        Err(PrefixCacheError::Missing(name)) => assert_eq!(name, "nothing.0.k"),
        other => panic!(
            "expected a missing-cache error, got {:?}",
            other.map(|t| t.ne)
        ),
    }
}

#[test]
fn cache_types_checked() {
    let (m, _) = model();
    let c = m.config();
    for ok in ["f32", "f16", "bf16", "q8_0", "q4_0"] {
        let ty = DType::from_name(ok).unwrap();
        PrefixCache::new("p", ty, c).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    // q4_K blocks are 256 wide: they do not divide the hidden size 32.
    for bad in ["q4_K", "q8_1", "i32"] {
        let ty = DType::from_name(bad).unwrap();
        match PrefixCache::new("p", ty, c) {
            Err(e @ PrefixCacheError::UnsupportedType { .. }) => eprintln!("{bad}: {e}"),
            _ => panic!("{bad} accepted"),
        }
    }
}

#[test]
fn velocity_driver_stores_reuses_and_restores() {
    let (m, r) = model();
    let store = cases();
    let c = case(&store, "b1");
    let cache = PrefixCache::new("qwen21.prefix", DType::F32, m.config()).unwrap();
    let first = m
        .velocity(&r, &c.x, &c.text, &c.t, Some((&cache, "cond")))
        .unwrap();
    assert_close("driver store", &first, &c.out, TOL);
    assert!(cache.is_complete(&r, m.config(), "cond", 5, 1));
    let bytes = r.cache_bytes();
    assert_eq!(bytes, 2 * cache.bytes_per_layer(m.config(), 5));
    let again = m
        .velocity(&r, &c.x, &c.text, &c.t, Some((&cache, "cond")))
        .unwrap();
    assert_close("driver reuse", &again, &c.out, TOL);
    // A different prompt under the same condition name is stored afresh, not reused.
    let late = case(&store, "b1_late");
    let changed = m
        .velocity(&r, &late.x, &late.text, &late.t, Some((&cache, "cond")))
        .unwrap();
    assert_close("driver changed prompt", &changed, &late.out, TOL);
    assert_eq!(r.cache_bytes(), bytes);
    cache.clear(&r);
    assert_eq!(r.cache_bytes(), 0);
}

#[test]
fn velocity_driver_disables_cache_on_oom() {
    let (m, r) = load(
        "qwen_dit/weights.safetensors",
        "",
        RunOptions {
            memory_budget: Some(1024),
            ..RunOptions::default()
        },
    );
    let c = case(&cases(), "b1");
    let cache = PrefixCache::new("qwen21.prefix", DType::F32, m.config()).unwrap();
    let err = m
        .velocity(&r, &c.x, &c.text, &c.t, Some((&cache, "cond")))
        .unwrap_err();
    assert!(matches!(err, PrefixCacheError::Runner(ref e) if e.is_alloc_failure()));
    assert!(cache.is_disabled());
    assert_eq!(r.cache_bytes(), 0);
}
