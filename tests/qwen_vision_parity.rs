//! Parity of the Qwen3-VL vision tower and the image processor's patchify with transformers.
//! Fixtures: tests/reference/qwen_vision_fixtures.py → tests/fixtures/qwen_vision/ (tiny random
//! `Qwen3VLForConditionalGeneration` vision tower: depth 3, hidden 32, 2 heads, intermediate 48,
//! out 32, 6×6 learned positions, deepstack layers [0, 2]; `Qwen2VLImageProcessorPil` with
//! patch 16, mean/std 0.5, min_pixels 1024).
//!
//! Tolerances: patchify 1e-6 absolute (same f64 rescale / f32 normalise as numpy); the tower
//! 1e-4 · max(1, max |reference|) in f32, for every file layout.

mod common;

use std::collections::BTreeMap;

use common::*;
use sd_cli::models::te::qwen3_vl_vision::{
    encode_image, patchify, qwen3_vl_vision_hparams, smart_resize, Qwen3VlVision,
    Qwen3VlVisionConfig, Qwen3VlVisionSource, VisionError, VisionHparams, VisionPreprocessConfig,
};
use sd_cli::runner::{Runner, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::safetensors::{write_safetensors, SafetensorsItem};
use sd_cli::weights::TensorStore;

const TOL: f32 = 1e-4;
const CASES: [&str; 3] = ["wide", "tall", "odd"];

fn cases() -> TensorStore {
    open_fixture("qwen_vision/cases.safetensors")
}

fn expected_config() -> Qwen3VlVisionConfig {
    Qwen3VlVisionConfig {
        hidden: 32,
        depth: 3,
        heads: 2,
        intermediate: 48,
        patch_size: 16,
        temporal_patch_size: 2,
        merge_size: 2,
        in_channels: 3,
        out_hidden: 32,
        num_position_embeddings: 36,
        deepstack_indexes: vec![0, 2],
        eps: 1e-6,
        rope_theta: 10_000.0,
    }
}

fn load(
    store: &TensorStore,
    hp: &VisionHparams,
) -> Result<(Qwen3VlVision, Runner), sd_cli::runner::RunnerError> {
    let backend = cpu();
    let source = Qwen3VlVisionSource::new(store, "");
    let loader = WeightLoader::new(&source, None);
    let config = Qwen3VlVisionConfig::detect(&loader.root(""), hp)?;
    let model = Qwen3VlVision::new(&loader.root(""), config)?;
    let weights = loader.finish(&backend, "qwen3vl_vision")?;
    Ok((model, runner(Some(weights), backend, false)))
}

fn grid(c: &TensorStore, case: &str) -> (usize, usize) {
    let g = tensor(c, &format!("{case}.grid")).data;
    assert_eq!(g[0], 1.0);
    (g[1] as usize, g[2] as usize)
}

/// Runs every case from the processor's pixel_values and compares all outputs.
fn check_all(model: &Qwen3VlVision, r: &Runner, what: &str) -> f32 {
    let c = cases();
    let mut worst = 0.0f32;
    for case in CASES {
        let pv = tensor(&c, &format!("{case}.pixel_values"));
        let (gh, gw) = grid(&c, case);
        let out = encode_image(r, model, &pv.data, gh, gw).expect("encode");
        let want = tensor(&c, &format!("{case}.embeds"));
        worst = worst.max(assert_close(
            &format!("{what} {case} embeds"),
            &out.embeds,
            &want,
            TOL,
        ));
        assert_eq!(out.deepstack.len(), 2);
        for (j, got) in out.deepstack.iter().enumerate() {
            let want = tensor(&c, &format!("{case}.deepstack{j}"));
            worst = worst.max(assert_close(
                &format!("{what} {case} deepstack{j}"),
                got,
                &want,
                TOL,
            ));
        }
    }
    worst
}

#[test]
fn smart_resize_matches_transformers() {
    let path = fixture_path("qwen_vision/smart_resize.json");
    let rows: Vec<Vec<Option<u64>>> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(rows.len() >= 20);
    for row in rows {
        let [h, w, lo, hi] = [0, 1, 2, 3].map(|i| row[i].unwrap());
        let got = smart_resize(h as usize, w as usize, 32, lo, hi);
        match (row[4], row[5]) {
            (Some(rh), Some(rw)) => {
                assert_eq!(
                    got.unwrap(),
                    (rh as usize, rw as usize),
                    "{h}x{w} [{lo}, {hi}]"
                )
            }
            _ => assert!(
                matches!(got, Err(VisionError::AspectRatio { .. })),
                "{h}x{w}: {got:?}"
            ),
        }
    }
    assert!(smart_resize(0, 5, 32, 1, 2).is_err());
}

#[test]
fn patchify_matches_processor() {
    let c = cases();
    let pre = VisionPreprocessConfig {
        min_pixels: 1024,
        ..Default::default()
    };
    for case in ["wide", "tall"] {
        let rgb = tensor(&c, &format!("{case}.rgb"));
        let [_, width, height, _] = rgb.ne;
        let bytes: Vec<u8> = rgb.data.iter().map(|&v| v as u8).collect();
        assert_eq!(pre.target_size(height, width).unwrap(), (height, width));
        let (patches, g) = pre.patchify(&bytes, width, height).unwrap();
        let (gh, gw) = grid(&c, case);
        assert_eq!(g, [1, gh, gw], "{case}");
        let want = tensor(&c, &format!("{case}.pixel_values"));
        let got = HostTensor::new(want.ne, patches).unwrap();
        let err = max_abs_diff(&got, &want);
        eprintln!("patchify {case}: max abs error {err:.3e}");
        assert!(err <= 1e-6, "{case}: {err}");
    }
    // The resized size of the case the processor had to resize.
    let (gh, gw) = grid(&c, "odd");
    assert_eq!(pre.target_size(45, 100).unwrap(), (gh * 16, gw * 16));
}

#[test]
fn patchify_rejects_bad_input() {
    let pre = VisionPreprocessConfig::default();
    assert!(matches!(
        pre.patchify(&[0; 10], 32, 32),
        Err(VisionError::RgbLength { .. })
    ));
    assert!(matches!(
        pre.patchify(&vec![0; 48 * 32 * 3], 48, 32),
        Err(VisionError::NotPatchAligned { .. })
    ));
    assert!(patchify(&[], 0, 0, [0.5; 3], [0.5; 3], 16, 2, 2, 1.0 / 255.0).is_err());
}

#[test]
fn preprocess_config_from_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("preprocessor_config.json");
    std::fs::write(
        &path,
        r#"{"size": {"longest_edge": 1003520, "shortest_edge": 3136}, "patch_size": 14,
            "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.48, 0.45, 0.4],
            "image_std": [0.26, 0.26, 0.27]}"#,
    )
    .unwrap();
    let p = VisionPreprocessConfig::from_json_file(&path).unwrap();
    assert_eq!(
        (p.patch_size, p.min_pixels, p.max_pixels),
        (14, 3136, 1003520)
    );
    assert_eq!(p.image_mean, [0.48, 0.45, 0.4]);
    assert_eq!(p.factor(), 28);
    std::fs::write(&path, r#"{"image_std": [0, 1, 1]}"#).unwrap();
    assert!(VisionPreprocessConfig::from_json_file(&path).is_err());
    assert!(VisionPreprocessConfig::from_json_file(&dir.path().join("missing.json")).is_err());

    let gguf = TensorStore::open(&fixture_path("qwen_vision/mmproj.gguf")).unwrap();
    let p = VisionPreprocessConfig::default()
        .with_gguf(&gguf.files()[0].gguf)
        .unwrap();
    assert_eq!(p, VisionPreprocessConfig::default());
}

