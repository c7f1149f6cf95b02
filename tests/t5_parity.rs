//! Parity of the T5 v1.1 encoder with transformers' `T5EncoderModel`.
//! Fixtures: tests/reference/t5_fixtures.py → tests/fixtures/t5/ (tiny random model: d_model 32,
//! 4 heads × d_kv 10, d_ff 48, 3 layers, vocab 100, 32 buckets / max distance 128).
//!
//! Tolerances (max abs error ≤ tol · max(1, max |reference|), real-token rows only):
//! - f32 weights: 1e-4.
//! - f16 weights: 3e-3 against the reference run with the same f16-rounded weights (ggml's CPU
//!   matmul also rounds the activations to f16 for f16 weights, an error of the same size as
//!   the weight rounding), and 1e-2 against the f32 model.
//! - `--type q8_0`: 1.5e-1 against the f32 model (a sanity bound for the quantized path).
//! - every file layout (HF folder, sd.cpp prefix, llama.cpp GGUF) gives bit-identical results.

mod common;

use std::path::Path;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::te::t5::{self, relative_position_bucket, T5Config, T5Encoder, T5Source};
use sd_cli::runner::WeightLoader;
use sd_cli::tensor::HostTensor;
use sd_cli::weights::names::t5_llamacpp_to_hf;
use sd_cli::weights::{Component, GgufWriter, TensorStore};

const TOL: f32 = 1e-4;
const CASES: [&str; 3] = ["pad", "full", "long"];

fn cases() -> TensorStore {
    open_fixture("t5/cases.safetensors")
}

fn ints(store: &TensorStore, name: &str) -> Vec<i32> {
    tensor(store, name).data.iter().map(|&v| v as i32).collect()
}

/// Loads the encoder from `prefix` of `store` (optionally converting matmul weights) and runs
/// every case; returns (case, output) pairs.
fn run_all(
    store: &TensorStore,
    prefix: &str,
    wtype: Option<DType>,
) -> (T5Config, Vec<(String, usize, HostTensor)>) {
    let backend = cpu();
    let source = T5Source::new(store, prefix);
    let loader = WeightLoader::new(&source, wtype);
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
    (config, outs)
}

/// The first `valid` token rows of a [d_model, n] tensor.
fn real_rows(t: &HostTensor, valid: usize) -> HostTensor {
    let d = t.ne[0];
    HostTensor::new([d, valid, 1, 1], t.data[..d * valid].to_vec()).unwrap()
}

