//! Parity of the Qwen3-VL text encoder with diffusers' `QwenImage21Pipeline.encode_prompt`.
//! Fixtures: tests/reference/qwen3_te_fixtures.py → tests/fixtures/qwen3_te/ (tiny random
//! `Qwen3VLForConditionalGeneration`: hidden 32, 3 layers, 4 heads / 2 KV heads, head_dim 16,
//! intermediate 48, rope θ 5e6) with the tiny Qwen tokenizer of tests/fixtures/qwen_tokenizer/tiny.
//!
//! Tolerances (max abs error ≤ tol · max(1, max |reference|)):
//! - f32 weights, every file layout: 1e-4 (layouts also agree bit for bit).
//! - flash attention (K/V rounded to f16): 5e-3.
//! - GGUF with Q8_0 matmul weights and embedding: 1.5e-1, a sanity bound for the quantized path
//!   (weights and activations are quantized to 8 bits; a wrong layout gives errors of the order
//!   of the scale).

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::te::qwen3::{
    self, qwen3_hparams, qwen3_llamacpp_to_hf, Qwen3Config, Qwen3Source, Qwen3TextModel,
};
use sd_cli::pipeline::qwen_image_2_1::template::{
    encode_prompt as encode_qwen_image_21, prompt_ids as qwen_image_21_prompt_ids,
};
use sd_cli::runner::{convert_f32, RunOptions, Runner, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::tokenizers::{bpe_from_gguf_metadata, load_qwen_tokenizer, BpeTokenizer};
use sd_cli::weights::{Component, GgufType, GgufValue, GgufWriter, TensorStore};

const TOL: f32 = 1e-4;
const CASES: [&str; 3] = ["cat", "empty", "mixed"];

fn prompt(case: &str) -> &'static str {
    match case {
        "cat" => "a lovely cat holding a sign says 'qwen2.1.cpp'",
        "empty" => "",
        _ => "A neon sign reading \"OPEN 24/7\"\nabove a rainy street, 夜景 🐱, cinematic",
    }
}

fn cases() -> TensorStore {
    open_fixture("qwen3_te/cases.safetensors")
}

fn tiny_dir() -> std::path::PathBuf {
    fixture_path("qwen_tokenizer/tiny")
}

fn tokenizer() -> BpeTokenizer {
    load_qwen_tokenizer(&tiny_dir().join("tokenizer.json")).expect("tiny tokenizer")
}

fn ints(store: &TensorStore, name: &str) -> Vec<i32> {
    tensor(store, name).data.iter().map(|&v| v as i32).collect()
}

/// A [tokens, hidden] reference as a ggml [hidden, tokens] host tensor.
fn reference(store: &TensorStore, name: &str) -> HostTensor {
    let t = tensor(store, name);
    HostTensor::new([t.ne[0], t.ne[1], 1, 1], t.data).unwrap()
}

struct Loaded {
    config: Qwen3Config,
    model: Qwen3TextModel,
    runner: Runner,
}

fn load(store: &TensorStore, prefix: &str, wtype: Option<DType>, flash: bool) -> Loaded {
    let backend = cpu();
    let source = Qwen3Source::new(store, prefix);
    let loader = WeightLoader::new(&source, wtype);
    let (theta, eps) = qwen3_hparams(store);
    let config = Qwen3Config::detect(&loader.root(""), Some(theta), Some(eps)).expect("detect");
    let model = Qwen3TextModel::new(&loader.root(""), config.clone()).expect("declare");
    let weights = loader.finish(&backend, "qwen3").expect("load");
    let runner = Runner::new(
        "qwen3",
        backend,
        Some(weights),
        RunOptions {
            flash_attn: flash,
            ..RunOptions::default()
        },
    );
    Loaded {
        config,
        model,
        runner,
    }
}

fn hf_store() -> TensorStore {
    open_fixture("qwen3_te/text_encoder")
}

/// Prompt embeddings of every case (pipeline path: template, encode, drop).
fn embeds(l: &Loaded) -> Vec<HostTensor> {
    let tok = tokenizer();
    CASES
        .iter()
        .map(|c| encode_qwen_image_21(&l.runner, &l.model, &tok, prompt(c)).expect("encode"))
        .collect()
}

fn check_embeds(outs: &[HostTensor], tol: f32, what: &str) -> f32 {
    let c = cases();
    let mut worst = 0.0f32;
    for (case, got) in CASES.iter().zip(outs) {
        let want = reference(&c, &format!("{case}.embeds"));
        worst = worst.max(assert_close(&format!("{what} {case}"), got, &want, tol));
    }
    worst
}

#[test]
fn config_detected_from_weights() {
    let store = hf_store();
    let l = load(&store, "", None, false);
    assert_eq!(
        l.config,
        Qwen3Config {
            vocab: 1026,
            hidden: 32,
            layers: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 48,
            eps: 1e-6,
            rope_theta: 5e6,
            qk_norm: true,
            qkv_bias: false,
        }
    );
}

