//! Parity of the CLIP text encoder with transformers' `CLIPTextModel` /
//! `CLIPTextModelWithProjection`. Fixtures: tests/reference/clip_fixtures.py →
//! tests/fixtures/clip/ (two tiny random models, see the script):
//! - `l`: quick_gelu, hidden 48, 4 heads from config.json (head size 12), 3 layers;
//! - `g`: gelu, hidden 96, 1 head (the head-size-64 rule), 2 layers, projection 72.
//!
//! The committed files hold V = 256 token rows of a 49408-row table that repeats them; cases
//! run on them with ids mapped to `id mod V` (textual-inversion ids 49408 + j to V + j). The
//! GGUF tests rebuild the whole table and run the tokenizer's ids as they are.
//!
//! Tolerances (max abs error ≤ tol · max(1, max |reference|); measured in brackets):
//! - f32 weights: 1e-4 [4.4e-7], on the blocked CPU kernels and on ggml's own kernels.
//! - `--fa` (K/V in f16): 2e-3 [4.7e-4].
//! - bf16 weights (`--type bf16`): 2e-2 [5.4e-3]; q8_0: 6e-2 [1.8e-2] (sanity bounds for the
//!   converted paths: a wrong layout gives errors of the order of the scale).
//! - every layout of one model (HF folder, SD1 single file, OpenCLIP single file,
//!   stable-diffusion.cpp GGUF) gives bit-identical results, quantized ones included.

mod common;

use std::path::Path;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::te::clip::{
    self, clip_skip_layers, pooled_position, ClipActivation, ClipConfig, ClipHparams, ClipLayout,
    ClipOutputs, ClipSource, ClipTextModel, HiddenOutput, PooledOutput, EOS_TOKEN_ID,
};
use sd_cli::runner::{convert_f32, MemoryOptions, RunOptions, Runner, WeightLoader, WeightSource};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, GgufWriter, TensorStore};

const TOL: f32 = 1e-4;
/// Token rows stored in the fixture files.
const V: i32 = 256;
/// The tokenizer's vocabulary (the reference models' table).
const VOCAB: i32 = 49408;