fn check_against(outs: &[(String, usize, HostTensor)], key: &str, tol: f32, what: &str) {
    let c = cases();
    for (case, valid, got) in outs {
        let want = tensor(&c, &format!("{case}.{key}"));
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

fn assert_identical(a: &[(String, usize, HostTensor)], b: &[(String, usize, HostTensor)]) {
    for ((case, _, x), (_, _, y)) in a.iter().zip(b) {
        assert_eq!(x.ne, y.ne, "{case}");
        assert!(x.data == y.data, "{case}: layouts disagree");
    }
}

fn hf_store() -> TensorStore {
    open_fixture("t5/text_encoder")
}

#[test]
fn buckets_match_torch() {
    let c = cases();
    let rel = ints(&c, "buckets.rel");
    let want = ints(&c, "buckets.bucket");
    for (r, w) in rel.iter().zip(&want) {
        assert_eq!(
            relative_position_bucket(i64::from(*r), 32, 128) as i32,
            *w,
            "relative position {r}"
        );
    }
}

#[test]
fn config_detected_from_weights() {
    let store = hf_store();
    let source = T5Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let c = T5Config::detect(&loader.root("")).unwrap();
    assert_eq!(
        c,
        T5Config {
            vocab: 100,
            d_model: 32,
            d_kv: 10,
            num_heads: 4,
            d_ff: 48,
            num_layers: 3,
            num_buckets: 32,
            max_distance: 128,
            eps: 1e-6,
        }
    );
}

#[test]
fn hf_folder_matches_transformers() {
    let (_, outs) = run_all(&hf_store(), "", None);
    check_against(&outs, "y", TOL, "f32");
}

#[test]
fn padding_is_masked() {
    // Real tokens with padding must differ from the same ids run without a mask.
    let store = hf_store();
    let (_, outs) = run_all(&store, "", None);
    let (_, valid, masked) = &outs[0];
    let backend = cpu();
    let source = T5Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config = T5Config::detect(&loader.root("")).unwrap();
    let model = T5Encoder::new(&loader.root(""), config).unwrap();
    let r = runner(Some(loader.finish(&backend, "t5").unwrap()), backend, false);
    let ids = ints(&cases(), "pad.ids");
    let unmasked = t5::encode(&r, &model, &ids, ids.len()).unwrap();
    let diff = max_abs_diff(&real_rows(&unmasked, *valid), &real_rows(masked, *valid));
    assert!(diff > 1e-2, "mask had no effect ({diff})");
}

#[test]
fn sdcpp_prefix_layout_matches() {
    // ComfyUI / sd.cpp single file: `text_encoders.t5xxl.transformer.` names, embedding stored
    // as `encoder.embed_tokens.weight`.
    let store = open_fixture("t5/t5_sdcpp.safetensors");
    assert!(store.contains("text_encoders.t5xxl.transformer.encoder.final_layer_norm.weight"));
    let (_, outs) = run_all(&store, Component::T5.prefix(), None);
    check_against(&outs, "y", TOL, "sd.cpp layout");
    assert_identical(&outs, &run_all(&hf_store(), "", None).1);
}

/// HF T5 name → llama.cpp GGUF name (the inverse of `t5_llamacpp_to_hf`, written out here).
fn hf_to_llamacpp(name: &str) -> String {
    let out = if name == "shared.weight" {
        "token_embd.weight".to_string()
    } else if name == "encoder.final_layer_norm.weight" {
        "enc.output_norm.weight".to_string()
    } else {
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
    };
    assert_eq!(t5_llamacpp_to_hf(&out).as_deref(), Some(name));
    out
}

fn write_llamacpp_gguf(path: &Path) {
    let store = hf_store();
    let mut writer = GgufWriter::new();
    let mut data = Vec::new();
    for info in store.iter() {
        assert_eq!(info.dtype, DType::F32);
        let ne: Vec<u64> = info.ne[..info.n_dims].iter().map(|&d| d as u64).collect();
        writer
            .add_tensor(&hf_to_llamacpp(&info.name), DType::F32, &ne)
            .unwrap();
        data.push(store.load_bytes(info).unwrap().into_owned());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    writer.write(path, &refs).unwrap();
}

#[test]
fn llamacpp_gguf_layout_matches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t5-llamacpp.gguf");
    write_llamacpp_gguf(&path);
    // Loaded as `--t5xxl` would be: under the T5 component prefix.
    let mut store = TensorStore::new();
    store.add_file(&path, Component::T5.prefix()).unwrap();
    assert!(store.contains("text_encoders.t5xxl.transformer.enc.blk.0.attn_rel_b.weight"));
    let source = T5Source::new(&store, Component::T5.prefix());
    assert!(source.is_llamacpp());
    let (config, outs) = run_all(&store, Component::T5.prefix(), None);
    assert_eq!(config.num_layers, 3);
    check_against(&outs, "y", TOL, "gguf layout");
    assert_identical(&outs, &run_all(&hf_store(), "", None).1);
}

#[test]
fn f16_weights_within_tolerance() {
    let store = open_fixture("t5/t5_f16.safetensors");
    let (_, outs) = run_all(&store, "", None);
    check_against(
        &outs,
        "y_f16w",
        3e-3,
        "f16 weights vs f16-rounded reference",
    );
    check_against(&outs, "y", 1e-2, "f16 weights vs f32 reference");
}

#[test]
fn q8_0_weights_within_tolerance() {
    // `--type q8_0`: q/k/v/wi_0/wi_1 (rows of 32) and the embedding table become Q8_0 (quantized
    // get_rows); o/wo rows of 40/48 do not split into blocks and stay f32.
    let (_, outs) = run_all(&hf_store(), "", Some(DType::Q8_0));
    // Q8_0 steps are ~1/127 of each block's max (activations are quantized too): this checks the
    // quantized path is sane (measured ≤ 9% of scale; a wrong layout gives errors of the order of the scale), not bit-closeness.
    check_against(&outs, "y", 1.5e-1, "q8_0 weights");
}

#[test]
fn missing_and_bad_inputs_are_errors() {
    let empty = TensorStore::new();
    let source = T5Source::new(&empty, "");
    let loader = WeightLoader::new(&source, None);
    let err = T5Config::detect(&loader.root("")).unwrap_err().to_string();
    assert!(err.contains("shared.weight"), "{err}");

    let store = hf_store();
    let backend = cpu();
    let source = T5Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config = T5Config::detect(&loader.root("")).unwrap();
    let model = T5Encoder::new(&loader.root(""), config).unwrap();
    let r = runner(Some(loader.finish(&backend, "t5").unwrap()), backend, false);
    let err = t5::encode(&r, &model, &[5, 100, 1], 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("token id 100"), "{err}");
    assert!(t5::encode(&r, &model, &[], 0).is_err());
}
