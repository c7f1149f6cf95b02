//! Qwen2 byte-level BPE tokenizer against HF `tokenizers` (transformers' `Qwen2Tokenizer`)
//! (fixtures: tests/reference/qwen_tokenizer_fixtures.py).
//!
//! The full vocabulary is derived from the real Qwen2 merges (shared/tokenizers/qwen2.merges.txt,
//! found in a `shared/` folder above the crate): 256 byte symbols in GPT-2 order, one token per
//! merge result in merge order, then the Qwen added tokens from 151643 — the reference script
//! builds the same vocabulary, so ids are compared exactly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sd_cli::pipeline::qwen_image_2_1::template::prompt_ids as qwen_image_21_prompt_ids;
use sd_cli::tokenizers::bpe::byte_symbols_in_vocab_order;
use sd_cli::tokenizers::{
    bpe_from_gguf_vocab, bpe_from_tokenizer_json, bpe_from_vocab_merges, find_qwen_tokenizer,
    load_qwen_tokenizer, nfc, BpeTokenizer, QWEN_ADDED_TOKENS,
};
use serde::Deserialize;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen_tokenizer");

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Templated {
    prompt: String,
    ids: Vec<u32>,
    drop_idx: usize,
}

fn read<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let path = format!("{FIX}/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// shared/tokenizers/qwen2.merges.txt in the nearest ancestor of the crate that has it.
fn merges_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|d| d.join("shared/tokenizers/qwen2.merges.txt"))
        .find(|p| p.is_file())
        .expect("shared/tokenizers/qwen2.merges.txt above the crate")
}

fn merges_lines() -> Vec<String> {
    let text = std::fs::read_to_string(merges_path()).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// The Qwen2 token list: byte symbols, merge results, added tokens (id = index).
fn qwen_tokens(merges: &[String]) -> Vec<String> {
    let mut tokens: Vec<String> = byte_symbols_in_vocab_order()
        .into_iter()
        .map(String::from)
        .collect();
    tokens.extend(merges.iter().map(|m| m.replace(' ', "")));
    tokens.extend(QWEN_ADDED_TOKENS.iter().map(|t| t.to_string()));
    tokens
}

fn full_tokenizer() -> BpeTokenizer {
    let merges = merges_lines();
    let tokens = qwen_tokens(&merges);
    assert_eq!(tokens.len(), 151643 + 26);
    // llama.cpp token types: 1 normal, 3 control, 4 user-defined (the non-special added ones).
    let types: Vec<i32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if i < 151643 {
                1
            } else if t.starts_with("<|") {
                3
            } else {
                4
            }
        })
        .collect();
    bpe_from_gguf_vocab(
        &tokens,
        &merges,
        Some(&types),
        Some("qwen2"),
        "qwen2 merges",
    )
    .unwrap()
}

fn check_cases(tok: &BpeTokenizer, cases: &[Case], what: &str) {
    let mut failures = Vec::new();
    for c in cases {
        let got = tok.encode(&c.text);
        if got != c.ids {
            failures.push(format!(
                "{:?}\n  got  {:?}\n  want {:?}",
                c.text, got, c.ids
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{what}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(8)].join("\n")
    );
}

#[test]
fn full_vocab_ids_match_hf() {
    let tok = full_tokenizer();
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(151643));
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(151644));
    assert_eq!(tok.token_to_id("<|image_pad|>"), Some(151655));
    assert_eq!(tok.token_to_id("</think>"), Some(151668));
    let cases: Vec<Case> = read("cases.json");
    assert!(cases.len() >= 300, "fixture too small: {}", cases.len());
    check_cases(&tok, &cases, "full Qwen2 vocabulary");
    // Decoding inverts encoding (up to NFC).
    for c in &cases {
        assert_eq!(tok.decode(&c.ids), nfc(&c.text), "decode {:?}", c.text);
    }
}

#[test]
fn full_vocab_from_vocab_json_matches() {
    // The same vocabulary as a vocab.json map + merges.txt text, added tokens defaulted.
    let merges = merges_lines();
    let tokens = qwen_tokens(&merges);
    let vocab: HashMap<&str, usize> = tokens[..151643]
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let vocab_json = serde_json::to_string(&vocab).unwrap();
    let merges_txt = format!("#version: 0.2\n{}\n", merges.join("\n"));
    let tok = bpe_from_vocab_merges(&vocab_json, &merges_txt, Vec::new(), "vocab.json").unwrap();
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(151645));
    let cases: Vec<Case> = read("cases.json");
    check_cases(&tok, &cases[..120], "vocab.json + merges.txt");
}

