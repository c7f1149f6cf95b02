//! Parity of the CLIP vision encoder with transformers' `CLIPVisionModel` /
//! `CLIPVisionModelWithProjection`, and of its preprocessing with stable-diffusion.cpp's
//! `clip_preprocess`. Fixtures: tests/reference/clip_vision_fixtures.py →
//! tests/fixtures/clip_vision/ (two tiny random towers, weights stored in f16):
//! - `h`: gelu, hidden 48, 3 heads from config.json (head size 16), 3 layers, patch 4, image
//!   32 (65 tokens), projection 24 — `vision_model.*` names;
//! - `l`: quick_gelu, hidden 32, 2 heads, 2 layers, patch 4, image 8, eps 1e-6, no projection
//!   — bare names, as transformers 5 saves `CLIPVisionModel`.
//!
//! Tolerances (max abs error ≤ tol · max(1, max |reference|); measured in brackets):
//! - the weights widened to f32 (the reference ran in f32 on the f16-rounded values): 2e-5
//!   [h 2.1e-6, l 1.7e-6; ~4e-7 of the output scale], on the blocked CPU kernels and on
//!   ggml's own kernels;
//! - `--fa` (K/V in f16): 2e-3 [7.4e-4];
//! - the f16 weights as stored (activations meet f16 weights in the matmuls): 5e-3 [2.7e-3];
//! - the OpenCLIP layout (derived here by the map the fixture script checks against
//!   open_clip) and a stable-diffusion.cpp-style GGUF (fused in_proj, `pre_layernorm`,
//!   `clip_vision.` prefix) give bit-identical results to the transformers folder;
//! - preprocessing against a numpy re-implementation of upstream's f32 arithmetic: exact.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::te::clip::ClipActivation;
use sd_cli::models::te::clip_vision::{
    clip_vision_preprocess, encode, encode_hidden, ClipVisionConfig, ClipVisionEncoded,
    ClipVisionHidden, ClipVisionHparams, ClipVisionLayout, ClipVisionModel, ClipVisionOutputs,
    ClipVisionPooled, ClipVisionSource, WAN_CLIP_SKIP,
};
use sd_cli::runner::{
    convert_f32, LoadOptions, Loaded, MemoryOptions, RunOptions, Runner, RunnerError, WeightLoader,
};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::safetensors::{write_safetensors, SafetensorsItem};
use sd_cli::weights::{GgufWriter, TensorStore};

const TOL: f32 = 2e-5;
const TOL_FA: f32 = 2e-3;
const TOL_F16: f32 = 5e-3;

fn cases() -> TensorStore {
    open_fixture("clip_vision/cases.safetensors")
}

/// Tower h's folder as stored: f16 weights and config.json.
fn h_store() -> TensorStore {
    open_fixture("clip_vision/h")
}

/// A fixture folder with every tensor widened to f32 (what the reference ran on) and its
/// config.json beside it, in a temporary folder that lives as long as the store.
struct F32Folder {
    store: TensorStore,
    _dir: tempfile::TempDir,
}

fn f32_folder(name: &str) -> F32Folder {
    let src = open_fixture(&format!("clip_vision/{name}"));
    let dir = tempfile::tempdir().unwrap();
    let items: Vec<Item> = src
        .iter()
        .map(|info| {
            let shape = info.shape().iter().rev().map(|&d| d as u64).collect();
            (info.name.clone(), shape, src.to_f32(info).unwrap())
        })
        .collect();
    write_st(&dir.path().join("model.safetensors"), &items);
    let config = fixture_path(&format!("clip_vision/{name}/config.json"));
    std::fs::copy(config, dir.path().join("config.json")).unwrap();
    let store = TensorStore::open(dir.path()).unwrap();
    assert!(store.files()[0].config.is_some());
    F32Folder { store, _dir: dir }
}

/// A [n, hidden] (PyTorch) reference as ggml [hidden, n]; a vector as [len, 1].
fn reference(c: &TensorStore, name: &str) -> HostTensor {
    let t = tensor(c, name);
    HostTensor::new([t.ne[0], t.ne[1], 1, 1], t.data).unwrap()
}

