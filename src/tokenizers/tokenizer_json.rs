//! Loader for HF `tokenizer.json` files with a Unigram model (T5 family).
//!
//! Only the components T5 tokenizers use are accepted; anything else is reported as unsupported
//! rather than silently ignored, since it would change the ids.

use serde_json::Value;

use super::error::TokenizerError;
use super::precompiled::Precompiled;
use super::t5::{Normalizer, PreTokenizer, PrependScheme, T5Tokenizer};
use super::unigram::Unigram;

struct Ctx<'a> {
    path: &'a str,
}

impl Ctx<'_> {
    fn format(&self, reason: impl Into<String>) -> TokenizerError {
        TokenizerError::Format {
            path: self.path.to_string(),
            reason: reason.into(),
        }
    }
    fn unsupported(&self, feature: impl Into<String>) -> TokenizerError {
        TokenizerError::Unsupported {
            path: self.path.to_string(),
            feature: feature.into(),
        }
    }
}

fn get_str<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

/// Builds a tokenizer from the text of a `tokenizer.json`; `path` names it in errors.
pub fn from_tokenizer_json(text: &str, path: &str) -> Result<T5Tokenizer, TokenizerError> {
    let cx = Ctx { path };
    let root: Value =
        serde_json::from_str(text).map_err(|e| cx.format(format!("not JSON: {e}")))?;

    let model = root
        .get("model")
        .ok_or_else(|| cx.format("no \"model\" section"))?;
    let kind = get_str(model, "type").unwrap_or("Unigram");
    if kind != "Unigram" {
        return Err(cx.unsupported(format!("model type {kind:?} (only Unigram)")));
    }
    let vocab = model
        .get("vocab")
        .and_then(Value::as_array)
        .ok_or_else(|| cx.format("model.vocab is not a list"))?;
    let mut pieces = Vec::with_capacity(vocab.len());
    for (i, entry) in vocab.iter().enumerate() {
        let pair = entry.as_array().filter(|a| a.len() == 2);
        let piece = pair.and_then(|a| a[0].as_str());
        let score = pair.and_then(|a| a[1].as_f64());
        match (piece, score) {
            (Some(p), Some(s)) => pieces.push((p.to_string(), s)),
            _ => return Err(cx.format(format!("model.vocab[{i}] is not [piece, score]"))),
        }
    }
    if pieces.len() >= i32::MAX as usize {
        return Err(cx.format("vocabulary too large for i32 ids"));
    }
    let unk_id = model
        .get("unk_id")
        .and_then(Value::as_u64)
        .ok_or_else(|| cx.unsupported("Unigram without unk_id"))?;
    let unk_id = u32::try_from(unk_id).map_err(|_| cx.format("unk_id out of range"))?;
    let byte_fallback = model
        .get("byte_fallback")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let model = Unigram::new(pieces, unk_id, path)?;

    let mut added = Vec::new();
    if let Some(list) = root.get("added_tokens").and_then(Value::as_array) {
        for tok in list {
            let content =
                get_str(tok, "content").ok_or_else(|| cx.format("added token without content"))?;
            let id = tok
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| cx.format(format!("added token {content:?} without a valid id")))?;
            let flag = |k: &str| tok.get(k).and_then(Value::as_bool).unwrap_or(false);
            if flag("lstrip") || flag("rstrip") || flag("single_word") {
                return Err(cx.unsupported(format!(
                    "added token {content:?} with lstrip/rstrip/single_word"
                )));
            }
            if flag("normalized") && !flag("special") {
                return Err(cx.unsupported(format!("normalized added token {content:?}")));
            }
            added.push((content.to_string(), id));
        }
    }

    let normalizers = match root.get("normalizer") {
        None | Some(Value::Null) => Vec::new(),
        Some(n) => parse_normalizer(&cx, n)?,
    };
    let pre_tokenizers = match root.get("pre_tokenizer") {
        None | Some(Value::Null) => Vec::new(),
        Some(p) => parse_pre_tokenizer(&cx, p)?,
    };

    let eos = added
        .iter()
        .find(|(t, _)| t == "</s>")
        .map(|(_, id)| *id)
        .or_else(|| model.token_to_id("</s>"));
    let (prefix_ids, suffix_ids) = match root.get("post_processor") {
        None | Some(Value::Null) => (
            Vec::new(),
            vec![eos.ok_or_else(|| cx.format("no post_processor and no </s> token"))?],
        ),
        Some(p) => parse_post_processor(&cx, p)?,
    };
    let pad_id = added
        .iter()
        .find(|(t, _)| t == "<pad>")
        .map(|(_, id)| *id)
        .or_else(|| model.token_to_id("<pad>"))
        .unwrap_or(0);
    // Every id the tokenizer can emit must index the vocabulary (and so the text encoder's
    // embedding table, which has at least that many rows); a hostile file could otherwise make
    // the encoder read past its table.
    let vocab_len = model.len();
    let emitted = added.iter().map(|(t, id)| (t.as_str(), *id)).chain(
        prefix_ids
            .iter()
            .chain(&suffix_ids)
            .map(|&id| ("post_processor", id)),
    );
    for (what, id) in emitted {
        if id as usize >= vocab_len {
            return Err(TokenizerError::Vocab {
                origin: path.to_string(),
                reason: format!(
                    "id {id} of {what:?} is outside the vocabulary of {vocab_len} pieces"
                ),
            });
        }
    }

    Ok(T5Tokenizer {
        model,
        byte_fallback,
        normalizers,
        pre_tokenizers,
        added,
        prefix_ids,
        suffix_ids,
        pad_id,
    })
}