#[test]
fn template_and_drop_idx_match_pipeline() {
    let tok = full_tokenizer();
    let cases: Vec<Templated> = read("template.json");
    for c in &cases {
        let (ids, drop_idx) = qwen_image_21_prompt_ids(&tok, &c.prompt);
        assert_eq!(ids, c.ids, "{:?}", c.prompt);
        assert_eq!(drop_idx, c.drop_idx);
    }
    // The empty prompt is encoded as " ".
    assert_eq!(
        qwen_image_21_prompt_ids(&tok, "").0,
        qwen_image_21_prompt_ids(&tok, " ").0
    );
}

#[test]
fn tiny_tokenizer_json_and_vocab_pair_match_hf() {
    let cases: Vec<Case> = read("tiny_cases.json");
    let from_json = load_qwen_tokenizer(&Path::new(FIX).join("tiny/tokenizer.json")).unwrap();
    assert_eq!(from_json.vocab_size(), 1026);
    check_cases(&from_json, &cases, "tiny tokenizer.json");
    let from_pair = load_qwen_tokenizer(&Path::new(FIX).join("tiny/merges.txt")).unwrap();
    check_cases(&from_pair, &cases, "tiny vocab.json + merges.txt");
}

#[test]
fn unsupported_and_broken_files_are_errors() {
    let text = std::fs::read_to_string(Path::new(FIX).join("tiny/tokenizer.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["model"]["type"] = "Unigram".into();
    let err = bpe_from_tokenizer_json(&v.to_string(), "x.json").unwrap_err();
    assert!(err.to_string().contains("Unigram"), "{err}");

    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["model"]["merges"][3] = serde_json::json!(["zz", "qq"]);
    let err = bpe_from_tokenizer_json(&v.to_string(), "x.json").unwrap_err();
    assert!(err.to_string().contains("not in the vocabulary"), "{err}");

    assert!(bpe_from_tokenizer_json("{", "x.json").is_err());
    assert!(bpe_from_vocab_merges("{}", "a b\n", Vec::new(), "v").is_err());
    assert!(bpe_from_gguf_vocab(&["a".into()], &[], Some(&[]), None, "g").is_err());
}

#[test]
fn finder_search_order_and_message() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let te = root.join("text_encoder");
    std::fs::create_dir_all(&te).unwrap();
    let weights = te.join("model.safetensors");
    std::fs::write(&weights, b"x").unwrap();

    let err = find_qwen_tokenizer(None, &weights).unwrap_err().to_string();
    assert!(
        err.contains("Qwen/Qwen3-VL-8B-Instruct") && err.contains("tokenizer.json"),
        "{err}"
    );
    assert!(
        err.contains(&root.join("processor").display().to_string()),
        "{err}"
    );

    let tok_dir = root.join("tokenizer");
    std::fs::create_dir_all(&tok_dir).unwrap();
    std::fs::write(tok_dir.join("vocab.json"), b"{}").unwrap();
    std::fs::write(tok_dir.join("merges.txt"), b"").unwrap();
    assert_eq!(
        find_qwen_tokenizer(None, &weights).unwrap(),
        tok_dir.join("vocab.json")
    );

    let proc_dir = root.join("processor");
    std::fs::create_dir_all(&proc_dir).unwrap();
    std::fs::write(proc_dir.join("tokenizer.json"), b"{}").unwrap();
    assert_eq!(
        find_qwen_tokenizer(None, &weights).unwrap(),
        proc_dir.join("tokenizer.json")
    );

    std::fs::write(te.join("tokenizer.json"), b"{}").unwrap();
    assert_eq!(
        find_qwen_tokenizer(None, &weights).unwrap(),
        te.join("tokenizer.json")
    );
    assert_eq!(
        find_qwen_tokenizer(None, &te).unwrap(),
        te.join("tokenizer.json")
    );

    let explicit = root.join("mine.json");
    assert!(find_qwen_tokenizer(Some(&explicit), &weights).is_err());
    std::fs::write(&explicit, b"{}").unwrap();
    assert_eq!(
        find_qwen_tokenizer(Some(&explicit), &weights).unwrap(),
        explicit
    );
    assert_eq!(
        find_qwen_tokenizer(Some(&proc_dir), &weights).unwrap(),
        proc_dir.join("tokenizer.json")
    );
}