#[test]
fn hf_layout_matches_transformers() {
    let store = open_fixture("qwen_vision/hf");
    assert!(store.contains("model.visual.patch_embed.proj.weight"));
    let hp = qwen3_vl_vision_hparams(&store, "");
    let (model, r) = load(&store, &hp).unwrap();
    assert_eq!(model.config(), &expected_config());
    check_all(&model, &r, "hf");
}

#[test]
fn llamacpp_mmproj_matches_transformers() {
    let store = open_fixture("qwen_vision/mmproj.gguf");
    assert!(store.contains("v.patch_embd.weight.1"));
    assert!(store.contains("v.deepstack.2.fc1.weight"));
    assert!(Qwen3VlVisionSource::new(&store, "").is_llamacpp());
    let hp = qwen3_vl_vision_hparams(&store, "");
    assert_eq!(hp.heads, Some(2));
    assert_eq!(hp.deepstack_indexes, Some(vec![0, 2]));
    let (model, r) = load(&store, &hp).unwrap();
    assert_eq!(model.config(), &expected_config());
    check_all(&model, &r, "mmproj gguf");
}

/// The HF weights renamed to bare `visual.*` names, without a config.json.
fn bare_store(dir: &std::path::Path) -> TensorStore {
    let hf = open_fixture("qwen_vision/hf");
    let mut names = Vec::new();
    let mut datas = Vec::new();
    let mut shapes = Vec::new();
    for info in hf.iter() {
        names.push(info.name.replacen("model.visual.", "visual.", 1));
        datas.push(hf.load_bytes(info).unwrap().into_owned());
        let mut shape: Vec<u64> = info.shape().iter().rev().map(|&d| d as u64).collect();
        if info.name.ends_with("patch_embed.proj.weight") {
            // back to the Conv3d [O, 3, T, P, P]
            shape = vec![32, 3, 2, 16, 16];
        }
        shapes.push(shape);
    }
    let items: Vec<SafetensorsItem<'_>> = (0..names.len())
        .map(|i| SafetensorsItem {
            name: &names[i],
            dtype: "F32",
            shape: &shapes[i],
            data: &datas[i],
        })
        .collect();
    let path = dir.join("visual.safetensors");
    write_safetensors(&path, &BTreeMap::new(), &items).unwrap();
    TensorStore::open(&path).unwrap()
}