fn parse_normalizer(cx: &Ctx, n: &Value) -> Result<Vec<Normalizer>, TokenizerError> {
    let kind = get_str(n, "type").ok_or_else(|| cx.format("normalizer without type"))?;
    Ok(match kind {
        "Sequence" => {
            let list = n
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or_else(|| cx.format("Sequence normalizer without list"))?;
            let mut out = Vec::new();
            for item in list {
                out.extend(parse_normalizer(cx, item)?);
            }
            out
        }
        "Precompiled" => {
            let b64 = get_str(n, "precompiled_charsmap")
                .ok_or_else(|| cx.format("Precompiled normalizer without precompiled_charsmap"))?;
            let blob = decode_base64(b64)
                .ok_or_else(|| cx.format("precompiled_charsmap is not base64"))?;
            if blob.is_empty() {
                Vec::new()
            } else {
                vec![Normalizer::Precompiled(Precompiled::from_bytes(
                    &blob, cx.path,
                )?)]
            }
        }
        "Replace" => {
            let content = get_str(n, "content").unwrap_or("").to_string();
            let pattern = n
                .get("pattern")
                .ok_or_else(|| cx.format("Replace without pattern"))?;
            if let Some(s) = get_str(pattern, "String") {
                vec![Normalizer::Replace {
                    pattern: s.to_string(),
                    content,
                }]
            } else if let Some(re) = get_str(pattern, "Regex") {
                match (re, content.as_str()) {
                    (" {2,}", _) => vec![Normalizer::CollapseSpaces(content)],
                    (r"\A +| +\z", "") => vec![Normalizer::TrimSpaces],
                    _ => return Err(cx.unsupported(format!("Replace regex {re:?}"))),
                }
            } else {
                return Err(cx.format("Replace pattern is neither String nor Regex"));
            }
        }
        "Strip" => {
            let side = |k: &str| n.get(k).and_then(Value::as_bool).unwrap_or(true);
            vec![Normalizer::Strip {
                left: side("strip_left"),
                right: side("strip_right"),
            }]
        }
        other => return Err(cx.unsupported(format!("normalizer {other:?}"))),
    })
}

