//! Text-encoder loading and weighted-prompt helpers the families share: the T5 tokenizer and
//! encoder, CLIP encoders, upstream's token weights, and T5 prompts in weighted chunks.

use std::path::Path;

use crate::error::{Error, Result};
use crate::models::te::clip::{ClipActivation, ClipConfig, ClipHparams, ClipSource, ClipTextModel};
use crate::models::te::t5::{self, T5Config, T5Encoder, T5Source};
use crate::runner::{Loaded, Runner};
use crate::tensor::HostTensor;
use crate::tokenizers::emphasis::parse_emphasis;
use crate::tokenizers::{
    bpe_from_gguf_metadata, find_qwen_tokenizer, find_t5_tokenizer, find_umt5_tokenizer,
    from_gguf_vocab, load_qwen_tokenizer, load_t5_tokenizer as load_t5_file, BpeTokenizer,
    T5Tokenizer, TokenizerError,
};

use super::components::{ComponentId, ComponentStore};
use super::family::LoadContext;

/// The Qwen tokenizer of an LLM text encoder: in its GGUF metadata, else a tokenizer file
/// beside its weights (or in its diffusers folder).
pub fn load_qwen_tokenizer_of(llm: &ComponentStore) -> Result<BpeTokenizer> {
    for f in llm.store.files() {
        let origin = f.path.display().to_string();
        if let Some(tok) = bpe_from_gguf_metadata(&f.gguf, &origin) {
            log::debug!("Qwen tokenizer: from GGUF metadata of {origin}");
            return Ok(tok?);
        }
    }
    let path = find_qwen_tokenizer(None, &llm.path)?;
    log::debug!("Qwen tokenizer: {}", path.display());
    Ok(load_qwen_tokenizer(&path)?)
}

/// A chat template around a prompt, tokenized as upstream's LLM embedder does: `prefix`, each
/// emphasis part of `prompt` and `suffix` one piece at a time, with each token's weight:
/// (ids, weights).
pub fn weighted_template_ids(
    tokenizer: &BpeTokenizer,
    prefix: &str,
    prompt: &str,
    suffix: &str,
) -> Result<(Vec<i32>, Vec<f32>)> {
    let mut ids = Vec::new();
    let mut weights = Vec::new();
    let mut push = |text: &str, weight: f32| {
        let t = tokenizer.encode(text);
        weights.extend(std::iter::repeat_n(weight, t.len()));
        ids.extend(t.into_iter().map(|t| t as i32));
    };
    push(prefix, 1.0);
    let parts = parse_emphasis(prompt)
        .map_err(|e| Error::Unsupported(format!("prompt {prompt:?}: {e}")))?;
    for part in parts {
        push(&part.text, part.weight);
    }
    push(suffix, 1.0);
    Ok((ids, weights))
}

/// Scales each token's row by its weight, then the whole chunk so its mean is unchanged
/// (upstream's `apply_token_weights`; nothing happens when every weight is 1).
pub fn apply_token_weights(hidden: &mut [f32], width: usize, weights: &[f32]) {
    if weights.iter().all(|&w| w == 1.0) || width == 0 {
        return;
    }
    let mean = |h: &[f32]| h.iter().map(|&v| v as f64).sum::<f64>() / h.len().max(1) as f64;
    let before = mean(hidden) as f32;
    for (row, &w) in hidden.chunks_mut(width).zip(weights) {
        row.iter_mut().for_each(|v| *v *= w);
    }
    let after = mean(hidden) as f32;
    if before.is_finite() && after.is_finite() && after != 0.0 {
        let s = before / after;
        hidden.iter_mut().for_each(|v| *v *= s);
    }
}

/// The T5 tokenizer: `--t5xxl-tokenizer`, else one inside the T5 GGUF, else a tokenizer file
/// beside the T5 weights.
pub fn load_t5_tokenizer(t5: &ComponentStore, explicit: Option<&Path>) -> Result<T5Tokenizer> {
    load_tokenizer_with(t5, explicit, find_t5_tokenizer)
}

/// [`load_t5_tokenizer`] for umT5 (Wan): the file search also looks where the Wan repositories
/// keep google/umt5-xxl's tokenizer, and its error names what to download.
pub fn load_umt5_tokenizer(t5: &ComponentStore, explicit: Option<&Path>) -> Result<T5Tokenizer> {
    load_tokenizer_with(t5, explicit, find_umt5_tokenizer)
}

fn load_tokenizer_with(
    t5: &ComponentStore,
    explicit: Option<&Path>,
    find: fn(Option<&Path>, &Path) -> std::result::Result<std::path::PathBuf, TokenizerError>,
) -> Result<T5Tokenizer> {
    if explicit.is_none() {
        for f in t5.store.files() {
            let md = &f.gguf;
            if let (Some(tokens), Some(scores)) = (
                md.get_arr_str("tokenizer.ggml.tokens"),
                md.get_arr_f32("tokenizer.ggml.scores"),
            ) {
                let types = md
                    .get_arr_i32("tokenizer.ggml.token_type")
                    .unwrap_or_else(|| vec![1; tokens.len()]);
                let tokens = tokens.into_iter().map(str::to_string).collect();
                log::debug!("T5 tokenizer: from GGUF metadata of {}", f.path.display());
                return Ok(from_gguf_vocab(tokens, scores, types, None)?);
            }
        }
    }
    let path = find(explicit, &t5.path)?;
    log::debug!("T5 tokenizer: {}", path.display());
    Ok(load_t5_file(&path)?)
}