/// The case's input [1, 3, S, S] (PyTorch) as ggml [S, S, 3, 1].
fn pixels(c: &TensorStore, tag: &str) -> HostTensor {
    let t = tensor(c, &format!("{tag}.pixels"));
    HostTensor::new([t.ne[0], t.ne[1], t.ne[2], 1], t.data).unwrap()
}

struct Tower {
    model: ClipVisionModel,
    runner: Runner,
    layout: ClipVisionLayout,
}

fn hparams(store: &TensorStore, prefix: &str, fallback: ClipActivation) -> ClipVisionHparams {
    ClipVisionHparams::new(fallback)
        .with_store_config(store, prefix)
        .expect("config.json")
}

fn try_load(
    store: &TensorStore,
    prefix: &str,
    hp: &ClipVisionHparams,
    wtype: Option<DType>,
    options: RunOptions,
) -> Result<Tower, RunnerError> {
    let backend = cpu();
    let source = ClipVisionSource::new(store, prefix);
    let layout = source.layout();
    let hp = hp.clone().with_openclip_layout(layout.is_openclip());
    let loader = WeightLoader::new(&source, wtype);
    let config = ClipVisionConfig::detect(&loader.root(""), &hp)?;
    let model = ClipVisionModel::new(&loader.root(""), config)?;
    let weights = loader.finish(&backend, "clip_vision")?;
    Ok(Tower {
        model,
        runner: Runner::new("clip_vision", backend, Some(weights), options),
        layout,
    })
}

fn kernels(flash_attn: bool, blocked: bool) -> RunOptions {
    RunOptions {
        flash_attn,
        blocked_kernels: blocked,
        ..RunOptions::default()
    }
}

/// The tower on the blocked CPU kernels, weights in the file's types.
fn load_f32(store: &TensorStore, prefix: &str, hp: &ClipVisionHparams) -> Tower {
    try_load(store, prefix, hp, None, kernels(false, true)).expect("load")
}

/// Every reference output of tower `tag`, as (name, ours): `hidden_states[-2]` and the last
/// hidden state (with the pooled output from the same graph), the pooled output alone, and
/// the projected one when the tower has a projection.
fn run_all(t: &Tower, tag: &str) -> Vec<(String, HostTensor)> {
    let c = cases();
    let px = pixels(&c, tag);
    let layers = t.model.config().layers;
    let run = |want: ClipVisionOutputs| -> ClipVisionEncoded {
        encode(&t.runner, &t.model, &px, &want).expect("encode")
    };
    let mut outs = Vec::new();
    let both = run(ClipVisionOutputs {
        hidden: Some(ClipVisionHidden {
            layers: layers - 1,
            post_norm: false,
        }),
        pooled: Some(ClipVisionPooled {
            layers,
            project: false,
        }),
    });
    outs.push((format!("{tag}.hidden_m2"), both.hidden.unwrap()));
    outs.push((format!("{tag}.pooled"), both.pooled.unwrap()));
    let last = encode_hidden(&t.runner, &t.model, &px, layers).expect("encode");
    outs.push((format!("{tag}.last"), last));
    if t.model.has_projection() {
        let p = run(ClipVisionOutputs {
            hidden: None,
            pooled: Some(ClipVisionPooled {
                layers,
                project: true,
            }),
        });
        outs.push((format!("{tag}.image_embeds"), p.pooled.unwrap()));
    }
    outs
}

fn check(outs: &[(String, HostTensor)], tol: f32, what: &str) -> f32 {
    let c = cases();
    outs.iter()
        .map(|(name, got)| assert_close(&format!("{what} {name}"), got, &reference(&c, name), tol))
        .fold(0.0, f32::max)
}

fn assert_identical(a: &[(String, HostTensor)], b: &[(String, HostTensor)], what: &str) {
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(b) {
        assert_eq!(x.ne, y.ne, "{what} {name}");
        assert!(x.data == y.data, "{what} {name}: layouts disagree");
    }
}