fn parse_pre_tokenizer(cx: &Ctx, p: &Value) -> Result<Vec<PreTokenizer>, TokenizerError> {
    let kind = get_str(p, "type").ok_or_else(|| cx.format("pre_tokenizer without type"))?;
    Ok(match kind {
        "Sequence" => {
            let list = p
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| cx.format("Sequence pre_tokenizer without list"))?;
            let mut out = Vec::new();
            for item in list {
                out.extend(parse_pre_tokenizer(cx, item)?);
            }
            out
        }
        "WhitespaceSplit" => vec![PreTokenizer::WhitespaceSplit],
        "Metaspace" => {
            let replacement = get_str(p, "replacement")
                .and_then(|s| {
                    let mut it = s.chars();
                    let c = it.next()?;
                    it.next().is_none().then_some(c)
                })
                .ok_or_else(|| cx.format("Metaspace replacement is not one character"))?;
            // Older files carry `add_prefix_space`; newer ones `prepend_scheme`.
            let prepend = match get_str(p, "prepend_scheme") {
                Some("always") => PrependScheme::Always,
                Some("first") => PrependScheme::First,
                Some("never") => PrependScheme::Never,
                Some(other) => {
                    return Err(cx.unsupported(format!("Metaspace prepend_scheme {other:?}")))
                }
                None => match p.get("add_prefix_space").and_then(Value::as_bool) {
                    Some(false) => PrependScheme::Never,
                    _ => PrependScheme::Always,
                },
            };
            let split = p.get("split").and_then(Value::as_bool).unwrap_or(true);
            vec![PreTokenizer::Metaspace {
                replacement,
                prepend,
                split,
            }]
        }
        other => return Err(cx.unsupported(format!("pre_tokenizer {other:?}"))),
    })
}

/// Returns the ids placed before and after the sequence by a single-sequence template.
fn parse_post_processor(cx: &Ctx, p: &Value) -> Result<(Vec<u32>, Vec<u32>), TokenizerError> {
    let kind = get_str(p, "type").ok_or_else(|| cx.format("post_processor without type"))?;
    if kind != "TemplateProcessing" {
        return Err(cx.unsupported(format!("post_processor {kind:?}")));
    }
    let single = p
        .get("single")
        .and_then(Value::as_array)
        .ok_or_else(|| cx.format("TemplateProcessing without single template"))?;
    let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
    let mut seen_seq = false;
    for item in single {
        if item.get("Sequence").is_some() {
            seen_seq = true;
        } else if let Some(sp) = item.get("SpecialToken") {
            let name = get_str(sp, "id").ok_or_else(|| cx.format("SpecialToken without id"))?;
            let ids = p
                .get("special_tokens")
                .and_then(|m| m.get(name))
                .and_then(|t| t.get("ids"))
                .and_then(Value::as_array)
                .ok_or_else(|| {
                    cx.format(format!(
                        "special token {name:?} missing from special_tokens"
                    ))
                })?;
            for id in ids {
                let id = id
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| cx.format(format!("bad id for special token {name:?}")))?;
                if seen_seq {
                    suffix.push(id);
                } else {
                    prefix.push(id);
                }
            }
        } else {
            return Err(cx.format("template item is neither Sequence nor SpecialToken"));
        }
    }
    Ok((prefix, suffix))
}

/// Standard base64 (with or without padding); `None` on any invalid character.
pub(crate) fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let body = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c)? << (18 - 6 * i);
        }
        match chunk.len() {
            4 => out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8, acc as u8]),
            3 => out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8]),
            2 => out.push((acc >> 16) as u8),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    #[test]
    fn base64() {
        assert_eq!(decode_base64("aGVsbG8=").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64("aGVsbG8h").as_deref(), Some(&b"hello!"[..]));
        assert_eq!(decode_base64("aGk").as_deref(), Some(&b"hi"[..]));
        assert!(decode_base64("a").is_none());
        assert!(decode_base64("a*==").is_none());
    }
}
