//! The runner's contracts: weight declaration errors, memory budget, named cache, --type
//! conversion on load.

mod common;

use std::rc::Rc;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::ggml::Backend;
use sd_cli::nn::Linear;
use sd_cli::runner::{MemorySource, RunOptions, Runner, RunnerError, Storage, WeightLoader};

fn source() -> MemorySource {
    let mut s = MemorySource::new();
    s.insert(
        "lin.weight",
        [64, 32, 1, 1],
        (0..64 * 32)
            .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
            .collect(),
    );
    s.insert(
        "lin.bias",
        [32, 1, 1, 1],
        (0..32).map(|i| i as f32 / 32.0).collect(),
    );
    s
}

#[test]
fn declaration_errors_name_the_key() {
    let src = source();
    let loader = WeightLoader::new(&src, None);
    let wb = loader.root("");
    let e = Linear::new(&wb.pp("missing"), 64, 32, true).unwrap_err();
    assert!(
        matches!(e, RunnerError::MissingTensor { ref key, .. } if key == "missing.weight"),
        "{e}"
    );
    let e = Linear::new(&wb.pp("lin"), 32, 64, true).unwrap_err();
    assert!(
        matches!(e, RunnerError::ShapeMismatch { ref key, .. } if key == "lin.weight"),
        "{e}"
    );
    assert!(e.to_string().contains("lin.weight"));
}

fn run_linear(budget: Option<usize>, wtype: Option<DType>) -> Result<Vec<f32>, RunnerError> {
    let src = source();
    let backend = Rc::new(Backend::cpu(1)?);
    let loader = WeightLoader::new(&src, wtype);
    let lin = Linear::new(&loader.root("lin"), 64, 32, true)?;
    let weights = loader.finish(&backend, "lin")?;
    let opts = RunOptions {
        memory_budget: budget,
        ..RunOptions::default()
    };
    let runner = Runner::new("lin", backend, Some(weights), opts);
    let x: Vec<f32> = (0..64 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
    let out =
        runner.compute(|g| vec![lin.forward(g, g.input_f32("x", [64, 3, 1, 1], x.clone()))])?;
    Ok(out.into_iter().next().unwrap().data)
}

#[test]
fn memory_budget_fails_like_device_oom() {
    let full = run_linear(None, None).unwrap();
    let within = run_linear(Some(64 << 20), None).unwrap();
    assert_eq!(full, within);
    let e = run_linear(Some(1024), None).unwrap_err();
    assert!(e.is_alloc_failure(), "{e}");
}

#[test]
fn type_conversion_on_load_stays_close() {
    let full = run_linear(None, None).unwrap();
    for ty in [DType::F16, DType::BF16, DType::Q8_0] {
        let q = run_linear(None, Some(ty)).unwrap();
        let err = full
            .iter()
            .zip(&q)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 0.05, "{ty}: {err}");
    }
}

#[test]
fn named_cache_persists_between_calls() {
    let runner = Runner::new("cache", cpu(), None, RunOptions::default());
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    runner
        .compute(|g| {
            let x = g.input_f32("x", [4, 3, 1, 1], data.clone());
            let y = g.scale(x, 2.0);
            g.cache_store("kv.0", y);
            vec![y]
        })
        .unwrap();
    assert!(runner.cache_bytes() >= 48);
    let out = runner
        .compute(|g| {
            let cached = g.cache_get("kv.0").expect("cached tensor");
            vec![g.add(cached, g.input_f32("one", [4, 3, 1, 1], vec![1.0; 12]))]
        })
        .unwrap();
    let want: Vec<f32> = data.iter().map(|v| v * 2.0 + 1.0).collect();
    assert_eq!(out[0].data, want);
    runner.clear_cache("kv.");
    assert_eq!(runner.cache_bytes(), 0);
    let missing = runner.compute(|g| {
        vec![g
            .cache_get("kv.0")
            .unwrap_or_else(|| g.arange(0.0, 1.0, 1.0))]
    });
    assert_eq!(missing.unwrap()[0].data, vec![0.0]);
}

/// A graph's stores are copied on the device into destinations that share one buffer, in
/// the storage type asked for; the buffer goes when the last of its entries does.
#[test]
fn cache_stores_are_device_copies_sharing_one_buffer() {
    let runner = Runner::new("cache", cpu(), None, RunOptions::default());
    let data: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
    runner
        .compute(|g| {
            let x = g.input_f32("x", [32, 2, 1, 1], data.clone());
            let k = g.cache_store("kv.k", g.scale(x, 2.0));
            let v = g.cache_store_as("kv.v", x, DType::F16);
            let q = g.cache_store_as("kv.q", x, DType::Q8_0);
            // The stored copies are readable in the graph that made them.
            vec![g.add(k, g.cast(v, DType::F32)), g.cast(q, DType::F32)]
        })
        .unwrap();
    assert_eq!(runner.cache_info("kv.k"), Some((DType::F32, [32, 2, 1, 1])));
    assert_eq!(runner.cache_info("kv.v"), Some((DType::F16, [32, 2, 1, 1])));
    assert_eq!(
        runner.cache_info("kv.q"),
        Some((DType::Q8_0, [32, 2, 1, 1]))
    );
    let one_buffer = runner.cache_bytes();
    assert!(
        (256 + 128 + 68..256 + 128 + 68 + 1024).contains(&one_buffer),
        "{one_buffer}"
    );
    let out = runner
        .compute(|g| {
            let k = g.cache_get("kv.k").unwrap();
            let v = g.cache_get("kv.v").unwrap();
            vec![g.sub(k, g.cast(v, DType::F32))]
        })
        .unwrap();
    // data is exact in f16: k − v = 2x − x.
    assert_eq!(out[0].data, data);
    runner.clear_cache("kv.k");
    runner.clear_cache("kv.v");
    assert_eq!(
        runner.cache_bytes(),
        one_buffer,
        "kv.q still holds the buffer"
    );
    runner.clear_cache("kv.");
    assert_eq!(runner.cache_bytes(), 0);
}

#[test]
fn storage_f32_converts_half_weights() {
    let src = source();
    let backend = Rc::new(Backend::cpu(1).unwrap());
    let loader = WeightLoader::new(&src, Some(DType::Q8_0));
    let wb = loader.root("lin");
    // Biases stay f32 even when --type asks for a quantized type.
    let b = wb.get("bias", [32, 1, 1, 1], Storage::F32).unwrap();
    let w = loader.finish(&backend, "t").unwrap();
    assert_eq!(w.tensor(b).ty(), DType::F32);
}
