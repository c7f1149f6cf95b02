//! Parity of the Qwen Image 2.1 transformer with condition images in the prefix (editing)
//! against diffusers `QwenImage21Transformer2DModel`, with and without the prefix cache.
//! Fixtures: tests/reference/qwen_dit_fixtures.py → tests/fixtures/qwen_dit/cases_refs.safetensors
//! (the tiny model of qwen_dit_parity.rs; `r1`: one 4×4 condition latent between text rows,
//! `r2`: a 2×4 and a 4×2 one with text between; target 6×4 (W×H), t = 0.63, then a cached
//! call at t = 0.2 checked against diffusers' full sequence at t = 0.2).
//! Tolerance: 1e-4 × max(1, max |reference|) in f32 (as the text-only parity test).

mod common;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::dit::qwen_image_2_1::{
    Condition, PrefixCache, PrefixCacheError, PrefixLayout, QwenImage21, QwenImage21Config,
};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const TOL: f32 = 1e-4;

fn model() -> (QwenImage21, Runner) {
    let backend = cpu();
    let store = open_fixture("qwen_dit/weights.safetensors");
    let source = StoreSource::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config = QwenImage21Config::detect(&loader.root("")).unwrap();
    let model = QwenImage21::new(&loader.root(""), config).unwrap();
    let weights = loader.finish(&backend, "qwen21").unwrap();
    let runner = Runner::new("qwen21", backend, Some(weights), RunOptions::default());
    (model, runner)
}

struct RefCase {
    x: HostTensor,
    text: HostTensor,
    refs: Vec<HostTensor>,
    layout: PrefixLayout,
    out: HostTensor,
    out_late: HostTensor,
}

fn case(name: &str, refs: usize) -> RefCase {
    let store: TensorStore = open_fixture("qwen_dit/cases_refs.safetensors");
    let refs: Vec<HostTensor> = (0..refs)
        .map(|i| tensor(&store, &format!("{name}.ref{i}")))
        .collect();
    let pads: Vec<bool> = tensor(&store, &format!("{name}.pads"))
        .data
        .iter()
        .map(|&p| p > 0.5)
        .collect();
    let sizes: Vec<(usize, usize)> = refs.iter().map(|r| (r.ne[1], r.ne[0])).collect();
    RefCase {
        x: tensor(&store, &format!("{name}.x")),
        text: tensor(&store, &format!("{name}.text")),
        layout: PrefixLayout::from_pad_mask(&pads, &sizes).unwrap(),
        refs,
        out: tensor(&store, &format!("{name}.out")),
        out_late: tensor(&store, &format!("{name}.out_t02")),
    }
}

fn check(name: &str, refs: usize, ty: DType, tol_cached: f32) {
    let (m, r) = model();
    let c = case(name, refs);
    let cond = Condition {
        text: &c.text,
        refs: &c.refs,
        layout: Some(&c.layout),
    };
    let full = m.velocity_for(&r, &c.x, &cond, &[0.63], None).unwrap();
    assert_close(&format!("{name} full"), &full, &c.out, TOL);
    let late = m.velocity_for(&r, &c.x, &cond, &[0.2], None).unwrap();
    assert_close(&format!("{name} full t=0.2"), &late, &c.out_late, TOL);

    let cache = PrefixCache::new("qwen21.prefix", ty, m.config()).unwrap();
    let stored = m
        .velocity_for(&r, &c.x, &cond, &[0.63], Some((&cache, "cond")))
        .unwrap();
    assert_close(&format!("{name} store {ty}"), &stored, &c.out, tol_cached);
    assert!(cache.is_complete(&r, m.config(), "cond", c.layout.len(), 1));
    let reused = m
        .velocity_for(&r, &c.x, &cond, &[0.2], Some((&cache, "cond")))
        .unwrap();
    assert_close(
        &format!("{name} reuse {ty}"),
        &reused,
        &c.out_late,
        tol_cached,
    );
}

#[test]
fn one_condition_image_matches_diffusers() {
    check("r1", 1, DType::F32, TOL);
}

#[test]
fn two_condition_images_match_diffusers() {
    check("r2", 2, DType::F32, TOL);
}

#[test]
fn two_condition_images_f16_cache() {
    // f16 K/V storage rounds the prefix: 5e-4 as in the text-only cache test.
    check("r2", 2, DType::F16, 5e-4);
}

#[test]
fn wrong_reference_count_or_size_is_an_error() {
    let (m, r) = model();
    let c = case("r2", 2);
    let one = Condition {
        text: &c.text,
        refs: &c.refs[..1],
        layout: Some(&c.layout),
    };
    let err = m.velocity_for(&r, &c.x, &one, &[0.5], None).unwrap_err();
    assert!(matches!(err, PrefixCacheError::Inputs(_)), "{err}");
    let swapped = [c.refs[1].clone(), c.refs[0].clone()];
    let bad = Condition {
        text: &c.text,
        refs: &swapped,
        layout: Some(&c.layout),
    };
    let err = m.velocity_for(&r, &c.x, &bad, &[0.5], None).unwrap_err();
    assert!(err.to_string().contains("reference latent 1"), "{err}");
}
