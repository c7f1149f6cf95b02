//! Building a byte-level BPE tokenizer from the files that carry one: HF `tokenizer.json`,
//! a `vocab.json` + `merges.txt` pair, or GGUF metadata (llama.cpp convention); and finding the
//! Qwen tokenizer that belongs to an LLM text encoder.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::bpe::{BpeOptions, BpeTokenizer, GPT2_PATTERN, QWEN_ADDED_TOKENS};
use super::error::TokenizerError;
use crate::weights::GgufMetadata;

fn format_err(path: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::Format {
        path: path.to_string(),
        reason: reason.into(),
    }
}

fn unsupported(path: &str, feature: impl Into<String>) -> TokenizerError {
    TokenizerError::Unsupported {
        path: path.to_string(),
        feature: feature.into(),
    }
}

fn split_merge(line: &str, path: &str, i: usize) -> Result<(String, String), TokenizerError> {
    let (a, b) = line
        .split_once(' ')
        .ok_or_else(|| format_err(path, format!("merge {i} {line:?} is not \"left right\"")))?;
    if a.is_empty() || b.is_empty() || b.contains(' ') {
        return Err(format_err(
            path,
            format!("merge {i} {line:?} is not \"left right\""),
        ));
    }
    Ok((a.to_string(), b.to_string()))
}

fn id_u32(v: u64, path: &str, what: &str) -> Result<u32, TokenizerError> {
    u32::try_from(v)
        .ok()
        .filter(|&i| i < i32::MAX as u32)
        .ok_or_else(|| format_err(path, format!("{what}: id {v} out of range")))
}

/// Builds a tokenizer from the text of a HF `tokenizer.json` with a BPE model and a byte-level
/// pre-tokenizer (GPT-2 / Qwen2 / Qwen3 style); `path` names it in errors.
pub fn bpe_from_tokenizer_json(text: &str, path: &str) -> Result<BpeTokenizer, TokenizerError> {
    let root: Value =
        serde_json::from_str(text).map_err(|e| format_err(path, format!("not JSON: {e}")))?;
    let model = root
        .get("model")
        .ok_or_else(|| format_err(path, "no \"model\" section"))?;
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
    if kind != "BPE" {
        return Err(unsupported(
            path,
            format!("model type {kind:?} (expected BPE)"),
        ));
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if let Some(s) = model.get(key).and_then(Value::as_str) {
            if !s.is_empty() {
                return Err(unsupported(path, format!("BPE {key} {s:?}")));
            }
        }
    }
    if model.get("byte_fallback").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(path, "BPE byte_fallback"));
    }
    let vocab_obj = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| format_err(path, "model.vocab is not an object"))?;
    let mut vocab = HashMap::with_capacity(vocab_obj.len());
    for (tok, id) in vocab_obj {
        let id = id
            .as_u64()
            .ok_or_else(|| format_err(path, format!("vocab entry {tok:?} has no integer id")))?;
        vocab.insert(tok.clone(), id_u32(id, path, tok)?);
    }
    let merges_list = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| format_err(path, "model.merges is not a list"))?;
    let mut merges = Vec::with_capacity(merges_list.len());
    for (i, m) in merges_list.iter().enumerate() {
        // Old files write "a b"; newer ones ["a", "b"].
        let pair = match m {
            Value::String(s) => split_merge(s, path, i)?,
            Value::Array(a) if a.len() == 2 => match (a[0].as_str(), a[1].as_str()) {
                (Some(x), Some(y)) => (x.to_string(), y.to_string()),
                _ => return Err(format_err(path, format!("merge {i} is not two strings"))),
            },
            _ => return Err(format_err(path, format!("merge {i} is not a pair"))),
        };
        merges.push(pair);
    }

    let mut added = Vec::new();
    if let Some(list) = root.get("added_tokens").and_then(Value::as_array) {
        for tok in list {
            let content = tok
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| format_err(path, "added token without content"))?;
            let id = tok
                .get("id")
                .and_then(Value::as_u64)
                .ok_or_else(|| format_err(path, format!("added token {content:?} without id")))?;
            let flag = |k: &str| tok.get(k).and_then(Value::as_bool).unwrap_or(false);
            if flag("lstrip") || flag("rstrip") || flag("single_word") || flag("normalized") {
                return Err(unsupported(
                    path,
                    format!("added token {content:?} with lstrip/rstrip/single_word/normalized"),
                ));
            }
            added.push((content.to_string(), id_u32(id, path, content)?));
        }
    }

    let nfc = match root.get("normalizer") {
        None | Some(Value::Null) => false,
        Some(n) => match n.get("type").and_then(Value::as_str) {
            Some("NFC") => true,
            other => return Err(unsupported(path, format!("normalizer {other:?}"))),
        },
    };
    let mut patterns = Vec::new();
    match root.get("pre_tokenizer") {
        None | Some(Value::Null) => {
            return Err(unsupported(path, "BPE without a byte-level pre_tokenizer"))
        }
        Some(p) => parse_pre_tokenizer(p, path, &mut patterns)?,
    }
    let options = BpeOptions {
        patterns,
        nfc,
        ignore_merges: model
            .get("ignore_merges")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    BpeTokenizer::new(vocab, &merges, added, options, path)
}

