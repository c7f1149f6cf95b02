//! Parity of the Qwen2.5-VL vision tower (and the shared image processor path with Qwen2.5-VL's
//! settings) with transformers.
//! Fixtures: tests/reference/qwen25_vision_fixtures.py → tests/fixtures/qwen25_vision/ (tiny
//! random `Qwen2_5_VLForConditionalGeneration` vision tower: depth 3, hidden 32, 2 heads,
//! intermediate 40, out 24, patch 14, window 56 px = 2×2 merged units, full attention in block 1
//! only; images of 140×84 (10×6 patches, partial windows) and 56×112 (4×8 patches)).
//! The ComfyUI single-file layout and a llama.cpp mmproj GGUF are derived here from the
//! transformers weights.
//!
//! Tolerances: the tower 2e-5 · max(1, max |reference|) in f32 for every layout, with the blocked
//! CPU kernels and ggml's own (measured ~1.5e-6), 5e-3 with `--fa` (K/V in f16; measured 8e-4),
//! fed from our own patchify of the RGB images (so the processor path is covered end to end);
//! patchify against the processor's pixel values stored in f16: 2e-3 absolute (f16
//! rounding), which still catches any order or normalisation slip.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::te::qwen25_vl_vision::{
    encode_image, qwen25_vl_preprocess_config, qwen25_vl_vision_hparams, Qwen25VlVision,
    Qwen25VlVisionConfig, Qwen25VlVisionHparams, Qwen25VlVisionSource,
};
use sd_cli::models::te::qwen3_vl_vision::VisionError;
use sd_cli::runner::{Runner, RunnerError, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::safetensors::{write_safetensors, SafetensorsItem};
use sd_cli::weights::{GgufValue, GgufWriter, TensorStore};

const TOL: f32 = 2e-5;
const CASES: [&str; 2] = ["tall", "wide"];
const HIDDEN: usize = 32;
const PATCH: usize = 14;

fn cases() -> TensorStore {
    open_fixture("qwen25_vision/cases.safetensors")
}

fn hf() -> TensorStore {
    open_fixture("qwen25_vision/hf")
}

fn expected_config() -> Qwen25VlVisionConfig {
    Qwen25VlVisionConfig {
        hidden: HIDDEN,
        depth: 3,
        heads: 2,
        intermediate: 40,
        patch_size: PATCH,
        temporal_patch_size: 2,
        merge_size: 2,
        in_channels: 3,
        out_hidden: 24,
        window_size: 56,
        fullatt_block_indexes: vec![1],
        eps: 1e-6,
        rope_theta: 10_000.0,
    }
}

/// The fixture's hparams spelled out, for files without a config.json.
fn fixture_hparams() -> Qwen25VlVisionHparams {
    Qwen25VlVisionHparams {
        heads: Some(2),
        window_size: Some(56),
        fullatt_block_indexes: Some(vec![1]),
        ..Default::default()
    }
}

fn load(
    store: &TensorStore,
    prefix: &str,
    hp: &Qwen25VlVisionHparams,
    blocked: bool,
) -> Result<(Qwen25VlVision, Runner), RunnerError> {
    let backend = cpu();
    let source = Qwen25VlVisionSource::new(store, prefix);
    let loader = WeightLoader::new(&source, None);
    let config = Qwen25VlVisionConfig::detect(&loader.root(""), hp)?;
    let model = Qwen25VlVision::new(&loader.root(""), config)?;
    let weights = loader.finish(&backend, "qwen25vl_vision")?;
    Ok((
        model,
        runner_with_kernels(Some(weights), backend, false, blocked),
    ))
}

/// The case's image as (RGB bytes, width, height); stored as i8 value − 128.
fn rgb(c: &TensorStore, case: &str) -> (Vec<u8>, usize, usize) {
    let t = tensor(c, &format!("{case}.rgb"));
    let [_, width, height, _] = t.ne;
    let bytes = t.data.iter().map(|&v| (v + 128.0) as u8).collect();
    (bytes, width, height)
}

/// Image → our patchify → the tower, against transformers' processor + tower, for every case.
fn check_all(model: &Qwen25VlVision, r: &Runner, what: &str) -> f32 {
    check_all_within(model, r, what, TOL)
}

fn check_all_within(model: &Qwen25VlVision, r: &Runner, what: &str, tol: f32) -> f32 {
    let c = cases();
    let pre = qwen25_vl_preprocess_config();
    let mut worst = 0.0f32;
    for case in CASES {
        let (bytes, width, height) = rgb(&c, case);
        assert_eq!(pre.target_size(height, width).unwrap(), (height, width));
        let (patches, [t, gh, gw]) = pre.patchify(&bytes, width, height).unwrap();
        let grid = tensor(&c, &format!("{case}.grid")).data;
        assert_eq!([t, gh, gw].map(|v| v as f32).to_vec(), grid, "{case}");
        let out = encode_image(r, model, &patches, gh, gw).expect("encode");
        let want = tensor(&c, &format!("{case}.embeds"));
        worst = worst.max(assert_close(
            &format!("{what} {case} embeds"),
            &out,
            &want,
            tol,
        ));
    }
    worst
}

#[test]
fn patchify_matches_processor() {
    let c = cases();
    let (bytes, width, height) = rgb(&c, "wide");
    let (patches, grid) = qwen25_vl_preprocess_config()
        .patchify(&bytes, width, height)
        .unwrap();
    assert_eq!(grid, [1, 4, 8]);
    let want = tensor(&c, "wide.pixel_values");
    assert_eq!(want.ne, [3 * 2 * PATCH * PATCH, 32, 1, 1]);
    let got = HostTensor::new(want.ne, patches).unwrap();
    let err = max_abs_diff(&got, &want);
    eprintln!("patchify wide: max abs error {err:.3e} (f16 reference)");
    assert!(err <= 2e-3, "{err}");
}

#[test]
fn hf_layout_matches_transformers() {
    let store = hf();
    assert!(store.contains("model.visual.patch_embed.proj.weight"));
    let hp = qwen25_vl_vision_hparams(&store, "");
    assert_eq!(hp.heads, Some(2));
    assert_eq!(hp.window_size, Some(56));
    assert_eq!(hp.fullatt_block_indexes, Some(vec![1]));
    let (model, r) = load(&store, "", &hp, true).unwrap();
    assert_eq!(model.config(), &expected_config());
    check_all(&model, &r, "hf");
    // ggml's own kernels (CPUs without AVX-512 run these).
    let (model, r) = load(&store, "", &hp, false).unwrap();
    check_all(&model, &r, "hf, ggml kernels");
    // `--fa`: ggml's fused kernel with K/V in f16 (and the window mask in f16).
    let backend = cpu();
    let source = Qwen25VlVisionSource::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let model = Qwen25VlVision::new(&loader.root(""), expected_config()).unwrap();
    let weights = loader.finish(&backend, "qwen25vl_vision").unwrap();
    let r = runner_with_kernels(Some(weights), backend, true, false);
    check_all_within(&model, &r, "hf, flash attention", 5e-3);
}

/// The fixture's windows change the result: a tower that ignored them would fail the parity.
#[test]
fn windows_matter() {
    let store = hf();
    let hp = Qwen25VlVisionHparams {
        window_size: Some(112), // one window for 56×112 and 2×1 for 140×84
        ..qwen25_vl_vision_hparams(&store, "")
    };
    let (model, r) = load(&store, "", &hp, true).unwrap();
    let c = cases();
    for case in CASES {
        let (bytes, width, height) = rgb(&c, case);
        let (patches, [_, gh, gw]) = qwen25_vl_preprocess_config()
            .patchify(&bytes, width, height)
            .unwrap();
        let out = encode_image(&r, &model, &patches, gh, gw).unwrap();
        let err = max_abs_diff(&out, &tensor(&c, &format!("{case}.embeds")));
        assert!(err > 1e-2, "{case}: {err}");
    }
}

/// The transformers weights as ComfyUI's single text-encoder file keeps them: `visual.*` with
/// the Conv3d kept 5-D, next to language-model tensors, no config.json. `skip` leaves out one
/// tensor (by transformers name relative to `visual.`).
fn comfy_store(dir: &Path, skip: Option<&str>) -> TensorStore {
    let hf = hf();
    let mut names = Vec::new();
    let mut datas = Vec::new();
    let mut shapes = Vec::new();
    for info in hf.iter() {
        let local = info.name.strip_prefix("model.visual.").unwrap();
        if Some(local) == skip {
            continue;
        }
        names.push(format!("visual.{local}"));
        datas.push(hf.load_bytes(info).unwrap().into_owned());
        let mut shape: Vec<u64> = info.shape().iter().rev().map(|&d| d as u64).collect();
        if local == "patch_embed.proj.weight" {
            shape = vec![HIDDEN as u64, 3, 2, PATCH as u64, PATCH as u64];
        }
        shapes.push(shape);
    }
    // A language-model tensor, as in the real file.
    names.push("model.embed_tokens.weight".into());
    datas.push(vec![0u8; 4 * 24 * 8]);
    shapes.push(vec![8, 24]);
    let items: Vec<SafetensorsItem<'_>> = (0..names.len())
        .map(|i| SafetensorsItem {
            name: &names[i],
            dtype: "F32",
            shape: &shapes[i],
            data: &datas[i],
        })
        .collect();
    let path = dir.join("qwen_2.5_vl_tiny.safetensors");
    write_safetensors(&path, &BTreeMap::new(), &items).unwrap();
    TensorStore::open(&path).unwrap()
}

#[test]
fn comfyui_single_file_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let store = comfy_store(dir.path(), None);
    assert!(store.contains("visual.blocks.0.mlp.gate_proj.weight"));
    // No config.json: the released defaults do not fit this tower.
    let hp = qwen25_vl_vision_hparams(&store, "");
    assert_eq!(hp, Qwen25VlVisionHparams::default());
    let err = load(&store, "", &hp, true)
        .err()
        .expect("heads")
        .to_string();
    assert!(err.contains("heads"), "{err}");
    let hp2 = Qwen25VlVisionHparams {
        heads: Some(2),
        ..Default::default()
    };
    let err = load(&store, "", &hp2, true)
        .err()
        .expect("fullatt")
        .to_string();
    assert!(err.contains("fullatt_block_indexes"), "{err}");

    let (model, r) = load(&store, "", &fixture_hparams(), true).unwrap();
    assert_eq!(model.config(), &expected_config());
    check_all(&model, &r, "comfyui visual.*");
}