fn h_config() -> ClipVisionConfig {
    ClipVisionConfig {
        hidden: 48,
        heads: 3,
        intermediate: 72,
        layers: 3,
        channels: 3,
        patch_size: 4,
        image_size: 32,
        act: ClipActivation::Gelu,
        eps: 1e-5,
        projection_dim: Some(24),
    }
}

#[test]
fn configs_detected_from_weights_and_config_json() {
    let store = h_store();
    let t = load_f32(&store, "", &hparams(&store, "", ClipActivation::QuickGelu));
    assert_eq!(t.layout, ClipVisionLayout::Hf("vision_model."));
    assert_eq!(t.model.config(), &h_config());
    assert_eq!(t.model.config().tokens(), 65);

    let F32Folder { store, _dir } = f32_folder("l");
    let t = load_f32(&store, "", &hparams(&store, "", ClipActivation::Gelu));
    assert_eq!(t.layout, ClipVisionLayout::Hf(""));
    let want = ClipVisionConfig {
        hidden: 32,
        heads: 2,
        intermediate: 40,
        layers: 2,
        channels: 3,
        patch_size: 4,
        image_size: 8,
        act: ClipActivation::QuickGelu,
        eps: 1e-6,
        projection_dim: None,
    };
    assert_eq!(t.model.config(), &want);
    assert!(!t.model.has_projection());
}

#[test]
fn h_matches_transformers() {
    let F32Folder { store, _dir } = f32_folder("h");
    let hp = hparams(&store, "", ClipActivation::Gelu);
    let t = load_f32(&store, "", &hp);
    let err = check(&run_all(&t, "h"), TOL, "h f32");
    eprintln!("h f32 (blocked kernels): max abs error {err:.3e}");
    // ggml's own kernels (CPUs without AVX-512 run these).
    let t = try_load(&store, "", &hp, None, kernels(false, false)).unwrap();
    check(&run_all(&t, "h"), TOL, "h f32 ggml kernels");
    // `--fa`: K/V in f16.
    let t = try_load(&store, "", &hp, None, kernels(true, false)).unwrap();
    check(&run_all(&t, "h"), TOL_FA, "h flash attention");
}

#[test]
fn h_f16_weights_as_stored() {
    let store = h_store();
    let hp = hparams(&store, "", ClipActivation::Gelu);
    for blocked in [true, false] {
        let t = try_load(&store, "", &hp, None, kernels(false, blocked)).unwrap();
        check(
            &run_all(&t, "h"),
            TOL_F16,
            &format!("h f16 blocked={blocked}"),
        );
    }
}

#[test]
fn l_quick_gelu_bare_names_match_transformers() {
    let F32Folder { store, _dir } = f32_folder("l");
    let t = load_f32(&store, "", &hparams(&store, "", ClipActivation::Gelu));
    let err = check(&run_all(&t, "l"), TOL, "l f32");
    eprintln!("l f32: max abs error {err:.3e}");
    // No projection in the file: asking for one is an error naming it.
    let px = pixels(&cases(), "l");
    let want = ClipVisionOutputs {
        hidden: None,
        pooled: Some(ClipVisionPooled {
            layers: 2,
            project: true,
        }),
    };
    match encode(&t.runner, &t.model, &px, &want) {
        Err(RunnerError::MissingTensor { key, .. }) => assert_eq!(key, "visual_projection.weight"),
        other => panic!("expected a missing projection, got {other:?}"),
    }
}

#[test]
fn wan_request_is_upstream_rule() {
    // stable-diffusion.cpp's Wan I2V call (`clip_skip` -2, not pooled): every layer, no
    // post_layernorm — transformers' `last_hidden_state`, not `hidden_states[-2]`.
    let F32Folder { store, _dir } = f32_folder("h");
    let t = load_f32(&store, "", &hparams(&store, "", ClipActivation::Gelu));
    let want = ClipVisionOutputs::wan_i2v(t.model.config());
    assert_eq!(want, ClipVisionOutputs::upstream(3, false, WAN_CLIP_SKIP));
    let c = cases();
    let out = encode(&t.runner, &t.model, &pixels(&c, "h"), &want).unwrap();
    let hidden = out.hidden.unwrap();
    assert_eq!(hidden.ne, [48, 65, 1, 1]);
    assert_close("wan", &hidden, &reference(&c, "h.last"), TOL);
    assert!(out.pooled.is_none());
}

