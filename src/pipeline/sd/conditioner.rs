//! The text side of SD1/SD2/SDXL, as upstream's `FrozenCLIPEmbedderWithCustomWords`: the
//! prompt's emphasis is parsed, its tokens split into chunks of 77 (BOS, 75, EOS; `BREAK`
//! starts a new chunk), each chunk encoded, scaled by its token weights (keeping the chunk's
//! mean) and the chunks concatenated along the sequence.
//!
//! - SD1: CLIP-L at `--clip-skip` (default 1: the last layer) with the final LayerNorm.
//! - SD2: OpenCLIP-H at the penultimate layer with the final LayerNorm; chunks pad with 0.
//!   diffusers' SD2 text encoders were converted without OpenCLIP's last layer (their pipeline
//!   reads the last hidden state), so a transformers-layout SD2 encoder defaults to its last
//!   layer: the same layer either way.
//! - SDXL: CLIP-L and bigG at the penultimate layer without the final LayerNorm, concatenated
//!   on features; bigG reads the chunk with 0 after its first EOS; pooled = bigG's final-LN
//!   state at the first EOS of the first chunk through `text_projection`. The refiner has
//!   bigG alone.

use super::variant::SdVersion;
use crate::error::{Error, Result};
use crate::models::te::clip::{
    self, clip_skip_layers, ClipOutputs, ClipTextModel, HiddenOutput, PooledOutput, EOS_TOKEN_ID,
};
use crate::pipeline::text::apply_token_weights;
use crate::runner::Loaded;
use crate::tensor::HostTensor;
use crate::tokenizers::clip::{tokenize_weighted, ClipTokenizer, PromptChunk};

use super::embeddings::CustomEmbeddings;

/// The conditioning of one prompt.
#[derive(Clone, Debug)]
pub struct Condition {
    /// Cross-attention context [width, tokens] (77 per chunk).
    pub context: HostTensor,
    /// SDXL's pooled text embedding (bigG, projected).
    pub pooled: Option<Vec<f32>>,
}

/// One text encoder with what its family reads of it.
pub struct TextEncoder {
    pub clip: Loaded<ClipTextModel>,
    /// Hidden state after this many layers.
    pub layers: usize,
    pub final_norm: bool,
}

/// The SD text encoders and tokenizer.
pub struct SdConditioner {
    version: SdVersion,
    tokenizer: ClipTokenizer,
    /// SD1/SD2's encoder, SDXL's CLIP-L (absent from the refiner).
    first: Option<TextEncoder>,
    /// SDXL's bigG.
    big_g: Option<TextEncoder>,
    /// The pad id of the token chunks (0 for SD2, EOS otherwise).
    pad: i32,
    /// Textual-inversion rows per encoder (0: the first CLIP, 1: bigG), in custom-id order.
    extra_rows: [Vec<f32>; 2],
}

impl SdConditioner {
    pub fn new(
        version: SdVersion,
        mut tokenizer: ClipTokenizer,
        first: Option<TextEncoder>,
        big_g: Option<TextEncoder>,
        embeddings: &CustomEmbeddings,
    ) -> Result<Self> {
        let vocab = match (&first, &big_g) {
            (Some(e), _) | (None, Some(e)) => e.clip.model.config().vocab,
            (None, None) => return Err(Error::Unsupported("no text encoder was loaded".into())),
        };
        let (words, extra_rows) = embeddings.words(vocab)?;
        if !words.is_empty() {
            tokenizer.set_custom_words(words);
        }
        Ok(Self {
            version,
            tokenizer,
            first,
            big_g,
            pad: if version == SdVersion::Sd2 {
                0
            } else {
                EOS_TOKEN_ID
            },
            extra_rows,
        })
    }

    /// The layers an encoder of `total` layers runs for `clip_skip` (upstream's default when
    /// `None`), checked against its depth.
    pub fn layers_for(total: usize, clip_skip: u32) -> usize {
        clip_skip_layers(total, clip_skip as i32)
    }

    /// Whether a CLIP ViT-L is loaded next to bigG (SDXL base; the refiner has bigG alone).
    pub fn has_clip_l(&self) -> bool {
        self.first.is_some() && self.big_g.is_some()
    }