/// llama.cpp's mmproj name of a transformers tensor (relative to `visual.`), with the q/k/v
/// split and the Conv3d split per frame done by the caller.
fn llamacpp_name(local: &str) -> String {
    match local {
        "merger.ln_q.weight" => return "v.post_ln.weight".into(),
        "patch_embed.proj.weight" => return "v.patch_embd.weight".into(),
        _ => {}
    }
    if let Some(rest) = local.strip_prefix("merger.mlp.") {
        return format!("mm.{rest}");
    }
    let rest = local.strip_prefix("blocks.").unwrap();
    let (i, tail) = rest.split_once('.').unwrap();
    let (module, leaf) = tail.rsplit_once('.').unwrap();
    let short = match module {
        "norm1" => "ln1",
        "norm2" => "ln2",
        "attn.proj" => "attn_out",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("unexpected tensor {other}"),
    };
    format!("v.blk.{i}.{short}.{leaf}")
}

/// The fixture as llama.cpp's convert_hf_to_gguf.py writes a Qwen2.5-VL mmproj: q/k/v split,
/// the Conv3d as one 2-D kernel per frame, window pattern as `n_wa_pattern`, all f32.
fn mmproj_store(dir: &Path) -> TensorStore {
    let hf = hf();
    let mut w = GgufWriter::new();
    let kv = |w: &mut GgufWriter, k: &str, v: GgufValue| w.add_kv(k, v).unwrap();
    kv(
        &mut w,
        "general.architecture",
        GgufValue::String("clip".into()),
    );
    kv(
        &mut w,
        "clip.projector_type",
        GgufValue::String("qwen2.5vl_merger".into()),
    );
    kv(
        &mut w,
        "clip.vision.attention.head_count",
        GgufValue::U32(2),
    );
    kv(&mut w, "clip.vision.patch_size", GgufValue::U32(14));
    kv(&mut w, "clip.vision.window_size", GgufValue::U32(56));
    kv(&mut w, "clip.vision.n_wa_pattern", GgufValue::U32(2));
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut add = |w: &mut GgufWriter, name: &str, ne: &[usize], values: &[f32]| {
        let ne: Vec<u64> = ne.iter().map(|&d| d as u64).collect();
        w.add_tensor(name, DType::F32, &ne).unwrap();
        data.push(values.iter().flat_map(|v| v.to_le_bytes()).collect());
    };
    for info in hf.iter() {
        let local = info.name.strip_prefix("model.visual.").unwrap();
        let values = hf.to_f32(info).unwrap();
        let ne = &info.ne[..info.n_dims];
        if local == "patch_embed.proj.weight" {
            // [O, 3, T, P, P] → per frame [O, 3, P, P] (ggml [P, P, 3, O]).
            let plane = PATCH * PATCH;
            for t in 0..2 {
                let frame: Vec<f32> = values
                    .chunks_exact(2 * plane)
                    .flat_map(|oc| oc[t * plane..(t + 1) * plane].to_vec())
                    .collect();
                let name = ["v.patch_embd.weight", "v.patch_embd.weight.1"][t];
                add(&mut w, name, &[PATCH, PATCH, 3, HIDDEN], &frame);
            }
        } else if let Some(rest) = local.strip_prefix("blocks.") {
            if let Some((i, leaf)) = rest.split_once(".attn.qkv.") {
                let third = values.len() / 3;
                for (j, p) in ["attn_q", "attn_k", "attn_v"].iter().enumerate() {
                    let mut part_ne = ne.to_vec();
                    *part_ne.last_mut().unwrap() /= 3;
                    let slice = &values[j * third..(j + 1) * third];
                    add(&mut w, &format!("v.blk.{i}.{p}.{leaf}"), &part_ne, slice);
                }
            } else {
                add(&mut w, &llamacpp_name(local), ne, &values);
            }
        } else {
            add(&mut w, &llamacpp_name(local), ne, &values);
        }
    }
    let path = dir.join("mmproj-qwen25vl-tiny.gguf");
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    w.write(&path, &refs).unwrap();
    TensorStore::open(&path).unwrap()
}