fn parse_pre_tokenizer(
    p: &Value,
    path: &str,
    patterns: &mut Vec<String>,
) -> Result<(), TokenizerError> {
    match p.get("type").and_then(Value::as_str) {
        Some("Sequence") => {
            let list = p
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| format_err(path, "Sequence pre_tokenizer without list"))?;
            for item in list {
                parse_pre_tokenizer(item, path, patterns)?;
            }
        }
        Some("Split") => {
            let re = p
                .get("pattern")
                .and_then(|pat| pat.get("Regex").or_else(|| pat.get("String")))
                .and_then(Value::as_str)
                .ok_or_else(|| format_err(path, "Split without pattern"))?;
            let behavior = p.get("behavior").and_then(Value::as_str);
            let invert = p.get("invert").and_then(Value::as_bool).unwrap_or(false);
            if behavior != Some("Isolated") || invert || p["pattern"].get("String").is_some() {
                return Err(unsupported(
                    path,
                    format!(
                        "Split pre_tokenizer {behavior:?} (invert {invert}); only regex Isolated"
                    ),
                ));
            }
            patterns.push(re.to_string());
        }
        Some("ByteLevel") => {
            if p.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                return Err(unsupported(path, "ByteLevel add_prefix_space"));
            }
            if p.get("use_regex").and_then(Value::as_bool).unwrap_or(true) {
                patterns.push(GPT2_PATTERN.to_string());
            }
        }
        other => return Err(unsupported(path, format!("pre_tokenizer {other:?}"))),
    }
    Ok(())
}

/// Builds a Qwen2-style tokenizer from the texts of a `vocab.json` and a `merges.txt`
/// (a `#version` first line is skipped). `added` lists the added tokens; when empty, the Qwen
/// added tokens ([`QWEN_ADDED_TOKENS`]) not already in the vocabulary are given the ids after it.
pub fn bpe_from_vocab_merges(
    vocab_json: &str,
    merges_txt: &str,
    added: Vec<(String, u32)>,
    origin: &str,
) -> Result<BpeTokenizer, TokenizerError> {
    let obj: HashMap<String, u64> = serde_json::from_str(vocab_json)
        .map_err(|e| format_err(origin, format!("vocab.json is not a token → id map: {e}")))?;
    let mut vocab = HashMap::with_capacity(obj.len());
    for (tok, id) in obj {
        let id = id_u32(id, origin, &tok)?;
        vocab.insert(tok, id);
    }
    let merges = merges_txt
        .lines()
        .enumerate()
        .filter(|(i, l)| !(l.trim().is_empty() || (*i == 0 && l.starts_with("#version"))))
        .map(|(i, l)| split_merge(l, origin, i))
        .collect::<Result<Vec<_>, _>>()?;
    let added = if added.is_empty() {
        default_qwen_added(&vocab)
    } else {
        added
    };
    BpeTokenizer::new(vocab, &merges, added, BpeOptions::qwen2(), origin)
}

