//! Parity of the T5 encoder in umT5 mode (a position table per block) with transformers'
//! `UMT5EncoderModel`, the text encoder of Wan 2.1/2.2.
//! Fixtures: tests/reference/umt5_fixtures.py → tests/fixtures/umt5/ (tiny random model:
//! d_model 32, 4 heads × 8, d_ff 48, 3 layers, 384 vocabulary rows, 32 buckets / max distance
//! 128; a umT5-shaped tokenizer.json). Every layout holds exactly the same values (see the
//! script), so one set of goldens serves all.
//!
//! Tolerances (max abs error ≤ tol · max(1, max |reference|), real-token rows only):
//! - f32 weights (the transformers file, an f32 llama.cpp GGUF): 1e-5; the GGUF is
//!   bit-identical to the transformers file.
//! - every layout (ComfyUI scaled fp8, original Wan `.pth`) serves exactly the transformers
//!   file's values under its names (compared tensor by tensor).
//! - run in their native storage: fp8-scaled → f16 weights 3e-3, Wan bf16 weights 3e-2
//!   (ggml's CPU matmul rounds the activations to the weight's float type as well).

mod common;

use std::path::Path;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::te::t5::{
    self, check_tokenizer, check_tokenizer_size, relative_position_bucket, T5Config, T5Encoder,
    T5Layout, T5Source,
};
use sd_cli::runner::{WeightLoader, WeightSource};
use sd_cli::tensor::HostTensor;
use sd_cli::tokenizers::load_t5_tokenizer;
use sd_cli::weights::{Component, GgufWriter, TensorStore};

const TOL: f32 = 1e-5;
const CASES: [&str; 3] = ["en", "zh", "long"];
const PROMPT_EN: &str = "A cat walks on the  grass, realistic style.";
const PROMPT_ZH: &str = "一只猫在草地上走，写实风格";

type Outputs = Vec<(String, usize, HostTensor)>;

fn cases() -> TensorStore {
    open_fixture("umt5/cases.safetensors")
}

fn ints(store: &TensorStore, name: &str) -> Vec<i32> {
    tensor(store, name).data.iter().map(|&v| v as i32).collect()
}

fn hf_store() -> TensorStore {
    open_fixture("umt5/text_encoder")
}

/// A single file loaded as `--t5xxl` loads it: under the T5 component prefix.
fn t5_file(path: &Path) -> TensorStore {
    let mut store = TensorStore::new();
    store.add_file(path, Component::T5.prefix()).unwrap();
    store
}

/// Loads the encoder from `prefix` of `store` and runs every case.
fn run_all(store: &TensorStore, prefix: &str) -> (T5Config, bool, T5Layout, Outputs) {
    let backend = cpu();
    let source = T5Source::new(store, prefix);
    let loader = WeightLoader::new(&source, None);
    let config = T5Config::detect(&loader.root("")).expect("detect");
    let model = T5Encoder::new(&loader.root(""), config.clone()).expect("declare");
    let weights = loader.finish(&backend, "t5").expect("load");
    let r = runner(Some(weights), backend, false);
    let c = cases();
    let outs = CASES
        .iter()
        .map(|case| {
            let ids = ints(&c, &format!("{case}.ids"));
            let valid = ints(&c, &format!("{case}.valid"))[0] as usize;
            let y = t5::encode(&r, &model, &ids, valid).expect("encode");
            (case.to_string(), valid, y)
        })
        .collect();
    (config, model.is_umt5(), source.layout(), outs)
}

/// The first `valid` token rows of a [d_model, n] tensor.
fn real_rows(t: &HostTensor, valid: usize) -> HostTensor {
    let d = t.ne[0];
    HostTensor::new([d, valid, 1, 1], t.data[..d * valid].to_vec()).unwrap()
}

fn check_against(outs: &Outputs, tol: f32, what: &str) {
    let c = cases();
    for (case, valid, got) in outs {
        let want = tensor(&c, &format!("{case}.y"));
        let want = HostTensor::new([want.ne[0], want.ne[1], 1, 1], want.data).unwrap();
        assert_eq!(got.ne, want.ne, "{case}: output shape");
        assert_close(
            &format!("{what} {case}"),
            &real_rows(got, *valid),
            &real_rows(&want, *valid),
            tol,
        );
    }
}

/// Every tensor of the transformers fixture, served by `source` under the same name, has the
/// same shape and values.
fn assert_same_weights(source: &T5Source<'_>, what: &str) {
    let hf = hf_store();
    let mut n = 0;
    for info in hf.iter() {
        let want = hf.to_f32(info).unwrap();
        let t = source
            .tensor(&info.name)
            .unwrap_or_else(|| panic!("{what}: no {}", info.name));
        assert_eq!(t.ne, info.ne, "{what}: {}", info.name);
        let got = (t.to_f32)(&t.bytes).unwrap();
        assert!(got == want, "{what}: {} differs", info.name);
        n += 1;
    }
    assert_eq!(n, 2 + 3 * 10, "{what}: tensor count");
}