#[test]
fn runner_load_and_hidden_layers_with_post_norm() {
    // The loading path a pipeline takes, and the remaining output options: the embeddings
    // (0 layers) and post_layernorm over every token, checked against the pooled reference
    // at the class token.
    let F32Folder { store, _dir } = f32_folder("h");
    let hp = hparams(&store, "", ClipActivation::Gelu);
    let source = ClipVisionSource::new(&store, "");
    let opts = LoadOptions {
        backend: cpu(),
        wtype: None,
        run: RunOptions::default(),
        adapters: None,
    };
    let Loaded { model, runner } = Runner::load("clip_vision", &source, opts, |wb| {
        ClipVisionModel::new(wb, ClipVisionConfig::detect(wb, &hp)?)
    })
    .unwrap();
    let c = cases();
    let px = pixels(&c, "h");
    let want = ClipVisionOutputs {
        hidden: Some(ClipVisionHidden {
            layers: 3,
            post_norm: true,
        }),
        pooled: Some(ClipVisionPooled {
            layers: 0,
            project: false,
        }),
    };
    let out = encode(&runner, &model, &px, &want).unwrap();
    let normed = out.hidden.unwrap();
    let class = HostTensor::new([48, 1, 1, 1], normed.data[..48].to_vec()).unwrap();
    assert_close(
        "post_norm class token",
        &class,
        &reference(&c, "h.pooled"),
        TOL,
    );
    // Pooled after 0 layers differs from the reference pooled (all layers).
    let early = out.pooled.unwrap();
    assert!(max_abs_diff(&early, &reference(&c, "h.pooled")) > 1e-2);
}

#[test]
fn segmented_run_matches_monolithic() {
    let F32Folder { store, _dir } = f32_folder("h");
    let hp = hparams(&store, "", ClipActivation::Gelu);
    let plain = load_f32(&store, "", &hp);
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let segmented = try_load(&store, "", &hp, None, options).unwrap();
    let a = run_all(&plain, "h");
    let b = run_all(&segmented, "h");
    let report = segmented.runner.last_report().expect("a planned run");
    assert!(report.segmented && report.segments.len() >= 2, "{report:?}");
    assert_identical(&a, &b, "segmented vs monolithic");
}

/// transformers name (relative to the tower, without `vision_model.`) → OpenCLIP name, with
/// q/k/v handled by the caller; the same map tests/reference/clip_vision_fixtures.py checks
/// against open_clip's `VisionTransformer`.
fn openclip_name(local: &str) -> String {
    let fixed = match local {
        "embeddings.patch_embedding.weight" => Some("conv1.weight"),
        "embeddings.class_embedding" => Some("class_embedding"),
        "embeddings.position_embedding.weight" => Some("positional_embedding"),
        "pre_layrnorm.weight" => Some("ln_pre.weight"),
        "pre_layrnorm.bias" => Some("ln_pre.bias"),
        "post_layernorm.weight" => Some("ln_post.weight"),
        "post_layernorm.bias" => Some("ln_post.bias"),
        _ => None,
    };
    if let Some(f) = fixed {
        return f.into();
    }
    let rest = local.strip_prefix("encoder.layers.").unwrap();
    let (i, tail) = rest.split_once('.').unwrap();
    let (module, leaf) = tail.rsplit_once('.').unwrap();
    let short = match module {
        "layer_norm1" => "ln_1",
        "layer_norm2" => "ln_2",
        "self_attn.out_proj" => "attn.out_proj",
        "mlp.fc1" => "mlp.c_fc",
        "mlp.fc2" => "mlp.c_proj",
        other => panic!("unexpected {other}"),
    };
    format!("transformer.resblocks.{i}.{short}.{leaf}")
}

/// One tensor to write: name, PyTorch shape, f32 values.
type Item = (String, Vec<u64>, Vec<f32>);

