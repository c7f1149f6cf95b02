//! Writes a tiny T5 text encoder with its tokenizer inside one GGUF file, so the whole
//! PixArt pipeline can run without any download (see `scripts/demo`).
//!
//! `cargo run --release --example demo_model -- <out-dir>`: converts the tiny random-weight
//! T5 of tests/fixtures/pixart_pipeline to `<out-dir>/t5_demo.gguf` and embeds a small
//! SentencePiece-style vocabulary (tokenizer.ggml.* metadata) in it. The transformer and VAE
//! fixtures next to it are used as they are (diffusers folders).

use std::borrow::Cow;
use std::path::PathBuf;

use sd_cli::weights::{GgufType, GgufValue, GgufWriter, TensorStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "demo".into()));
    std::fs::create_dir_all(&out_dir)?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pixart_pipeline");
    let store = TensorStore::open(&root.join("text_encoder"))?;

    // A small unigram vocabulary: specials, the word marker, letters and a few words.
    let mut tokens: Vec<String> = vec![
        "<pad>".into(),
        "</s>".into(),
        "<unk>".into(),
        "\u{2581}".into(),
    ];
    let mut types = vec![3, 3, 2, 1];
    for c in 'a'..='z' {
        tokens.push(c.to_string());
        tokens.push(format!("\u{2581}{c}"));
        types.extend([1, 1]);
    }
    for w in ["cat", "dog", "lovely", "a", "photo", "of", "the", "sign"] {
        tokens.push(format!("\u{2581}{w}"));
        types.push(1);
    }
    let scores: Vec<f32> = tokens
        .iter()
        .map(|t| -(t.chars().count() as f32).recip() - 1.0)
        .collect();

    let mut w = GgufWriter::new();
    w.add_kv("general.name", GgufValue::String("sd-cli demo T5".into()))?;
    w.add_kv(
        "tokenizer.ggml.tokens",
        GgufValue::Array(
            GgufType::String,
            tokens.iter().cloned().map(GgufValue::String).collect(),
        ),
    )?;
    w.add_kv(
        "tokenizer.ggml.scores",
        GgufValue::Array(
            GgufType::F32,
            scores.into_iter().map(GgufValue::F32).collect(),
        ),
    )?;
    w.add_kv(
        "tokenizer.ggml.token_type",
        GgufValue::Array(
            GgufType::I32,
            types.into_iter().map(GgufValue::I32).collect(),
        ),
    )?;
    let infos: Vec<_> = store.iter().collect();
    for info in &infos {
        let ne: Vec<u64> = info.shape().iter().map(|&d| d as u64).collect();
        w.add_tensor(&info.name, info.dtype, &ne)?;
    }
    let out = out_dir.join("t5_demo.gguf");
    w.write_with(&out, |i| {
        store
            .load_bytes(infos[i])
            .map(|b| Cow::Owned(b.into_owned()))
    })?;
    println!("wrote {}", out.display());
    Ok(())
}