fn assert_identical(a: &Outputs, b: &Outputs) {
    for ((case, _, x), (_, _, y)) in a.iter().zip(b) {
        assert_eq!(x.ne, y.ne, "{case}");
        assert!(x.data == y.data, "{case}: layouts disagree");
    }
}

#[test]
fn buckets_match_torch() {
    let c = cases();
    for (r, w) in ints(&c, "buckets.rel")
        .iter()
        .zip(&ints(&c, "buckets.bucket"))
    {
        let got = relative_position_bucket(i64::from(*r), 32, 128) as i32;
        assert_eq!(got, *w, "relative position {r}");
    }
}

#[test]
fn transformers_file_matches() {
    let (config, umt5, layout, outs) = run_all(&hf_store(), "");
    assert_eq!(
        config,
        T5Config {
            vocab: 384,
            d_model: 32,
            d_kv: 8,
            num_heads: 4,
            d_ff: 48,
            num_layers: 3,
            num_buckets: 32,
            max_distance: 128,
            eps: 1e-6,
        }
    );
    assert!(umt5, "per-block position tables not detected");
    assert_eq!(layout, T5Layout::Transformers);
    check_against(&outs, TOL, "f32");
}

#[test]
fn plain_t5_is_not_umt5() {
    let store = open_fixture("t5/text_encoder");
    let source = T5Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config = T5Config::detect(&loader.root("")).unwrap();
    let model = T5Encoder::new(&loader.root(""), config).unwrap();
    assert!(!model.is_umt5());
}

#[test]
fn comfyui_scaled_fp8_matches() {
    let store = t5_file(&fixture_path("umt5/umt5_fp8_scaled.safetensors"));
    let source = T5Source::new(&store, Component::T5.prefix());
    assert_same_weights(&source, "fp8 scaled");
    let (_, umt5, _, native) = run_all(&store, Component::T5.prefix());
    assert!(umt5);
    check_against(&native, 3e-3, "fp8 scaled as f16");
}

#[test]
fn original_wan_pth_matches() {
    let store = t5_file(&fixture_path("umt5/models_t5_umt5-enc-bf16.pth"));
    assert!(store.contains("text_encoders.t5xxl.transformer.blocks.2.ffn.gate.0.weight"));
    let source = T5Source::new(&store, Component::T5.prefix());
    assert_eq!(source.layout(), T5Layout::Wan);
    assert_same_weights(&source, "Wan .pth");
    let (config, umt5, _, native) = run_all(&store, Component::T5.prefix());
    assert_eq!((config.num_layers, umt5), (3, true));
    check_against(&native, 3e-2, "Wan .pth as bf16");
}

/// HF name → llama.cpp GGUF name (umT5 GGUFs carry `attn_rel_b` in every block).
fn hf_to_llamacpp(name: &str) -> String {
    match name {
        "shared.weight" => return "token_embd.weight".into(),
        "encoder.final_layer_norm.weight" => return "enc.output_norm.weight".into(),
        _ => {}
    }
    let rest = name.strip_prefix("encoder.block.").unwrap();
    let (i, tail) = rest.split_once('.').unwrap();
    let short = match tail {
        "layer.0.SelfAttention.q.weight" => "attn_q",
        "layer.0.SelfAttention.k.weight" => "attn_k",
        "layer.0.SelfAttention.v.weight" => "attn_v",
        "layer.0.SelfAttention.o.weight" => "attn_o",
        "layer.0.SelfAttention.relative_attention_bias.weight" => "attn_rel_b",
        "layer.0.layer_norm.weight" => "attn_norm",
        "layer.1.layer_norm.weight" => "ffn_norm",
        "layer.1.DenseReluDense.wi_0.weight" => "ffn_gate",
        "layer.1.DenseReluDense.wi_1.weight" => "ffn_up",
        "layer.1.DenseReluDense.wo.weight" => "ffn_down",
        other => panic!("unexpected T5 tensor {other}"),
    };
    format!("enc.blk.{i}.{short}.weight")
}

