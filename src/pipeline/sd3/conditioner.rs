//! SD3's text conditioning as upstream's `SD3CLIPEmbedder` computes it (see the module doc).

use crate::error::{Error, Result};
use crate::models::te::clip::{self, ClipOutputs, ClipTextModel, HiddenOutput, PooledOutput};
use crate::models::te::t5::T5Encoder;
use crate::pipeline::text::{apply_token_weights, encode_t5_chunks, t5_weighted_chunks};
use crate::runner::Loaded;
use crate::tensor::HostTensor;
use crate::tokenizers::clip::{tokenize_weighted, ClipTokenizer, PromptChunk};
use crate::tokenizers::T5Tokenizer;

use super::CHUNK;

/// A prompt's conditioning: the context [context_dim, 2·77·chunks] and the pooled vector.
pub struct Sd3Condition {
    pub context: HostTensor,
    pub pooled: Vec<f32>,
}

/// One CLIP encoder: its weights, the layers its states come from, its pad id, whether its
/// pooled state is projected.
pub(super) struct ClipEncoder {
    pub model: Loaded<ClipTextModel>,
    pub layers: usize,
    pub pad: i32,
    pub project: bool,
}

impl ClipEncoder {
    /// Width of the pooled vector (the projection's when projected).
    fn pooled_width(&self) -> usize {
        let c = self.model.model.config();
        match (self.project, c.projection_dim) {
            (true, Some(p)) => p,
            _ => c.hidden,
        }
    }
}

pub(super) struct Sd3Conditioner {
    pub tokenizer: ClipTokenizer,
    pub clip_l: Option<ClipEncoder>,
    pub clip_g: Option<ClipEncoder>,
    pub t5: Option<(T5Tokenizer, Loaded<T5Encoder>)>,
    /// The MMDiT's context width (T5's) and pooled width.
    pub context_dim: usize,
    pub pooled_dim: usize,
    /// Hidden widths the missing CLIP encoders stand for (zeros), from the pooled width.
    pub widths: (usize, usize),
}

impl Sd3Conditioner {
    /// States [hidden, 77] of chunk `i` (emphasis-weighted) and, for chunk 0, the pooled
    /// vector.
    fn clip_chunk(
        &self,
        enc: &ClipEncoder,
        chunk: &PromptChunk,
        pooled: bool,
    ) -> Result<(HostTensor, Option<Vec<f32>>)> {
        let eos = self.tokenizer.eos();
        let ids = &chunk.ids;
        let hidden = clip::encode(
            &enc.model.runner,
            &enc.model.model,
            ids,
            None,
            &ClipOutputs {
                hidden: Some(HiddenOutput {
                    layers: enc.layers,
                    final_norm: false,
                }),
                pooled: None,
            },
        )?
        .hidden
        .ok_or_else(|| Error::Unsupported("CLIP returned no states".into()))?;
        let mut hidden = hidden;
        apply_token_weights(&mut hidden.data, hidden.ne[0], &chunk.weights);
        let pooled = if pooled {
            let p = clip::encode(
                &enc.model.runner,
                &enc.model.model,
                ids,
                None,
                &ClipOutputs {
                    hidden: None,
                    pooled: Some(PooledOutput {
                        position: clip::pooled_position(ids, eos),
                        project: enc.project,
                    }),
                },
            )?
            .pooled
            .ok_or_else(|| Error::Unsupported("CLIP returned no pooled output".into()))?;
            Some(p.data)
        } else {
            None
        };
        Ok((hidden, pooled))
    }

    pub fn encode(&self, prompt: &str) -> Result<Sd3Condition> {
        let tok = |enc: &Option<ClipEncoder>| -> Result<Vec<PromptChunk>> {
            match enc {
                Some(e) => Ok(tokenize_weighted(&self.tokenizer, prompt, e.pad)?),
                None => Ok(Vec::new()),
            }
        };
        let (l_chunks, g_chunks) = (tok(&self.clip_l)?, tok(&self.clip_g)?);
        let t5_chunks = match &self.t5 {
            Some((t, _)) => t5_weighted_chunks(t, prompt, CHUNK)?,
            None => Vec::new(),
        };
        let n = l_chunks
            .len()
            .max(g_chunks.len())
            .max(t5_chunks.len())
            .max(1);
        let (wl, wg) = (
            self.clip_l
                .as_ref()
                .map_or(self.widths.0, |e| e.model.model.config().hidden),
            self.clip_g
                .as_ref()
                .map_or(self.widths.1, |e| e.model.model.config().hidden),
        );
        let cd = self.context_dim;
        // CLIP-G's states sit after CLIP-L's width (zeros stand for a missing encoder).
        let fits = |present: bool, end: usize| !present || end <= cd;
        if !fits(self.clip_l.is_some(), wl) || !fits(self.clip_g.is_some(), wl + wg) {
            return Err(Error::Unsupported(format!(
                "CLIP states {wl} + {wg} wide exceed the MMDiT's context width {cd}"
            )));
        }
        let mut context = Vec::with_capacity(cd * 2 * CHUNK * n);
        let mut pooled = None;
        for i in 0..n {
            let part = |enc: &Option<ClipEncoder>,
                        chunks: &[PromptChunk],
                        w: usize|
             -> Result<(Vec<f32>, Vec<f32>)> {
                match (enc, chunks.get(i)) {
                    (Some(e), Some(ch)) => {
                        let (h, p) = self.clip_chunk(e, ch, i == 0)?;
                        Ok((h.data, p.unwrap_or_default()))
                    }
                    (e, _) => Ok((
                        vec![0.0; w * CHUNK],
                        if i == 0 {
                            vec![0.0; e.as_ref().map_or(w, |e| e.pooled_width())]
                        } else {
                            Vec::new()
                        },
                    )),
                }
            };
            let (hl, pl) = part(&self.clip_l, &l_chunks, wl)?;
            let (hg, pg) = part(&self.clip_g, &g_chunks, wg)?;
            // [CLIP-L ‖ CLIP-G ‖ zeros] per token, then T5's tokens.
            for t in 0..CHUNK {
                let mut row = vec![0.0; cd];
                if self.clip_l.is_some() {
                    row[..wl].copy_from_slice(&hl[t * wl..(t + 1) * wl]);
                }
                if self.clip_g.is_some() {
                    row[wl..wl + wg].copy_from_slice(&hg[t * wg..(t + 1) * wg]);
                }
                context.extend(row);
            }
            match (&self.t5, t5_chunks.get(i)) {
                (Some((_, t5)), Some(ch)) => {
                    let h = encode_t5_chunks(t5, std::slice::from_ref(ch), false)?;
                    context.extend(h.data);
                }
                _ => context.extend(std::iter::repeat_n(0.0, cd * CHUNK)),
            }
            if i == 0 {
                pooled = Some([pl, pg].concat());
            }
        }
        let pooled = pooled.unwrap_or_default();
        if pooled.len() != self.pooled_dim {
            return Err(Error::Unsupported(format!(
                "the CLIP pooled vectors give {} values; the MMDiT reads {}",
                pooled.len(),
                self.pooled_dim
            )));
        }
        Ok(Sd3Condition {
            context: HostTensor::new([cd, 2 * CHUNK * n, 1, 1], context)
                .ok_or_else(|| Error::Unsupported("SD3 context size".into()))?,
            pooled,
        })
    }
}