/// Each layer's q, k, v parts (index 0/1/2, values) by (layer, leaf).
type QkvParts = BTreeMap<(String, String), Vec<(usize, Vec<f32>)>>;

/// Tower h's tensors renamed: `fused` stacks q/k/v of each layer into one [3·D, D] / [3·D]
/// tensor named by `fused(i, leaf)`; the projection [proj, D] goes through `proj` (name,
/// transposed?). `skip` leaves out one transformers name.
fn h_items(
    rename: &dyn Fn(&str) -> String,
    fused: &dyn Fn(&str, &str) -> String,
    proj: (&str, bool),
    skip: Option<&str>,
) -> Vec<Item> {
    let hf = h_store();
    let mut items = Vec::new();
    let mut qkv = QkvParts::new();
    for info in hf.iter() {
        if Some(info.name.as_str()) == skip {
            continue;
        }
        let values = hf.to_f32(info).unwrap();
        let shape: Vec<u64> = info.shape().iter().rev().map(|&d| d as u64).collect();
        if info.name == "visual_projection.weight" {
            let (name, transpose) = proj;
            let (rows, cols) = (shape[0] as usize, shape[1] as usize);
            if transpose {
                let t: Vec<f32> = (0..rows * cols)
                    .map(|k| values[(k % rows) * cols + k / rows])
                    .collect();
                items.push((name.to_string(), vec![cols as u64, rows as u64], t));
            } else {
                items.push((name.to_string(), shape, values));
            }
            continue;
        }
        let local = info.name.strip_prefix("vision_model.").unwrap();
        if let Some(rest) = local.strip_prefix("encoder.layers.") {
            let (i, tail) = rest.split_once('.').unwrap();
            if let Some(p) = ["q_proj", "k_proj", "v_proj"]
                .iter()
                .position(|p| tail.starts_with(&format!("self_attn.{p}.")))
            {
                let leaf = tail.rsplit_once('.').unwrap().1.to_string();
                qkv.entry((i.to_string(), leaf))
                    .or_default()
                    .push((p, values));
                continue;
            }
        }
        items.push((rename(local), shape, values));
    }
    for ((i, leaf), mut parts) in qkv {
        parts.sort_by_key(|(p, _)| *p);
        let values: Vec<f32> = parts.into_iter().flat_map(|(_, v)| v).collect();
        let shape = if leaf == "weight" {
            vec![3 * 48, 48]
        } else {
            vec![3 * 48]
        };
        items.push((fused(&i, &leaf), shape, values));
    }
    items
}

fn write_st(path: &Path, items: &[Item]) {
    let datas: Vec<Vec<u8>> = items
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let st: Vec<SafetensorsItem<'_>> = items
        .iter()
        .zip(&datas)
        .map(|((name, shape, _), data)| SafetensorsItem {
            name,
            dtype: "F32",
            shape,
            data,
        })
        .collect();
    write_safetensors(path, &BTreeMap::new(), &st).unwrap();
}

/// Tower h in OpenCLIP names under `visual.` (as in an OpenCLIP state dict), f32.
fn openclip_store(dir: &Path, skip: Option<&str>) -> TensorStore {
    let items = h_items(
        &|l| format!("visual.{}", openclip_name(l)),
        &|i, leaf| format!("visual.transformer.resblocks.{i}.attn.in_proj_{leaf}"),
        ("visual.proj", true),
        skip,
    );
    let path = dir.join("open_clip_vision.safetensors");
    write_st(&path, &items);
    TensorStore::open(&path).unwrap()
}