/// The T5 encoder of a component store.
pub fn load_t5(files: &ComponentStore, ctx: &LoadContext<'_>) -> Result<Loaded<T5Encoder>> {
    let src = T5Source::new(&files.store, ComponentId::T5.prefix());
    let opts = ctx.load_options(ComponentId::T5, true)?;
    Runner::load("t5", &src, opts, |wb| -> Result<T5Encoder> {
        Ok(T5Encoder::new(wb, T5Config::detect(wb)?)?)
    })
}

/// A CLIP text encoder from its store; also whether the file is in OpenCLIP layout.
pub fn load_clip(
    files: &ComponentStore,
    id: ComponentId,
    ctx: &LoadContext<'_>,
    act: ClipActivation,
) -> Result<(Loaded<ClipTextModel>, bool)> {
    let src = ClipSource::new(&files.store, id.prefix());
    let openclip = src.layout().is_openclip();
    let mut hp = ClipHparams::new(act).with_openclip_layout(openclip);
    if let Some(cfg) = files.config() {
        hp = hp.with_config_json(cfg)?;
    }
    let opts = ctx.load_options(id, true)?;
    let name = if id == ComponentId::ClipG {
        "clip_g"
    } else {
        "clip"
    };
    let clip = Runner::load(name, &src, opts, |wb| -> Result<ClipTextModel> {
        let config = ClipConfig::detect(wb, &hp)?;
        log::debug!("{name}: {config:?}");
        Ok(ClipTextModel::new(wb, config)?)
    })?;
    Ok((clip, openclip))
}

/// One T5 chunk: ids and emphasis weights (`chunk_len` each) and how many of them are the
/// prompt's (with `</s>`) before the padding.
#[derive(Clone, Debug, PartialEq)]
pub struct T5Chunk {
    pub ids: Vec<i32>,
    pub weights: Vec<f32>,
    pub real: usize,
}

/// A prompt's T5 tokens as upstream's FLUX/Chroma/SD3 conditioners cut them: emphasis parsed,
/// then chunks of `chunk_len` (the tokens, `</s>`, padding) — as many as the prompt needs.
pub fn t5_weighted_chunks(
    tokenizer: &T5Tokenizer,
    prompt: &str,
    chunk_len: usize,
) -> Result<Vec<T5Chunk>> {
    let parts = parse_emphasis(prompt).map_err(|e| Error::Unsupported(e.to_string()))?;
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for part in &parts {
        let t = tokenizer.encode_body(&part.text);
        weights.extend(std::iter::repeat_n(part.weight, t.len()));
        ids.extend(t.into_iter().map(|i| i as i32));
    }
    let eos = tokenizer.eos_id().unwrap_or(1) as i32;
    let pad = tokenizer.pad_id() as i32;
    let per_chunk = chunk_len.saturating_sub(1).max(1);
    let mut chunks = Vec::new();
    let mut start = 0;
    loop {
        let end = (start + per_chunk).min(ids.len());
        let mut c_ids = ids[start..end].to_vec();
        let mut c_w = weights[start..end].to_vec();
        c_ids.push(eos);
        c_w.push(1.0);
        let real = c_ids.len();
        c_ids.resize(chunk_len.max(c_ids.len()), pad);
        c_w.resize(c_ids.len(), 1.0);
        chunks.push(T5Chunk {
            ids: c_ids,
            weights: c_w,
            real,
        });
        start = end;
        if start >= ids.len() {
            return Ok(chunks);
        }
    }
}

/// T5 hidden states [d_model, n·chunk_len] of weighted chunks, each run over all its tokens
/// (upstream's FLUX and Chroma default) or with its padding masked (`masked`), then weighted.
pub fn encode_t5_chunks(
    t5: &Loaded<T5Encoder>,
    chunks: &[T5Chunk],
    masked: bool,
) -> Result<HostTensor> {
    let d = t5.model.config().d_model;
    let mut data = Vec::new();
    let mut n = 0;
    for c in chunks {
        let valid = if masked { c.real } else { c.ids.len() };
        let mut h = t5::encode(&t5.runner, &t5.model, &c.ids, valid)?;
        apply_token_weights(&mut h.data, d, &c.weights);
        n += c.ids.len();
        data.extend(h.data);
    }
    HostTensor::new([d, n, 1, 1], data).ok_or_else(|| Error::Unsupported("T5 output size".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_weights_keep_the_mean() {
        let mut h = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        apply_token_weights(&mut h, 2, &[1.0, 1.5, 1.0]);
        let mean: f32 = h.iter().sum::<f32>() / 6.0;
        assert!((mean - 3.5).abs() < 1e-6);
        // Row 1 scaled by 1.5 relative to the others.
        assert!((h[2] / h[0] - 3.0 * 1.5).abs() < 1e-5);
        let mut same = vec![1.0, -2.0];
        apply_token_weights(&mut same, 1, &[1.0, 1.0]);
        assert_eq!(same, vec![1.0, -2.0]);
    }
}