#[test]
fn bare_visual_layout_and_missing_hparams() {
    let dir = tempfile::tempdir().unwrap();
    let store = bare_store(dir.path());
    assert!(store.contains("visual.blocks.0.attn.qkv.weight"));
    // Without config.json the tower's deepstack layers are unknown for this depth.
    let hp = qwen3_vl_vision_hparams(&store, "");
    assert_eq!(hp, VisionHparams::default());
    // The default head rule finds no heads of 64 in a width of 32.
    let err = load(&store, &hp)
        .err()
        .expect("needs a head count")
        .to_string();
    assert!(err.contains("heads"), "{err}");
    let hp = VisionHparams {
        heads: Some(2),
        ..Default::default()
    };
    let err = load(&store, &hp)
        .err()
        .expect("needs deepstack layers")
        .to_string();
    assert!(err.contains("deepstack_visual_indexes"), "{err}");
    let hp = qwen3_vl_vision_hparams(&open_fixture("qwen_vision/hf"), "");
    let (model, r) = load(&store, &hp).unwrap();
    check_all(&model, &r, "bare visual.*");
}

#[test]
fn bad_patch_counts_are_errors() {
    let store = open_fixture("qwen_vision/hf");
    let (model, r) = load(&store, &qwen3_vl_vision_hparams(&store, "")).unwrap();
    let dim = model.config().patch_dim();
    for (n, gh, gw) in [(4 * dim - 1, 2, 2), (6 * dim, 3, 2), (0, 0, 0)] {
        let err = encode_image(&r, &model, &vec![0.0; n], gh, gw).unwrap_err();
        assert!(matches!(err, VisionError::PatchCount { .. }), "{err}");
    }
    let empty = TensorStore::new();
    assert!(load(&empty, &VisionHparams::default()).is_err());
}