#[test]
fn openclip_layout_matches_transformers_folder() {
    let dir = tempfile::tempdir().unwrap();
    let store = openclip_store(dir.path(), None);
    assert!(store.contains("visual.transformer.resblocks.2.attn.in_proj_weight"));
    // No config.json: heads and activation from the caller / the layout.
    let hp = ClipVisionHparams {
        heads: Some(3),
        ..ClipVisionHparams::new(ClipActivation::QuickGelu)
    };
    let t = load_f32(&store, "", &hp);
    assert_eq!(t.layout, ClipVisionLayout::OpenClip("visual."));
    assert_eq!(t.model.config(), &h_config());
    let outs = run_all(&t, "h");
    check(&outs, TOL, "h openclip");
    let h32 = f32_folder("h");
    let hf = load_f32(
        &h32.store,
        "",
        &hparams(&h32.store, "", ClipActivation::Gelu),
    );
    assert_identical(&outs, &run_all(&hf, "h"), "openclip vs transformers folder");
}

/// Tower h as stable-diffusion.cpp's names would have it in a GGUF: `clip_vision.` prefix,
/// its `pre_layernorm` spelling, fused `self_attn.in_proj`, the projection under its
/// `vision_model.visual_projection.weight` alias; 2-D weights in `ty`.
fn sdcpp_gguf(dir: &Path, ty: DType) -> TensorStore {
    let tower = "clip_vision.vision_model.";
    let items = h_items(
        &|l| format!("{tower}{}", l.replace("pre_layrnorm", "pre_layernorm")),
        &|i, leaf| format!("{tower}encoder.layers.{i}.self_attn.in_proj.{leaf}"),
        ("clip_vision.vision_model.visual_projection.weight", false),
        None,
    );
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    for (name, shape, values) in &items {
        let ne: Vec<u64> = shape.iter().rev().copied().collect();
        let ty = if ne.len() == 2 && !name.ends_with("position_embedding.weight") {
            ty
        } else {
            DType::F32
        };
        w.add_tensor(name, ty, &ne).unwrap();
        data.push(convert_f32(values, ty, ne[0] as usize).unwrap());
    }
    let path = dir.join(format!("clip_vision_{}.gguf", ty.name()));
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    w.write(&path, &refs).unwrap();
    TensorStore::open(&path).unwrap()
}

#[test]
fn sdcpp_style_gguf_matches() {
    let dir = tempfile::tempdir().unwrap();
    let store = sdcpp_gguf(dir.path(), DType::F32);
    assert!(store.contains("clip_vision.vision_model.encoder.layers.0.self_attn.in_proj.weight"));
    let hp = ClipVisionHparams {
        heads: Some(3),
        ..ClipVisionHparams::new(ClipActivation::Gelu)
    };
    let t = load_f32(&store, "", &hp);
    assert_eq!(t.layout, ClipVisionLayout::Hf("clip_vision.vision_model."));
    assert_eq!(t.model.config(), &h_config());
    let outs = run_all(&t, "h");
    let h32 = f32_folder("h");
    let hf = load_f32(
        &h32.store,
        "",
        &hparams(&h32.store, "", ClipActivation::Gelu),
    );
    assert_identical(
        &outs,
        &run_all(&hf, "h"),
        "sd.cpp gguf vs transformers folder",
    );

    // f16 weights in the GGUF, kept as they are: the f16 tolerance.
    let store = sdcpp_gguf(dir.path(), DType::F16);
    let t = try_load(&store, "", &hp, None, kernels(false, true)).unwrap();
    check(&run_all(&t, "h"), TOL_F16, "h sd.cpp gguf f16");
}

#[test]
fn default_heads_are_sixteen() {
    // Without config.json the head count is the released towers' 16: it divides 48, so
    // tower h loads, with head size 3 — and its output is then wrong, which is why a
    // config.json beside a non-standard tower matters.
    let store = h_store();
    let hp = ClipVisionHparams::new(ClipActivation::Gelu);
    let t = load_f32(&store, "", &hp);
    assert_eq!(t.model.config().heads, 16);
    let c = cases();
    let out = encode_hidden(&t.runner, &t.model, &pixels(&c, "h"), 3).unwrap();
    assert!(max_abs_diff(&out, &reference(&c, "h.last")) > 1e-2);
    // Heads that do not divide the width are an error, not a panic.
    let bad = ClipVisionHparams {
        heads: Some(5),
        ..hp
    };
    let err = try_load(&store, "", &bad, None, RunOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("heads"), "{err}");
}