#[test]
fn llamacpp_mmproj_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let store = mmproj_store(dir.path());
    assert!(store.contains("v.patch_embd.weight.1"));
    assert!(store.contains("v.blk.0.attn_q.weight"));
    assert!(Qwen25VlVisionSource::new(&store, "").is_llamacpp());
    let hp = qwen25_vl_vision_hparams(&store, "");
    assert_eq!(hp.heads, Some(2));
    assert_eq!(hp.window_size, Some(56));
    assert_eq!(hp.n_wa_pattern, Some(2));
    let (model, r) = load(&store, "", &hp, true).unwrap();
    assert_eq!(model.config(), &expected_config());
    check_all(&model, &r, "mmproj gguf");
}

#[test]
fn missing_tensor_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = comfy_store(dir.path(), Some("blocks.2.mlp.up_proj.weight"));
    match load(&store, "", &fixture_hparams(), true) {
        Err(RunnerError::MissingTensor { key, .. }) => {
            assert_eq!(key, "blocks.2.mlp.up_proj.weight")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("loaded without blocks.2.mlp.up_proj.weight"),
    }
    let store = comfy_store(dir.path(), Some("merger.mlp.2.weight"));
    let err = load(&store, "", &fixture_hparams(), true).err().unwrap();
    assert!(
        matches!(&err, RunnerError::MissingTensor { key, .. } if key == "merger.mlp.2.weight"),
        "{err}"
    );
    let empty = TensorStore::new();
    assert!(load(&empty, "", &fixture_hparams(), true).is_err());
}

#[test]
fn bad_hparams_and_patch_counts_are_errors() {
    let store = hf();
    // Indexes past the depth are never reached (transformers) and are dropped.
    let past = Qwen25VlVisionHparams {
        fullatt_block_indexes: Some(vec![1, 7, 15]),
        ..qwen25_vl_vision_hparams(&store, "")
    };
    let (m, _) = load(&store, "", &past, true).unwrap();
    assert_eq!(m.config().fullatt_block_indexes, vec![1]);
    let tiny_window = Qwen25VlVisionHparams {
        window_size: Some(20),
        ..qwen25_vl_vision_hparams(&store, "")
    };
    let err = load(&store, "", &tiny_window, true)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("window"), "{err}");

    let (model, r) = load(&store, "", &qwen25_vl_vision_hparams(&store, ""), true).unwrap();
    let dim = model.config().patch_dim();
    for (n, gh, gw) in [(4 * dim - 1, 2, 2), (6 * dim, 3, 2), (0, 0, 0)] {
        let err = encode_image(&r, &model, &vec![0.0; n], gh, gw).unwrap_err();
        assert!(matches!(err, VisionError::PatchCount { .. }), "{err}");
    }
}