/// Writes the transformers fixture as an f32 GGUF, renaming with `rename` and leaving out
/// `skip`; `extra` tensors (name, ggml shape, values) are appended.
fn write_gguf(
    path: &Path,
    rename: impl Fn(&str) -> String,
    skip: &str,
    extra: &[(&str, &[u64], &[f32])],
) {
    let store = hf_store();
    let mut writer = GgufWriter::new();
    let mut data = Vec::new();
    for info in store.iter().filter(|i| i.name != skip) {
        let ne: Vec<u64> = info.ne[..info.n_dims].iter().map(|&d| d as u64).collect();
        writer
            .add_tensor(&rename(&info.name), DType::F32, &ne)
            .unwrap();
        data.push(store.load_bytes(info).unwrap().into_owned());
    }
    for (name, ne, values) in extra {
        writer.add_tensor(name, DType::F32, ne).unwrap();
        data.push(values.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    writer.write(path, &refs).unwrap();
}

#[test]
fn llamacpp_gguf_matches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("umt5-llamacpp.gguf");
    write_gguf(&path, hf_to_llamacpp, "", &[]);
    let store = t5_file(&path);
    let (_, umt5, layout, outs) = run_all(&store, Component::T5.prefix());
    assert!(umt5);
    assert_eq!(layout, T5Layout::LlamaCpp);
    check_against(&outs, TOL, "gguf layout");
    assert_identical(&outs, &run_all(&hf_store(), "").3);
}

fn load_err(store: &TensorStore) -> String {
    let backend = cpu();
    let source = T5Source::new(store, "");
    let loader = WeightLoader::new(&source, None);
    let config = T5Config::detect(&loader.root("")).unwrap();
    match T5Encoder::new(&loader.root(""), config) {
        Err(e) => e.to_string(),
        Ok(_) => match loader.finish(&backend, "t5") {
            Err(e) => e.to_string(),
            Ok(_) => panic!("loaded a broken file"),
        },
    }
}

#[test]
fn broken_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    // umT5 with one block's position table missing.
    let missing = "encoder.block.2.layer.0.SelfAttention.relative_attention_bias.weight";
    let path = dir.path().join("missing.gguf");
    write_gguf(&path, str::to_string, missing, &[]);
    let mut store = TensorStore::new();
    store.add_file(&path, "").unwrap();
    let err = load_err(&store);
    assert!(err.contains(missing), "{err}");

    // A scale that is not one number.
    let path = dir.path().join("bad_scale.gguf");
    let scale = "encoder.block.1.layer.0.SelfAttention.q.scale_weight";
    write_gguf(&path, str::to_string, "", &[(scale, &[2], &[0.5, 0.5])]);
    let mut store = TensorStore::new();
    store.add_file(&path, "").unwrap();
    let err = load_err(&store);
    assert!(err.contains(scale) && err.contains("2 value"), "{err}");
}

#[test]
fn umt5_tokenizer_json_drives_the_encoder() {
    let path = fixture_path("umt5/tokenizer.json");
    let tok = load_t5_tokenizer(&path).expect("umT5-shaped tokenizer.json");
    let c = cases();
    let en: Vec<i32> = tok
        .encode_with_specials(PROMPT_EN)
        .into_iter()
        .map(|i| i as i32)
        .collect();
    assert_eq!(en, ints(&c, "en.ids"));
    let zh = tok.encode(PROMPT_ZH, 24, true);
    assert_eq!(zh.ids, ints(&c, "zh.ids"));
    let valid = zh.mask.iter().filter(|&&m| m == 1).count();
    assert_eq!(valid, ints(&c, "zh.valid")[0] as usize);

    let store = hf_store();
    let source = T5Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config = T5Config::detect(&loader.root("")).unwrap();
    let model = T5Encoder::new(&loader.root(""), config).unwrap();
    check_tokenizer(&model, &tok, &path.display().to_string()).expect("matching tokenizer");

    // The T5 v1.1 tokenizer users already have for FLUX/SD3 is the wrong one for umT5.
    let t5_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tokenizers/t5-v1_1.tokenizer.json");
    let t5_tok = load_t5_tokenizer(&t5_path).expect("T5 tokenizer");
    let err = check_tokenizer(&model, &t5_tok, "t5-v1_1.tokenizer.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("google/umt5-xxl") && err.contains("--t5xxl-tokenizer"),
        "{err}"
    );
}

#[test]
fn tokenizer_size_check() {
    // umt5-xxl: 256384 rows; its tokenizer.json has 256300 ids, spiece.model + 100 extras 256100.
    assert!(check_tokenizer_size(256_384, true, 256_300, "tok").is_ok());
    assert!(check_tokenizer_size(256_384, true, 256_100, "tok").is_ok());
    assert!(check_tokenizer_size(32_128, false, 32_100, "tok").is_ok());
    let err = check_tokenizer_size(256_384, true, 32_100, "t5/tokenizer.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t5/tokenizer.json")
            && err.contains("32100")
            && err.contains("256384")
            && err.contains("tokenizer.json (or spiece.model) of google/umt5-xxl")
            && err.contains("--t5xxl-tokenizer"),
        "{err}"
    );
    let err = check_tokenizer_size(32_128, false, 256_300, "umt5/tokenizer.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("google/t5-v1_1-xxl"), "{err}");
}