#[test]
fn bad_config_json_values_are_errors() {
    let hp = ClipVisionHparams::new(ClipActivation::Gelu);
    let cfg = serde_json::json!({"vision_config": {"hidden_act": "relu"}});
    assert!(hp.clone().with_config_json(&cfg).is_err());
    let cfg = serde_json::json!({"num_attention_heads": 0});
    assert!(hp.clone().with_config_json(&cfg).is_err());
    let cfg = serde_json::json!({"layer_norm_eps": -1.0});
    assert!(hp.clone().with_config_json(&cfg).is_err());
    let cfg = serde_json::json!({
        "vision_config": {"num_attention_heads": 16, "hidden_act": "quick_gelu",
                          "layer_norm_eps": 1e-6},
        "text_config": {"num_attention_heads": 12, "hidden_act": "gelu"}
    });
    let hp = hp.with_config_json(&cfg).unwrap();
    assert_eq!(hp.heads, Some(16));
    assert_eq!(hp.activation(), ClipActivation::QuickGelu);
    assert_eq!(hp.eps, Some(1e-6));
}

#[test]
fn missing_tensors_and_bad_requests_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let hp = ClipVisionHparams {
        heads: Some(3),
        ..ClipVisionHparams::new(ClipActivation::Gelu)
    };
    let store = openclip_store(
        dir.path(),
        Some("vision_model.encoder.layers.1.mlp.fc2.bias"),
    );
    match try_load(&store, "", &hp, None, RunOptions::default()) {
        Err(RunnerError::MissingTensor { key, .. }) => {
            assert_eq!(key, "vision_model.encoder.layers.1.mlp.fc2.bias")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("loaded without a tensor"),
    }
    let store = openclip_store(dir.path(), Some("vision_model.embeddings.class_embedding"));
    let err = try_load(&store, "", &hp, None, RunOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(&err, RunnerError::MissingTensor { key, .. }
            if key == "vision_model.embeddings.class_embedding"),
        "{err}"
    );
    let empty = TensorStore::new();
    assert!(matches!(
        try_load(&empty, "", &hp, None, RunOptions::default()),
        Err(RunnerError::MissingTensor { .. })
    ));

    let store = h_store();
    let t = load_f32(&store, "", &hparams(&store, "", ClipActivation::Gelu));
    let px = pixels(&cases(), "h");
    // Pixels of the wrong size, or not filling their shape.
    let small = HostTensor::zeros([16, 16, 3, 1]);
    let err = encode_hidden(&t.runner, &t.model, &small, 3).unwrap_err();
    assert!(err.to_string().contains("32"), "{err}");
    let short = HostTensor {
        ne: px.ne,
        data: px.data[1..].to_vec(),
    };
    assert!(encode_hidden(&t.runner, &t.model, &short, 3).is_err());
    // More layers than the tower has.
    let err = encode_hidden(&t.runner, &t.model, &px, 4).unwrap_err();
    assert!(err.to_string().contains("4 layers"), "{err}");
    let nothing = encode(&t.runner, &t.model, &px, &ClipVisionOutputs::default()).unwrap();
    assert!(nothing.hidden.is_none() && nothing.pooled.is_none());
}

#[test]
fn preprocess_matches_upstream() {
    let c = cases();
    for case in ["wide", "tiny", "tall", "square"] {
        let rgb = tensor(&c, &format!("pre.{case}.rgb"));
        let [_, w, h, _] = rgb.ne;
        let bytes: Vec<u8> = rgb.data.iter().map(|&v| (v + 128.0) as u8).collect();
        let image = HostTensor::from_u8_interleaved(w, h, 3, 3, &bytes);
        let got = clip_vision_preprocess(&image, 16).unwrap();
        let want = tensor(&c, &format!("pre.{case}.pixels"));
        assert_eq!(got.ne, [16, 16, 3, 1]);
        let err = max_abs_diff(&got, &HostTensor::new(got.ne, want.data).unwrap());
        eprintln!("preprocess {case} {w}x{h}: max abs error {err:.3e}");
        assert!(err <= 1e-6, "{case}: {err}");
    }
}