#[test]
fn template_ids_match_processor() {
    let tok = tokenizer();
    let c = cases();
    for case in CASES {
        let (ids, drop_idx) = qwen_image_21_prompt_ids(&tok, prompt(case));
        let want: Vec<u32> = ints(&c, &format!("{case}.ids"))
            .into_iter()
            .map(|i| i as u32)
            .collect();
        assert_eq!(ids, want, "{case}");
        assert_eq!(
            drop_idx as i32,
            ints(&c, &format!("{case}.drop"))[0],
            "{case}"
        );
    }
}

#[test]
fn hf_folder_matches_pipeline() {
    let l = load(&hf_store(), "", None, false);
    check_embeds(&embeds(&l), TOL, "f32");
}

#[test]
fn layers_to_run_and_final_norm() {
    let l = load(&hf_store(), "", None, false);
    let c = cases();
    let ids = ints(&c, "cat.ids");
    let n = ids.len();
    let run = |layers: Option<usize>, norm: bool| {
        l.runner
            .compute(|g| {
                let t = g.input_i32("ids", [n, 1, 1, 1], ids.clone());
                vec![l.model.forward(g, t, layers, norm)]
            })
            .unwrap()
            .pop()
            .unwrap()
    };
    assert_close(
        "full pre-norm",
        &run(None, false),
        &reference(&c, "cat.full"),
        TOL,
    );
    assert_close(
        "final norm",
        &run(None, true),
        &reference(&c, "cat.normed"),
        TOL,
    );
    assert_close(
        "2 layers",
        &run(Some(2), false),
        &reference(&c, "cat.layer1"),
        TOL,
    );
}

#[test]
fn plain_qwen3_layout_matches() {
    let store = open_fixture("qwen3_te/qwen3_plain.safetensors");
    assert!(store.contains("model.layers.0.self_attn.q_norm.weight"));
    let a = embeds(&load(&store, "", None, false));
    check_embeds(&a, TOL, "plain layout");
    assert_eq!(a, embeds(&load(&hf_store(), "", None, false)));
}

#[test]
fn rope_theta_from_config_changes_output() {
    // Same weights, θ = 1000 (as a config.json or GGUF metadata would say).
    let store = hf_store();
    assert_eq!(qwen3_hparams(&store), (5e6, 1e-6));
    let backend = cpu();
    let source = Qwen3Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config = Qwen3Config::detect(&loader.root(""), Some(1000.0), None).unwrap();
    let model = Qwen3TextModel::new(&loader.root(""), config).unwrap();
    let r = runner(Some(loader.finish(&backend, "q").unwrap()), backend, false);
    let ids = ints(&cases(), "cat.ids");
    let y = qwen3::encode(&r, &model, &ids).unwrap();
    assert_close("theta 1000", &y, &reference(&cases(), "theta1000.y"), TOL);
}

#[test]
fn flash_attention_within_tolerance() {
    let l = load(&hf_store(), "", None, true);
    check_embeds(&embeds(&l), 5e-3, "flash attention");
}

/// Plain Qwen3 name → llama.cpp GGUF name (the inverse of `qwen3_llamacpp_to_hf`).
fn hf_to_llamacpp(name: &str) -> String {
    let out = match name {
        "embed_tokens.weight" => "token_embd.weight".to_string(),
        "norm.weight" => "output_norm.weight".to_string(),
        _ => {
            let rest = name.strip_prefix("layers.").unwrap();
            let (i, tail) = rest.split_once('.').unwrap();
            let short = match tail {
                "self_attn.q_proj.weight" => "attn_q",
                "self_attn.k_proj.weight" => "attn_k",
                "self_attn.v_proj.weight" => "attn_v",
                "self_attn.o_proj.weight" => "attn_output",
                "self_attn.q_norm.weight" => "attn_q_norm",
                "self_attn.k_norm.weight" => "attn_k_norm",
                "input_layernorm.weight" => "attn_norm",
                "post_attention_layernorm.weight" => "ffn_norm",
                "mlp.gate_proj.weight" => "ffn_gate",
                "mlp.up_proj.weight" => "ffn_up",
                "mlp.down_proj.weight" => "ffn_down",
                other => panic!("unexpected tensor {other}"),
            };
            format!("blk.{i}.{short}.weight")
        }
    };
    assert_eq!(qwen3_llamacpp_to_hf(&out).as_deref(), Some(name));
    out
}

fn str_array(items: Vec<String>) -> GgufValue {
    GgufValue::Array(
        GgufType::String,
        items.into_iter().map(GgufValue::String).collect(),
    )
}

