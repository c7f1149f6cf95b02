//! CLIP text encoder (OpenAI CLIP ViT-L/14, OpenCLIP ViT-H/14 and ViT-bigG/14) as SD1, SD2 and
//! SDXL use it.
//!
//! - [`ClipConfig`]: sizes from the weights ([`ClipConfig::detect`]); heads and activation from
//!   [`ClipHparams`] (`config.json`, the file layout, or what the caller knows).
//! - [`ClipTextModel`]: weights under transformers names and a pure `forward` returning the
//!   hidden state after any layer (with or without the final LayerNorm) and the pooled,
//!   optionally projected, EOS state from one graph.
//! - [`ClipSource`]: serves transformers / diffusers, OpenCLIP and stable-diffusion.cpp GGUF
//!   files under transformers names.
//! - [`encode`]: one call on a [`Runner`], with textual-inversion rows.
//! - [`clip_skip_layers`], [`pooled_position`]: stable-diffusion.cpp's rules for which layer
//!   and which token.
//!
//! Loading: `let source = ClipSource::new(store, prefix);` then
//! `ClipHparams::new(fallback_act)` `.with_config_json(cfg)?` (when the component has a
//! `config.json`) `.with_openclip_layout(source.layout().is_openclip())`, and inside
//! `Runner::load(name, &source, opts, |wb| ClipTextModel::new(wb, ClipConfig::detect(wb, &hp)?))`.
//!
//! How the SD families call it (stable-diffusion.cpp `conditioner.hpp`, REFERENCE-NOTES 27–28):
//! SD1 (CLIP-L): `clip_skip` default 1, hidden after `clip_skip_layers(L, skip)` layers with
//! the final LN. SD2 (OpenCLIP-H): default 2 (the penultimate layer), with the final LN.
//! SDXL: both encoders at default 2 without the final LN; pooled = bigG at the first EOS
//! (`pooled_position`), all layers, final LN, `text_projection`; bigG's ids are 0 after the
//! first EOS.
//!
//! Differences from transformers / diffusers, upstream being the spec: the pooled token is the
//! first EOS or else the last token (transformers: `argmax(ids)` for legacy configs with
//! `eos_token_id` 2, else the first EOS, else token 0). The activations are exact here where
//! upstream's ggml kernels are approximations (ggml's `gelu` is the tanh form, `gelu_quick`
//! reads an f16 table; transformers' and OpenCLIP's are exact). OpenCLIP's `text_projection`
//! is applied as `x @ P` (OpenCLIP, diffusers' conversion); stable-diffusion.cpp applies it as
//! a `Linear` weight, `x @ Pᵀ`, for OpenCLIP-layout files.

mod config;
pub(crate) mod detect;
pub(crate) mod layer;
mod model;
pub(crate) mod served;
mod source;

pub use config::{ClipActivation, ClipConfig, ClipHparams, DEFAULT_EPS, HEAD_SIZE};
pub use model::{ClipOutputs, ClipTensors, ClipTextModel, HiddenOutput, PooledOutput};
pub use source::{ClipLayout, ClipSource, PROJECTION};

use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;

/// The CLIP tokenizer's end-of-text id.
pub const EOS_TOKEN_ID: i32 = 49407;

/// The outputs of [`encode`], as [`ClipOutputs`] asked: hidden [hidden, n] (ggml order: one
/// row of `hidden` per token), pooled [hidden or proj, 1].
#[derive(Debug)]
pub struct ClipEncoded {
    pub hidden: Option<HostTensor>,
    pub pooled: Option<HostTensor>,
}

/// Layers to run for `--clip-skip` as stable-diffusion.cpp's `CLIPEncoder` counts them: a
/// skip of `s > 0` stops after layer `L - s` (0-based), i.e. runs `L - s + 1` layers; `s <= 0`
/// (unset) runs all. A skip beyond the depth leaves 0 layers (upstream agrees at `L + 1`;
/// beyond that its loop never stops early and runs every layer — not worth copying).
pub fn clip_skip_layers(layers: usize, clip_skip: i32) -> usize {
    if clip_skip <= 0 {
        return layers;
    }
    layers.saturating_sub(clip_skip as usize - 1)
}