/// The Qwen added tokens, numbered from one past the vocabulary's largest id.
fn default_qwen_added(vocab: &HashMap<String, u32>) -> Vec<(String, u32)> {
    let mut next = vocab.values().max().map_or(0, |&m| m + 1);
    QWEN_ADDED_TOKENS
        .iter()
        .map(|t| match vocab.get(*t) {
            Some(&id) => (t.to_string(), id),
            None => {
                next += 1;
                (t.to_string(), next - 1)
            }
        })
        .collect()
}

/// Token types of llama.cpp's GGUF vocabulary (`tokenizer.ggml.token_type`).
const GGUF_CONTROL: i32 = 3;
const GGUF_USER_DEFINED: i32 = 4;

/// Builds a tokenizer from GGUF vocabulary metadata (llama.cpp convention): `tokens` is
/// `tokenizer.ggml.tokens` (id = index), `merges` is `tokenizer.ggml.merges` ("left right"),
/// `token_types` is `tokenizer.ggml.token_type` (control and user-defined tokens are matched
/// as added tokens before BPE; without types, the Qwen added tokens are). `pre` is
/// `tokenizer.ggml.pre` ("qwen2" and "default"/"gpt-2" are known; None means qwen2).
pub fn bpe_from_gguf_vocab(
    tokens: &[String],
    merges: &[String],
    token_types: Option<&[i32]>,
    pre: Option<&str>,
    origin: &str,
) -> Result<BpeTokenizer, TokenizerError> {
    let options = match pre {
        None | Some("qwen2") => BpeOptions::qwen2(),
        Some("gpt-2") | Some("default") => BpeOptions {
            patterns: vec![GPT2_PATTERN.to_string()],
            nfc: false,
            ignore_merges: false,
        },
        Some(other) => return Err(unsupported(origin, format!("tokenizer.ggml.pre {other:?}"))),
    };
    if let Some(types) = token_types {
        if types.len() != tokens.len() {
            return Err(format_err(
                origin,
                format!("{} token types for {} tokens", types.len(), tokens.len()),
            ));
        }
    }
    let mut vocab = HashMap::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (i, tok) in tokens.iter().enumerate() {
        let id = id_u32(i as u64, origin, tok)?;
        let is_added = match token_types {
            Some(t) => t[i] == GGUF_CONTROL || t[i] == GGUF_USER_DEFINED,
            None => QWEN_ADDED_TOKENS.contains(&tok.as_str()),
        };
        if is_added {
            if !tok.is_empty() {
                added.push((tok.clone(), id));
            }
        } else {
            vocab.insert(tok.clone(), id);
        }
    }
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| split_merge(m, origin, i))
        .collect::<Result<Vec<_>, _>>()?;
    BpeTokenizer::new(vocab, &merges, added, options, origin)
}

/// [`bpe_from_gguf_vocab`] reading the values from a GGUF file's metadata; `None` when the
/// file carries no `gpt2`-model tokenizer.
pub fn bpe_from_gguf_metadata(
    meta: &GgufMetadata,
    origin: &str,
) -> Option<Result<BpeTokenizer, TokenizerError>> {
    if meta.get_str("tokenizer.ggml.model") != Some("gpt2") {
        return None;
    }
    let tokens: Vec<String> = meta
        .get_arr_str("tokenizer.ggml.tokens")?
        .into_iter()
        .map(str::to_string)
        .collect();
    let merges: Vec<String> = match meta.get_arr_str("tokenizer.ggml.merges") {
        Some(m) => m.into_iter().map(str::to_string).collect(),
        None => return Some(Err(format_err(origin, "GGUF tokenizer without merges"))),
    };
    let types = meta.get_arr_i32("tokenizer.ggml.token_type");
    Some(bpe_from_gguf_vocab(
        &tokens,
        &merges,
        types.as_deref(),
        meta.get_str("tokenizer.ggml.pre"),
        origin,
    ))
}