/// One fixture model: its tag in cases.safetensors, depth, cases.
struct Spec {
    tag: &'static str,
    layers: usize,
    cases: [&'static str; 4],
}

const L: Spec = Spec {
    tag: "l",
    layers: 3,
    cases: ["eos_pad", "short", "ti", "no_eos"],
};
const G: Spec = Spec {
    tag: "g",
    layers: 2,
    cases: ["zero_pad", "short", "ti", "no_eos"],
};

fn cases() -> TensorStore {
    open_fixture("clip/cases.safetensors")
}

fn ints(store: &TensorStore, name: &str) -> Vec<i32> {
    tensor(store, name).data.iter().map(|&v| v as i32).collect()
}

/// The ids that select the same rows of a V-row table.
fn small_ids(ids: &[i32]) -> Vec<i32> {
    ids.iter()
        .map(|&id| if id >= VOCAB { V + id - VOCAB } else { id % V })
        .collect()
}

/// A [n, hidden] (PyTorch) reference as ggml [hidden, n].
fn reference(c: &TensorStore, name: &str) -> HostTensor {
    let t = tensor(c, name);
    HostTensor::new([t.ne[0], t.ne[1], 1, 1], t.data).unwrap()
}

struct Model {
    model: ClipTextModel,
    runner: Runner,
    layout: ClipLayout,
}

/// The `config.json` of the store's files, if any.
fn hparams(store: &TensorStore, fallback: ClipActivation) -> ClipHparams {
    let hp = ClipHparams::new(fallback);
    match store.files().iter().find_map(|f| f.config.as_ref()) {
        Some(cfg) => hp.with_config_json(cfg).expect("config.json"),
        None => hp,
    }
}

fn load_with(
    store: &TensorStore,
    prefix: &str,
    hp: ClipHparams,
    wtype: Option<DType>,
    flash_attn: bool,
    blocked: bool,
) -> Model {
    let backend = cpu();
    let source = ClipSource::new(store, prefix);
    let layout = source.layout();
    let hp = hp.with_openclip_layout(layout.is_openclip());
    let loader = WeightLoader::new(&source, wtype);
    let config = ClipConfig::detect(&loader.root(""), &hp).expect("detect");
    let model = ClipTextModel::new(&loader.root(""), config).expect("declare");
    let weights = loader.finish(&backend, "clip").expect("load");
    Model {
        model,
        runner: runner_with_kernels(Some(weights), backend, flash_attn, blocked),
        layout,
    }
}

fn load(store: &TensorStore, prefix: &str, hp: ClipHparams, wtype: Option<DType>) -> Model {
    load_with(store, prefix, hp, wtype, false, true)
}

/// Runs every case of `spec` and returns (reference name, output) pairs: hidden states after
/// the stored layer counts with and without the final LN, pooled and projected pooled (the
/// penultimate hidden state and the pooled output share one graph, as SDXL asks them).
fn run_all(m: &Model, spec: &Spec, small: bool) -> Vec<(String, HostTensor)> {
    let c = cases();
    let mut outs = Vec::new();
    for case in spec.cases {
        let key = |s: &str| format!("{}.{case}.{s}", spec.tag);
        let ids = ints(&c, &key("ids"));
        let position = ints(&c, &key("pos"))[0] as usize;
        assert_eq!(pooled_position(&ids, EOS_TOKEN_ID), position, "{case}");
        let ids = if small { small_ids(&ids) } else { ids };
        let extra = (case == "ti").then(|| tensor(&c, &key("extra")).data);
        let encode = |want: ClipOutputs| {
            clip::encode(&m.runner, &m.model, &ids, extra.as_deref(), &want).expect("encode")
        };
        let depths: Vec<usize> = if case == "short" {
            (0..=spec.layers).collect()
        } else {
            vec![spec.layers - 1, spec.layers]
        };
        for k in depths {
            for final_norm in [false, true] {
                let hidden = Some(HiddenOutput {
                    layers: k,
                    final_norm,
                });
                let with_pooled = k + 1 == spec.layers && !final_norm;
                let pooled = with_pooled.then_some(PooledOutput {
                    position,
                    project: m.model.has_projection(),
                });
                let out = encode(ClipOutputs { hidden, pooled });
                let ln = if final_norm { "_ln" } else { "" };
                outs.push((key(&format!("h{k}{ln}")), out.hidden.unwrap()));
                if let Some(p) = out.pooled {
                    let name = if m.model.has_projection() {
                        "pooled_proj"
                    } else {
                        "pooled"
                    };
                    outs.push((key(name), p));
                }
            }
        }
        let plain = encode(ClipOutputs {
            hidden: None,
            pooled: Some(PooledOutput {
                position,
                project: false,
            }),
        });
        outs.push((key("pooled"), plain.pooled.unwrap()));
    }
    outs
}

fn check(outs: &[(String, HostTensor)], tol: f32, what: &str) {
    let c = cases();
    for (name, got) in outs {
        let want = reference(&c, name);
        assert_close(&format!("{what} {name}"), got, &want, tol);
    }
}

fn assert_identical(a: &[(String, HostTensor)], b: &[(String, HostTensor)], what: &str) {
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(b) {
        assert_eq!(x.ne, y.ne, "{what} {name}");
        assert!(x.data == y.data, "{what} {name}: layouts disagree");
    }
}

fn l_store() -> TensorStore {
    open_fixture("clip/l/text_encoder")
}

fn g_store() -> TensorStore {
    open_fixture("clip/g/text_encoder_2")
}

fn openclip_store() -> TensorStore {
    open_fixture("clip/g_openclip.safetensors")
}

/// The file says `conditioner.embedders.1.model.*` (SDXL's bigG); the store keeps every bigG
/// spelling under upstream's `cond_stage_model.1.transformer.` slot, OpenCLIP names after it.
const OPENCLIP_PREFIX: &str = "cond_stage_model.1.transformer.";

#[test]
fn configs_detected_from_weights() {
    let store = l_store();
    let source = ClipSource::new(&store, "");
    assert_eq!(source.layout(), ClipLayout::Hf(""));
    let loader = WeightLoader::new(&source, None);
    let hp = hparams(&store, ClipActivation::Gelu);
    let c = ClipConfig::detect(&loader.root(""), &hp).unwrap();
    assert_eq!(
        c,
        ClipConfig {
            vocab: 256,
            hidden: 48,
            heads: 4,
            intermediate: 72,
            layers: 3,
            max_positions: 77,
            act: ClipActivation::QuickGelu,
            eps: 1e-5,
            projection_dim: None,
        }
    );
    // Without config.json: CLIP's head size 64 (at least one head) and the caller's activation.
    let bare = ClipConfig::detect(
        &loader.root(""),
        &ClipHparams::new(ClipActivation::QuickGelu),
    )
    .unwrap();
    assert_eq!((bare.heads, bare.act), (1, ClipActivation::QuickGelu));

    // OpenCLIP layout without config.json: gelu whatever the caller guessed, 96 / 64 → 1 head.
    let store = openclip_store();
    let source = ClipSource::new(&store, OPENCLIP_PREFIX);
    assert_eq!(source.layout(), ClipLayout::OpenClip(""));
    let loader = WeightLoader::new(&source, None);
    let hp = ClipHparams::new(ClipActivation::QuickGelu).with_openclip_layout(true);
    let c = ClipConfig::detect(&loader.root(""), &hp).unwrap();
    assert_eq!(
        (c.hidden, c.heads, c.intermediate, c.layers, c.act),
        (96, 1, 64, 2, ClipActivation::Gelu)
    );
    assert_eq!(c.projection_dim, Some(72));
}

#[test]
fn config_json_wins_and_bad_values_are_errors() {
    let cfg: serde_json::Value = serde_json::json!({
        "text_config": {"num_attention_heads": 5, "hidden_act": "gelu", "layer_norm_eps": 1e-6}
    });
    let hp = ClipHparams::new(ClipActivation::QuickGelu)
        .with_config_json(&cfg)
        .unwrap()
        .with_openclip_layout(false);
    assert_eq!(hp.heads, Some(5));
    assert_eq!(hp.activation(), ClipActivation::Gelu);
    assert_eq!(hp.eps, Some(1e-6));
    let bad = serde_json::json!({"hidden_act": "relu"});
    let err = ClipHparams::new(ClipActivation::Gelu)
        .with_config_json(&bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("relu"), "{err}");
    let bad = serde_json::json!({"num_attention_heads": 0});
    assert!(ClipHparams::new(ClipActivation::Gelu)
        .with_config_json(&bad)
        .is_err());

    // Heads that do not divide the width.
    let store = l_store();
    let source = ClipSource::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let mut hp = ClipHparams::new(ClipActivation::QuickGelu);
    hp.heads = Some(5);
    let err = ClipConfig::detect(&loader.root(""), &hp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("5 attention heads"), "{err}");
}

#[test]
fn clip_l_hf_folder_matches_transformers() {
    // transformers 5 `CLIPTextModel`: names without the `text_model.` level.
    let store = l_store();
    let m = load(&store, "", hparams(&store, ClipActivation::Gelu), None);
    check(&run_all(&m, &L, true), TOL, "l f32");
}

#[test]
fn clip_l_ggml_kernels_and_flash_attention() {
    let store = l_store();
    let hp = || hparams(&store, ClipActivation::QuickGelu);
    let ggml = load_with(&store, "", hp(), None, false, false);
    check(&run_all(&ggml, &L, true), TOL, "l ggml kernels");
    let fa = load_with(&store, "", hp(), None, true, false);
    check(&run_all(&fa, &L, true), 2e-3, "l --fa");
}

#[test]
fn clip_l_sd1_single_file_matches() {
    // SD1 checkpoints: `cond_stage_model.transformer.text_model.*` (the store keeps the
    // component prefix, the source finds the `text_model.` level under it).
    let store = open_fixture("clip/l_sd1.safetensors");
    let prefix = Component::TextEncoder.prefix();
    assert!(store.contains(&format!(
        "{prefix}text_model.encoder.layers.2.mlp.fc2.weight"
    )));
    let mut hp = ClipHparams::new(ClipActivation::QuickGelu);
    hp.heads = Some(4); // what config.json says; a single file has none
    let m = load(&store, prefix, hp, None);
    assert_eq!(m.layout, ClipLayout::Hf("text_model."));
    let outs = run_all(&m, &L, true);
    check(&outs, TOL, "l sd1 file");
    let hf = load(
        &l_store(),
        "",
        hparams(&l_store(), ClipActivation::Gelu),
        None,
    );
    assert_identical(&outs, &run_all(&hf, &L, true), "sd1 file vs folder");
}

#[test]
fn bigg_hf_folder_matches_transformers() {
    // `CLIPTextModelWithProjection` (diffusers SDXL `text_encoder_2/`): `text_model.*` and
    // `text_projection.weight`.
    let store = g_store();
    let m = load(&store, "", hparams(&store, ClipActivation::QuickGelu), None);
    assert_eq!(m.layout, ClipLayout::Hf("text_model."));
    assert_eq!(m.model.config().projection_dim, Some(72));
    check(&run_all(&m, &G, true), TOL, "g f32");
}

#[test]
fn openclip_single_file_matches() {
    // SDXL single files: `conditioner.embedders.1.model.*`, fused in_proj, [width, proj]
    // projection; no config.json, the layout implies gelu.
    let store = openclip_store();
    let hp = ClipHparams::new(ClipActivation::QuickGelu);
    let m = load(&store, OPENCLIP_PREFIX, hp, None);
    assert!(m.layout.is_openclip());
    let outs = run_all(&m, &G, true);
    check(&outs, TOL, "g openclip");
    let hf = load(
        &g_store(),
        "",
        hparams(&g_store(), ClipActivation::Gelu),
        None,
    );
    assert_identical(&outs, &run_all(&hf, &G, true), "openclip vs folder");
}

#[test]
fn converted_weight_types_within_tolerance() {
    let store = g_store();
    let hp = || hparams(&store, ClipActivation::Gelu);
    let bf16 = load(&store, "", hp(), Some(DType::BF16));
    check(&run_all(&bf16, &G, true), 2e-2, "g bf16");
    let q8 = load(&store, "", hp(), Some(DType::Q8_0));
    check(&run_all(&q8, &G, true), 6e-2, "g q8_0");
}

/// stable-diffusion.cpp's converted name of an OpenCLIP tensor (inside the component), as its
/// `convert_open_clip_to_hf_clip_name` writes it into a GGUF.
fn sdcpp_name_of_openclip(name: &str) -> String {
    let name = name.strip_prefix("model.").unwrap_or(name);
    let tm = "transformer.text_model.";
    match name {
        "token_embedding.weight" => return format!("{tm}embeddings.token_embedding.weight"),
        "positional_embedding" => return format!("{tm}embeddings.position_embedding.weight"),
        "text_projection" => return format!("{tm}text_projection"),
        "ln_final.weight" | "ln_final.bias" => {
            return format!("{tm}final_layer_norm.{}", &name[9..]);
        }
        _ => {}
    }
    let rest = name.strip_prefix("transformer.resblocks.").unwrap();
    let (i, tail) = rest.split_once('.').unwrap();
    let long = match tail {
        "attn.in_proj_weight" => "self_attn.in_proj.weight",
        "attn.in_proj_bias" => "self_attn.in_proj.bias",
        "attn.out_proj.weight" => "self_attn.out_proj.weight",
        "attn.out_proj.bias" => "self_attn.out_proj.bias",
        "ln_1.weight" => "layer_norm1.weight",
        "ln_1.bias" => "layer_norm1.bias",
        "ln_2.weight" => "layer_norm2.weight",
        "ln_2.bias" => "layer_norm2.bias",
        "mlp.c_fc.weight" => "mlp.fc1.weight",
        "mlp.c_fc.bias" => "mlp.fc1.bias",
        "mlp.c_proj.weight" => "mlp.fc2.weight",
        "mlp.c_proj.bias" => "mlp.fc2.bias",
        other => panic!("unexpected OpenCLIP tensor {other}"),
    };
    format!("{tm}encoder.layers.{i}.{long}")
}

/// Writes the tensors of `store` under `prefix` into a GGUF: names through `rename`, the token
/// table tiled to the tokenizer's 49408 rows, 2-D weights whose rows split into blocks as
/// `quant` (the position table stays f32, as the model loads it).
fn write_gguf(
    path: &Path,
    store: &TensorStore,
    prefix: &str,
    rename: impl Fn(&str) -> String,
    quant: DType,
) {
    let mut writer = GgufWriter::new();
    let mut data = Vec::new();
    for info in store.with_prefix(prefix) {
        let local = &info.name[prefix.len()..];
        let name = rename(local);
        let mut values = store.to_f32(info).unwrap();
        let mut ne = info.ne;
        if name.ends_with("token_embedding.weight") {
            assert_eq!(ne[1], V as usize);
            values = values.repeat((VOCAB / V) as usize);
            ne[1] = VOCAB as usize;
        }
        let quantize = info.n_dims == 2
            && !name.ends_with("position_embedding.weight")
            && quant.row_bytes(ne[0]).is_some();
        let ty = if quantize { quant } else { DType::F32 };
        let ne_u64: Vec<u64> = ne[..info.n_dims].iter().map(|&d| d as u64).collect();
        writer.add_tensor(&name, ty, &ne_u64).unwrap();
        data.push(convert_f32(&values, ty, ne[0]).unwrap());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    writer.write(path, &refs).unwrap();
}

/// The OpenCLIP fixture as stable-diffusion.cpp's converter writes SDXL's bigG into a GGUF
/// (`cond_stage_model.1.transformer.text_model.*`, fused in_proj, `text_model.text_projection`
/// in OpenCLIP orientation), with the full token table.
fn sdcpp_bigg_gguf(dir: &Path, quant: DType) -> TensorStore {
    let path = dir.join(format!("bigg-{}.gguf", quant.name()));
    let src = openclip_store();
    let rename = |n: &str| format!("cond_stage_model.1.{}", sdcpp_name_of_openclip(n));
    write_gguf(&path, &src, OPENCLIP_PREFIX, rename, quant);
    let store = TensorStore::open(&path).unwrap();
    assert!(store.contains(
        "cond_stage_model.1.transformer.text_model.encoder.layers.1.self_attn.in_proj.weight"
    ));
    store
}

const SDCPP_BIGG_PREFIX: &str = "cond_stage_model.1.transformer.";

#[test]
fn sdcpp_gguf_bigg_matches_with_tokenizer_ids() {
    let dir = tempfile::tempdir().unwrap();
    let store = sdcpp_bigg_gguf(dir.path(), DType::F32);
    let m = load(
        &store,
        SDCPP_BIGG_PREFIX,
        ClipHparams::new(ClipActivation::Gelu),
        None,
    );
    assert_eq!(m.layout, ClipLayout::Hf("text_model."));
    assert_eq!(m.model.config().vocab, VOCAB as usize);
    let outs = run_all(&m, &G, false);
    check(&outs, TOL, "g sd.cpp gguf");
    let hf = load(
        &g_store(),
        "",
        hparams(&g_store(), ClipActivation::Gelu),
        None,
    );
    assert_identical(&outs, &run_all(&hf, &G, true), "gguf vs folder");
}

#[test]
fn sdcpp_gguf_quantized_in_proj_splits_by_rows() {
    // A Q8_0 fused in_proj served as row slices gives exactly what quantizing the separate
    // q/k/v on load gives (Q8_0 quantizes each row on its own).
    let dir = tempfile::tempdir().unwrap();
    let store = sdcpp_bigg_gguf(dir.path(), DType::Q8_0);
    let info = store
        .get("cond_stage_model.1.transformer.text_model.encoder.layers.0.self_attn.in_proj.weight")
        .unwrap();
    assert_eq!(info.dtype, DType::Q8_0);
    let hp = || ClipHparams::new(ClipActivation::Gelu);
    let gguf = load(&store, SDCPP_BIGG_PREFIX, hp(), Some(DType::Q8_0));
    let outs = run_all(&gguf, &G, false);
    check(&outs, 6e-2, "g q8_0 gguf");
    let st = load(&openclip_store(), OPENCLIP_PREFIX, hp(), Some(DType::Q8_0));
    assert_identical(
        &outs,
        &run_all(&st, &G, true),
        "q8_0 gguf vs openclip --type q8_0",
    );
}

#[test]
fn sdcpp_gguf_clip_l_with_tokenizer_ids() {
    // SD1's CLIP-L as the converter names it (`cond_stage_model.transformer.text_model.*`,
    // separate q/k/v), full token table, EOS padding to 77.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clip-l.gguf");
    let src = l_store();
    let rename = |n: &str| format!("cond_stage_model.transformer.text_model.{n}");
    write_gguf(&path, &src, "", rename, DType::F32);
    let store = TensorStore::open(&path).unwrap();
    let mut hp = ClipHparams::new(ClipActivation::QuickGelu);
    hp.heads = Some(4);
    let m = load(&store, Component::TextEncoder.prefix(), hp, None);
    check(&run_all(&m, &L, false), TOL, "l sd.cpp gguf");
}

#[test]
fn textual_inversion_rows_change_only_their_tokens() {
    // The same sequence with the extra ids replaced by ordinary ones differs exactly from the
    // first extra token on (causal attention), and an id past the extra rows is an error.
    let store = l_store();
    let m = load(&store, "", hparams(&store, ClipActivation::Gelu), None);
    let c = cases();
    let ids = small_ids(&ints(&c, "l.ti.ids"));
    let extra = tensor(&c, "l.ti.extra").data;
    let want = ClipOutputs {
        hidden: Some(HiddenOutput {
            layers: 3,
            final_norm: true,
        }),
        pooled: None,
    };
    let with = clip::encode(&m.runner, &m.model, &ids, Some(&extra), &want).unwrap();
    let first = ids.iter().position(|&id| id >= V).unwrap();
    let plain: Vec<i32> = ids.iter().map(|&id| id.min(V - 1)).collect();
    let without = clip::encode(&m.runner, &m.model, &plain, None, &want).unwrap();
    let (a, b) = (with.hidden.unwrap(), without.hidden.unwrap());
    let row = |t: &HostTensor, i: usize| t.data[i * 48..(i + 1) * 48].to_vec();
    for i in 0..first {
        assert_eq!(row(&a, i), row(&b, i), "token {i} before the extra ids");
    }
    assert_ne!(row(&a, first), row(&b, first));

    let err = clip::encode(&m.runner, &m.model, &[1, V + 3], Some(&extra), &want)
        .unwrap_err()
        .to_string();
    assert!(err.contains("token id 259"), "{err}");
}

#[test]
fn bad_inputs_are_errors() {
    let store = l_store();
    let m = load(&store, "", hparams(&store, ClipActivation::Gelu), None);
    let hidden = |layers| ClipOutputs {
        hidden: Some(HiddenOutput {
            layers,
            final_norm: false,
        }),
        pooled: None,
    };
    let enc = |ids: &[i32], extra: Option<&[f32]>, want: ClipOutputs| {
        clip::encode(&m.runner, &m.model, ids, extra, &want)
            .unwrap_err()
            .to_string()
    };
    assert!(enc(&[1, V], None, hidden(3)).contains("token id 256"));
    assert!(enc(&[1, -1], None, hidden(3)).contains("token id -1"));
    assert!(enc(&[], None, hidden(3)).contains("no tokens"));
    assert!(enc(&[1; 78], None, hidden(3)).contains("78 tokens"));
    assert!(enc(&[1, 2], None, hidden(4)).contains("4 layers"));
    assert!(enc(&[1, 2], Some(&[0.5; 47]), hidden(3)).contains("47 values"));
    let pooled = ClipOutputs {
        hidden: None,
        pooled: Some(PooledOutput {
            position: 2,
            project: false,
        }),
    };
    assert!(enc(&[1, 2], None, pooled).contains("position 2"));

    // A file without the tower, and one missing a layer's tensor.
    let empty = TensorStore::new();
    let source = ClipSource::new(&empty, "");
    let loader = WeightLoader::new(&source, None);
    let err = ClipConfig::detect(&loader.root(""), &ClipHparams::new(ClipActivation::Gelu))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("text_model.embeddings.token_embedding.weight"),
        "{err}"
    );
}

#[test]
fn clip_skip_selects_upstream_layers() {
    // SD1 (3 layers here): skip 1 → all layers, skip 2 → 2; with the final LN, as upstream.
    let store = l_store();
    let m = load(&store, "", hparams(&store, ClipActivation::Gelu), None);
    let c = cases();
    let ids = small_ids(&ints(&c, "l.short.ids"));
    for (skip, k) in [(-1, 3), (1, 3), (2, 2), (3, 1)] {
        assert_eq!(clip_skip_layers(3, skip), k);
        let want = ClipOutputs {
            hidden: Some(HiddenOutput {
                layers: clip_skip_layers(3, skip),
                final_norm: true,
            }),
            pooled: None,
        };
        let got = clip::encode(&m.runner, &m.model, &ids, None, &want).unwrap();
        let reference = reference(&c, &format!("l.short.h{k}_ln"));
        assert_close(
            &format!("clip skip {skip}"),
            &got.hidden.unwrap(),
            &reference,
            TOL,
        );
    }
}

#[test]
fn segmented_run_matches_monolithic() {
    // Forced graph-cut segments (one per layer): the penultimate hidden state, captured
    // mid-graph, and the pooled output of the last layer come out bit-identical.
    let store = g_store();
    let plain = load(&store, "", hparams(&store, ClipActivation::Gelu), None);
    let source = ClipSource::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config =
        ClipConfig::detect(&loader.root(""), &hparams(&store, ClipActivation::Gelu)).unwrap();
    let model = ClipTextModel::new(&loader.root(""), config).unwrap();
    let backend = cpu();
    let weights = loader.finish(&backend, "clip").unwrap();
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let segmented = Model {
        model,
        runner: Runner::new("clip", backend, Some(weights), options),
        layout: plain.layout,
    };
    let a = run_all(&plain, &G, true);
    let b = run_all(&segmented, &G, true);
    let report = segmented.runner.last_report().expect("a planned run");
    assert!(report.segmented && report.segments.len() >= 2, "{report:?}");
    assert_identical(&a, &b, "segmented vs monolithic");
}

#[test]
fn malformed_openclip_file_is_an_error() {
    // A fused in_proj whose rows do not split in three, and a projection of the wrong width:
    // typed errors naming the tensor, no panic.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    let (d, ff) = (16u64, 32u64);
    let m = "model.";
    let r = "model.transformer.resblocks.0.";
    let tensors: Vec<(String, Vec<u64>)> = vec![
        (format!("{m}token_embedding.weight"), vec![d, 10]),
        (format!("{m}positional_embedding"), vec![d, 4]),
        (format!("{r}ln_1.weight"), vec![d]),
        (format!("{r}ln_1.bias"), vec![d]),
        (format!("{r}attn.in_proj_weight"), vec![d, 3 * d - 1]),
        (format!("{r}attn.in_proj_bias"), vec![3 * d]),
        (format!("{r}attn.out_proj.weight"), vec![d, d]),
        (format!("{r}attn.out_proj.bias"), vec![d]),
        (format!("{r}ln_2.weight"), vec![d]),
        (format!("{r}ln_2.bias"), vec![d]),
        (format!("{r}mlp.c_fc.weight"), vec![d, ff]),
        (format!("{r}mlp.c_fc.bias"), vec![ff]),
        (format!("{r}mlp.c_proj.weight"), vec![ff, d]),
        (format!("{r}mlp.c_proj.bias"), vec![d]),
        (format!("{m}ln_final.weight"), vec![d]),
        (format!("{m}ln_final.bias"), vec![d]),
        (format!("{m}text_projection"), vec![d, 7]),
    ];
    let tensors: Vec<(String, Vec<u64>, Vec<f32>)> = tensors
        .into_iter()
        .map(|(n, ne)| {
            let len = ne.iter().product::<u64>() as usize;
            (n, ne, vec![0.0; len])
        })
        .collect();
    write_tiny_gguf(&path, &tensors);
    let store = TensorStore::open(&path).unwrap();
    let source = ClipSource::new(&store, "");
    assert!(source.layout().is_openclip());
    let loader = WeightLoader::new(&source, None);
    let hp = ClipHparams::new(ClipActivation::Gelu).with_openclip_layout(true);
    let err = ClipConfig::detect(&loader.root(""), &hp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("text_projection.weight"), "{err}");

    // The sizes the file would give without its projection.
    let config = ClipConfig {
        vocab: 10,
        hidden: 16,
        heads: 1,
        intermediate: 32,
        layers: 1,
        max_positions: 4,
        act: ClipActivation::Gelu,
        eps: 1e-5,
        projection_dim: None,
    };
    let err = match ClipTextModel::new(&loader.root(""), config) {
        Ok(_) => panic!("a broken in_proj loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("self_attn.q_proj.weight"), "{err}");
}

/// Writes f32 tensors (name, ggml-order shape, values) into a GGUF.
fn write_tiny_gguf(path: &Path, tensors: &[(String, Vec<u64>, Vec<f32>)]) {
    let mut writer = GgufWriter::new();
    let mut data = Vec::new();
    for (name, ne, values) in tensors {
        writer.add_tensor(name, DType::F32, ne).unwrap();
        data.push(convert_f32(values, DType::F32, ne[0] as usize).unwrap());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    writer.write(path, &refs).unwrap();
}

#[test]
fn converted_square_projection_orientation_follows_origin() {
    // stable-diffusion.cpp's converter names either origin's projection
    // `text_model.text_projection` and keeps its orientation. Square (as bigG's 1280 x 1280),
    // only the origin tells: a fused in_proj means OpenCLIP ([width, proj], served transposed),
    // separate q/k/v mean transformers (a `Linear` weight, served as is).
    let dir = tempfile::tempdir().unwrap();
    let d = 16usize;
    let stored: Vec<f32> = (0..d * d).map(|i| i as f32).collect();
    let mut transposed = vec![0.0; d * d];
    for r in 0..d {
        for c in 0..d {
            transposed[c * d + r] = stored[r * d + c];
        }
    }
    for (fused, want) in [(true, &transposed), (false, &stored)] {
        let attn = if fused { "in_proj" } else { "q_proj" };
        let rows = if fused { 3 * d } else { d };
        let tensors = vec![
            (
                "text_model.embeddings.token_embedding.weight".to_string(),
                vec![d as u64, 10],
                vec![0.0; d * 10],
            ),
            (
                "text_model.text_projection".to_string(),
                vec![d as u64, d as u64],
                stored.clone(),
            ),
            (
                format!("text_model.encoder.layers.0.self_attn.{attn}.weight"),
                vec![d as u64, rows as u64],
                vec![0.0; d * rows],
            ),
        ];
        let path = dir.path().join(format!("proj-{fused}.gguf"));
        write_tiny_gguf(&path, &tensors);
        let store = TensorStore::open(&path).unwrap();
        let source = ClipSource::new(&store, "");
        let t = source.tensor(clip::PROJECTION).expect("projection served");
        assert_eq!(t.ne, [d, d, 1, 1]);
        let got = (t.to_f32)(&t.bytes).unwrap();
        assert!(&got == want, "fused in_proj {fused}: wrong orientation");
    }
}