    /// Width of the cross-attention context.
    pub fn context_width(&self) -> usize {
        self.first
            .as_ref()
            .map_or(0, |e| e.clip.model.config().hidden)
            + self
                .big_g
                .as_ref()
                .map_or(0, |e| e.clip.model.config().hidden)
    }

    /// The token chunks of `prompt` (ids and weights, 77 each).
    pub fn tokenize(&self, prompt: &str) -> Result<Vec<PromptChunk>> {
        Ok(tokenize_weighted(&self.tokenizer, prompt, self.pad)?)
    }

    fn rows(&self, k: usize) -> Option<&[f32]> {
        Some(self.extra_rows[k].as_slice()).filter(|r| !r.is_empty())
    }

    /// Encodes `prompt`; `zero_context` zeroes the cross-attention context (upstream's SDXL
    /// empty negative prompt) but not the pooled embedding.
    pub fn encode(&self, prompt: &str, zero_context: bool) -> Result<Condition> {
        let chunks = self.tokenize(prompt)?;
        let mut rows: Vec<f32> = Vec::new();
        let mut tokens = 0usize;
        let mut pooled = None;
        let width = self.context_width();
        for (i, chunk) in chunks.iter().enumerate() {
            let mut parts: Vec<HostTensor> = Vec::with_capacity(2);
            if let Some(enc) = &self.first {
                let out = clip::encode(
                    &enc.clip.runner,
                    &enc.clip.model,
                    &chunk.ids,
                    self.rows(0),
                    &ClipOutputs {
                        hidden: Some(HiddenOutput {
                            layers: enc.layers,
                            final_norm: enc.final_norm,
                        }),
                        pooled: None,
                    },
                )?;
                parts.push(out.hidden.ok_or_else(no_output)?);
            }
            if let Some(enc) = &self.big_g {
                let ids = chunk.ids_zeroed_after_first_eos(EOS_TOKEN_ID);
                let want_pooled = i == 0;
                let out = clip::encode(
                    &enc.clip.runner,
                    &enc.clip.model,
                    &ids,
                    self.rows(1),
                    &ClipOutputs {
                        hidden: Some(HiddenOutput {
                            layers: enc.layers,
                            final_norm: enc.final_norm,
                        }),
                        pooled: want_pooled.then(|| PooledOutput {
                            position: chunk.first_eos(EOS_TOKEN_ID),
                            project: true,
                        }),
                    },
                )?;
                parts.push(out.hidden.ok_or_else(no_output)?);
                if want_pooled {
                    pooled = Some(out.pooled.ok_or_else(no_output)?.data);
                }
            }
            let n = chunk.ids.len();
            let mut hidden = concat_features(&parts, n)?;
            apply_token_weights(&mut hidden, width, &chunk.weights);
            if zero_context {
                hidden.iter_mut().for_each(|v| *v = 0.0);
            }
            rows.extend(hidden);
            tokens += n;
        }
        if self.version == SdVersion::Sdxl && pooled.is_none() {
            return Err(Error::Unsupported(
                "SDXL needs its OpenCLIP ViT-bigG text encoder for the pooled embedding".into(),
            ));
        }
        let context = HostTensor::new([width, tokens, 1, 1], rows)
            .ok_or_else(|| Error::Unsupported("context shape".into()))?;
        Ok(Condition { context, pooled })
    }
}

fn no_output() -> Error {
    Error::Unsupported("the CLIP graph returned no output".into())
}

/// Concatenates per-encoder hidden states [w_i, n] along features → [Σ w_i, n] (row-major,
/// one row per token).
fn concat_features(parts: &[HostTensor], n: usize) -> Result<Vec<f32>> {
    if parts.len() == 1 {
        return Ok(parts[0].data.clone());
    }
    let widths: Vec<usize> = parts.iter().map(|p| p.ne[0]).collect();
    if parts.iter().any(|p| p.ne[1] != n) {
        return Err(Error::Unsupported(
            "text encoders returned different token counts".into(),
        ));
    }
    let total: usize = widths.iter().sum();
    let mut out = Vec::with_capacity(total * n);
    for t in 0..n {
        for (p, &w) in parts.iter().zip(&widths) {
            out.extend_from_slice(&p.data[t * w..(t + 1) * w]);
        }
    }
    Ok(out)
}