fn read_text(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Added tokens from a `tokenizer_config.json`'s `added_tokens_decoder` ({id: {content}}).
fn added_from_config(text: &str, path: &str) -> Result<Vec<(String, u32)>, TokenizerError> {
    let root: Value =
        serde_json::from_str(text).map_err(|e| format_err(path, format!("not JSON: {e}")))?;
    let mut out = Vec::new();
    if let Some(map) = root.get("added_tokens_decoder").and_then(Value::as_object) {
        for (id, tok) in map {
            let id: u64 = id
                .parse()
                .map_err(|_| format_err(path, format!("added token id {id:?}")))?;
            let content = tok
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| format_err(path, "added token without content"))?;
            out.push((content.to_string(), id_u32(id, path, content)?));
        }
    }
    Ok(out)
}

/// Loads a Qwen tokenizer from `tokenizer.json`, or from `vocab.json` / `merges.txt` (either
/// may be named; the other must sit beside it, and a `tokenizer_config.json` there supplies the
/// added tokens).
pub fn load_qwen_tokenizer(path: &Path) -> Result<BpeTokenizer, TokenizerError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let shown = path.display().to_string();
    if name == "vocab.json" || name == "merges.txt" {
        let dir = path.parent().unwrap_or(Path::new("."));
        let vocab = read_text(&dir.join("vocab.json"))?;
        let merges = read_text(&dir.join("merges.txt"))?;
        let config = dir.join("tokenizer_config.json");
        let added = if config.is_file() {
            added_from_config(&read_text(&config)?, &config.display().to_string())?
        } else {
            Vec::new()
        };
        return bpe_from_vocab_merges(&vocab, &merges, added, &shown);
    }
    bpe_from_tokenizer_json(&read_text(path)?, &shown)
}

/// The tokenizer file in `dir`: `tokenizer.json`, else `vocab.json` when `merges.txt` is there.
fn tokenizer_in(dir: &Path) -> Option<PathBuf> {
    let json = dir.join("tokenizer.json");
    if json.is_file() {
        return Some(json);
    }
    let vocab = dir.join("vocab.json");
    (vocab.is_file() && dir.join("merges.txt").is_file()).then_some(vocab)
}

/// Locates the Qwen tokenizer for the LLM text encoder at `llm_path` (for a GGUF LLM, prefer
/// the tokenizer in its metadata: [`bpe_from_gguf_metadata`]).
///
/// Order: `explicit` (a tokenizer.json / vocab.json / merges.txt, or a folder holding one);
/// `tokenizer.json` (or vocab.json + merges.txt) beside the LLM file or inside it when it is a
/// folder; for the diffusers layout `<dir>/text_encoder/…`, `<dir>/processor/` then
/// `<dir>/tokenizer/`.
pub fn find_qwen_tokenizer(
    explicit: Option<&Path>,
    llm_path: &Path,
) -> Result<PathBuf, TokenizerError> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        if p.is_dir() {
            if let Some(found) = tokenizer_in(p) {
                return Ok(found);
            }
        }
        return Err(TokenizerError::NotFound(format!(
            "Qwen tokenizer {}: no such file (expected a tokenizer.json, or vocab.json with merges.txt)",
            p.display()
        )));
    }
    let dir = if llm_path.is_dir() {
        llm_path.to_path_buf()
    } else {
        match llm_path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    let mut searched = vec![dir.clone()];
    if let Some(found) = tokenizer_in(&dir) {
        return Ok(found);
    }
    if dir.file_name().is_some_and(|n| n == "text_encoder") {
        if let Some(root) = dir.parent() {
            for sub in ["processor", "tokenizer"] {
                let d = root.join(sub);
                if let Some(found) = tokenizer_in(&d) {
                    return Ok(found);
                }
                searched.push(d);
            }
        }
    }
    let places = searched
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(TokenizerError::NotFound(format!(
        "no Qwen tokenizer found for the LLM text encoder {llm} (looked for tokenizer.json, or \
         vocab.json + merges.txt, in: {places}). Download `tokenizer.json` from the Hugging Face \
         repo Qwen/Qwen3-VL-8B-Instruct (or `processor/tokenizer.json` from the Qwen Image 2.1 \
         diffusers repo) and put it in {beside} next to the LLM weights, or give its path \
         explicitly; a llama.cpp GGUF LLM carries its own tokenizer",
        llm = llm_path.display(),
        beside = dir.display(),
    )))
}