/// The pooled token as stable-diffusion.cpp picks it: the first `eos`, else the last token.
pub fn pooled_position(ids: &[i32], eos: i32) -> usize {
    ids.iter()
        .position(|&id| id == eos)
        .unwrap_or(ids.len().saturating_sub(1))
}

/// Encodes one token sequence (`1..=max_positions` ids, each below `vocab` + extra rows).
///
/// `extra`: textual-inversion embeddings appended after the vocabulary, `k` rows of `hidden`
/// values (ggml [hidden, k], row-major: row `j` is the vector of token id `vocab + j`).
pub fn encode(
    runner: &Runner,
    model: &ClipTextModel,
    ids: &[i32],
    extra: Option<&[f32]>,
    want: &ClipOutputs,
) -> Result<ClipEncoded, RunnerError> {
    let c = model.config();
    let bad = |key: &str, reason: String| RunnerError::BadData {
        key: key.into(),
        origin: "the CLIP token sequence".into(),
        reason,
    };
    let extra = extra.filter(|e| !e.is_empty());
    let extra_rows = match extra {
        Some(e) if e.len() % c.hidden != 0 => {
            return Err(bad(
                "extra_embeddings",
                format!(
                    "{} values are not whole rows of the hidden width {}",
                    e.len(),
                    c.hidden
                ),
            ))
        }
        Some(e) => e.len() / c.hidden,
        None => 0,
    };
    super::check_token_ids(ids, c.vocab + extra_rows, "the CLIP token sequence")?;
    let n = ids.len();
    if n > c.max_positions {
        return Err(bad(
            "input_ids",
            format!(
                "{n} tokens exceed the {} positions of the model",
                c.max_positions
            ),
        ));
    }
    if let Some(h) = want.hidden {
        if h.layers > c.layers {
            return Err(bad(
                "layers",
                format!("{} layers asked of a {}-layer model", h.layers, c.layers),
            ));
        }
    }
    if let Some(p) = want.pooled {
        if p.position >= n {
            return Err(bad(
                "pooled_position",
                format!("position {} is outside the {n} tokens", p.position),
            ));
        }
    }
    if want.hidden.is_none() && want.pooled.is_none() {
        return Ok(ClipEncoded {
            hidden: None,
            pooled: None,
        });
    }

    let out = runner.compute(|g| {
        let extra = extra.map(|e| {
            g.input_f32(
                "clip.extra_embeddings",
                [c.hidden, extra_rows, 1, 1],
                e.to_vec(),
            )
        });
        let t = model.forward(g, ids, extra, want);
        t.hidden.into_iter().chain(t.pooled).collect()
    })?;
    let (hidden, pooled) =
        split_outputs(out, want.hidden.is_some(), want.pooled.is_some(), "CLIP")?;
    Ok(ClipEncoded { hidden, pooled })
}

/// Splits a graph's outputs, computed as the hidden state then the pooled one (each only when
/// asked), back into the two; `what` names the graph should it return fewer.
pub(crate) fn split_outputs(
    mut out: Vec<HostTensor>,
    hidden: bool,
    pooled: bool,
    what: &str,
) -> Result<(Option<HostTensor>, Option<HostTensor>), RunnerError> {
    let missing = || RunnerError::Internal(format!("{what} graph returned fewer outputs"));
    let pooled = if pooled {
        Some(out.pop().ok_or_else(missing)?)
    } else {
        None
    };
    let hidden = if hidden {
        Some(out.pop().ok_or_else(missing)?)
    } else {
        None
    };
    Ok((hidden, pooled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_skip_counts_as_upstream() {
        assert_eq!(clip_skip_layers(12, -1), 12);
        assert_eq!(clip_skip_layers(12, 0), 12);
        assert_eq!(clip_skip_layers(12, 1), 12);
        assert_eq!(clip_skip_layers(12, 2), 11);
        assert_eq!(clip_skip_layers(24, 2), 23);
        assert_eq!(clip_skip_layers(3, 4), 0);
        assert_eq!(clip_skip_layers(3, 9), 0);
    }

    #[test]
    fn pooled_position_is_first_eos_else_last() {
        assert_eq!(pooled_position(&[49406, 5, 49407, 49407], EOS_TOKEN_ID), 2);
        assert_eq!(pooled_position(&[49406, 5, 6], EOS_TOKEN_ID), 2);
        assert_eq!(pooled_position(&[], EOS_TOKEN_ID), 0);
    }
}