/// Writes the fixture weights as a llama.cpp `qwen3vl` GGUF (rope base `theta`, the tiny
/// tokenizer in its metadata); `quantize` stores 2-D weights whose rows split into 32-blocks as
/// Q8_0.
fn write_gguf(path: &Path, theta: f32, quantize: bool) {
    let store = hf_store();
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", GgufValue::String("qwen3vl".into()))
        .unwrap();
    w.add_kv("qwen3vl.rope.freq_base", GgufValue::F32(theta))
        .unwrap();
    w.add_kv(
        "qwen3vl.attention.layer_norm_rms_epsilon",
        GgufValue::F32(1e-6),
    )
    .unwrap();
    // The tiny tokenizer as llama.cpp stores it.
    let vocab: HashMap<String, usize> =
        serde_json::from_str(&std::fs::read_to_string(tiny_dir().join("vocab.json")).unwrap())
            .unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, &i) in &vocab {
        tokens[i] = t.clone();
    }
    let mut types = vec![GgufValue::I32(1); tokens.len()];
    for t in sd_cli::tokenizers::QWEN_ADDED_TOKENS {
        types.push(GgufValue::I32(if t.starts_with("<|") { 3 } else { 4 }));
        tokens.push(t.to_string());
    }
    let merges: Vec<String> = std::fs::read_to_string(tiny_dir().join("merges.txt"))
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    w.add_kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
        .unwrap();
    w.add_kv("tokenizer.ggml.pre", GgufValue::String("qwen2".into()))
        .unwrap();
    w.add_kv("tokenizer.ggml.tokens", str_array(tokens))
        .unwrap();
    w.add_kv("tokenizer.ggml.merges", str_array(merges))
        .unwrap();
    w.add_kv(
        "tokenizer.ggml.token_type",
        GgufValue::Array(GgufType::I32, types),
    )
    .unwrap();

    let mut data = Vec::new();
    for info in store.iter() {
        let local = info.name.strip_prefix("model.language_model.").unwrap();
        let ne: Vec<u64> = info.ne[..info.n_dims].iter().map(|&d| d as u64).collect();
        let values = store.to_f32(info).unwrap();
        let (dtype, bytes) = if quantize && info.n_dims == 2 && info.ne[0].is_multiple_of(32) {
            (
                DType::Q8_0,
                convert_f32(&values, DType::Q8_0, info.ne[0]).unwrap(),
            )
        } else {
            (DType::F32, store.load_bytes(info).unwrap().into_owned())
        };
        w.add_tensor(&hf_to_llamacpp(local), dtype, &ne).unwrap();
        data.push(bytes);
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    w.write(path, &refs).unwrap();
}

fn gguf_store(path: &Path) -> TensorStore {
    // Loaded as `--llm` would be: under the LLM component prefix.
    let mut store = TensorStore::new();
    store.add_file(path, Component::Llm.prefix()).unwrap();
    store
}

#[test]
fn llamacpp_gguf_layout_matches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3vl.gguf");
    write_gguf(&path, 5e6, false);
    let store = gguf_store(&path);
    assert!(store.contains("text_encoders.llm.blk.0.attn_q_norm.weight"));
    assert!(Qwen3Source::new(&store, Component::Llm.prefix()).is_llamacpp());
    let l = load(&store, Component::Llm.prefix(), None, false);
    assert_eq!(l.config.layers, 3);
    let a = embeds(&l);
    check_embeds(&a, TOL, "gguf layout");
    assert_eq!(a, embeds(&load(&hf_store(), "", None, false)));

    // The tokenizer in the GGUF metadata gives the same ids as tokenizer.json.
    let meta = &store.files()[0].gguf;
    let tok = bpe_from_gguf_metadata(meta, "qwen3vl.gguf")
        .expect("gguf has a tokenizer")
        .unwrap();
    for case in CASES {
        assert_eq!(
            qwen_image_21_prompt_ids(&tok, prompt(case)),
            qwen_image_21_prompt_ids(&tokenizer(), prompt(case))
        );
    }
}

#[test]
fn gguf_rope_theta_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3vl-theta.gguf");
    write_gguf(&path, 1000.0, false);
    let store = gguf_store(&path);
    let l = load(&store, Component::Llm.prefix(), None, false);
    assert_eq!(l.config.rope_theta, 1000.0);
    let ids = ints(&cases(), "cat.ids");
    let y = qwen3::encode(&l.runner, &l.model, &ids).unwrap();
    assert_close(
        "gguf theta 1000",
        &y,
        &reference(&cases(), "theta1000.y"),
        TOL,
    );
}

#[test]
fn q8_0_gguf_within_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen3vl-q8_0.gguf");
    write_gguf(&path, 5e6, true);
    let store = gguf_store(&path);
    let q = store
        .get("text_encoders.llm.blk.0.attn_q.weight")
        .unwrap()
        .dtype;
    assert_eq!(q, DType::Q8_0);
    let l = load(&store, Component::Llm.prefix(), None, false);
    check_embeds(&embeds(&l), 1.5e-1, "q8_0 gguf");
}

#[test]
fn bad_inputs_are_errors() {
    let empty = TensorStore::new();
    let source = Qwen3Source::new(&empty, "");
    let loader = WeightLoader::new(&source, None);
    let err = Qwen3Config::detect(&loader.root(""), None, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("embed_tokens.weight"), "{err}");

    let l = load(&hf_store(), "", None, false);
    let err = qwen3::encode(&l.runner, &l.model, &[5, 1026, 1])
        .unwrap_err()
        .to_string();
    assert!(err.contains("token id 1026"), "{err}");
    assert!(qwen3::encode(&l.runner, &l.model, &[]).is_err());
}
