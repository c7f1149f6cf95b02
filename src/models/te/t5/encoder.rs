//! The T5 v1.1 / umT5 encoder stack (transformers `T5EncoderModel` / `UMT5EncoderModel`) as a
//! ggml graph.
//!
//! Per block: `x += o(attn(rms(x)))`, `x += wo(gelu_tanh(wi_0(rms(x))) · wi_1(rms(x)))`; then a
//! final RMS norm. Attention has no 1/√d scaling; its additive bias is a relative position
//! table plus the padding-key mask. T5 reuses block 0's table in every block; umT5 (Wan's text
//! encoder) gives each block its own, which is the only difference between the two encoders.
//!
//! Activations stay f32 throughout. T5 v1.1's feed-forward values are known to exceed the f16
//! range (transformers keeps `wo` in f32 for fp16 runs); we never store activations in f16, and
//! the `wo` input is additionally scaled by 1/32 before the matmul (and the result by 32, exact
//! in f32) so backends that round matmul inputs to f16 (CPU with f16 weights, CUDA) stay finite.

use crate::ggml::Tensor;
use crate::nn::{gelu_tanh, Linear, RmsNorm};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::config::{relative_position_bucket, T5Config, EMBED_KEYS};

/// Pre-scale of the `wo` input (a power of two, so exact).
const WO_INPUT_SCALE: f32 = 1.0 / 32.0;

/// Additive mask value of padding keys: f32's lowest finite value, as transformers uses.
const MASKED: f32 = f32::MIN;

#[derive(Clone, Copy, Debug)]
struct Block {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: RmsNorm,
    wi_0: Linear,
    wi_1: Linear,
    wo: Linear,
}

impl Block {
    fn new(wb: &WeightBuilder<'_, '_>, c: &T5Config) -> Result<Self, RunnerError> {
        let (d, inner, ff) = (c.d_model, c.inner_dim(), c.d_ff);
        let attn = wb.pp("layer.0");
        let sa = attn.pp("SelfAttention");
        let mlp = wb.pp("layer.1");
        let dense = mlp.pp("DenseReluDense");
        Ok(Self {
            attn_norm: RmsNorm::new(&attn.pp("layer_norm"), d, c.eps)?,
            q: Linear::new(&sa.pp("q"), d, inner, false)?,
            k: Linear::new(&sa.pp("k"), d, inner, false)?,
            v: Linear::new(&sa.pp("v"), d, inner, false)?,
            o: Linear::new(&sa.pp("o"), inner, d, false)?,
            ffn_norm: RmsNorm::new(&mlp.pp("layer_norm"), d, c.eps)?,
            wi_0: Linear::new(&dense.pp("wi_0"), d, ff, false)?,
            wi_1: Linear::new(&dense.pp("wi_1"), d, ff, false)?,
            wo: Linear::new(&dense.pp("wo"), ff, d, false)?,
        })
    }

    /// x: [d_model, n]; bias: [n_k, n_q, heads] → [d_model, n].
    fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        c: &T5Config,
        x: Tensor<'g>,
        bias: Tensor<'g>,
    ) -> Tensor<'g> {
        let n = x.ne()[1];
        let (heads, d_kv) = (c.num_heads, c.d_kv);

        let h = self.attn_norm.forward(g, x);
        // [inner, n] -> [d_kv, heads, n] -> [d_kv, n, heads]
        let split = |t: Tensor<'g>| g.permute(g.reshape(t, [d_kv, heads, n, 1]), [0, 2, 1, 3]);
        let q = split(self.q.forward(g, h));
        let k = split(self.k.forward(g, h));
        // scores [n_k, n_q, heads], unscaled
        let scores = g.add(g.mul_mat(k, q), bias);
        let probs = g.soft_max_ext(scores, None, 1.0);
        // v^T: [n_k, d_kv, heads]
        let vt = g.cont(g.permute(
            g.reshape(self.v.forward(g, h), [d_kv, heads, n, 1]),
            [1, 2, 0, 3],
        ));
        // [d_kv, n_q, heads] -> [d_kv, heads, n_q] -> [inner, n]
        let attn = g.cont(g.permute(g.mul_mat(vt, probs), [0, 2, 1, 3]));
        let attn = g.reshape(attn, [c.inner_dim(), n, 1, 1]);
        let x = g.add(x, self.o.forward(g, attn));

        let h = self.ffn_norm.forward(g, x);
        let gate = gelu_tanh(g, self.wi_0.forward(g, h));
        let hidden = g.mul(gate, self.wi_1.forward(g, h));
        let y = self.wo.forward(g, g.scale(hidden, WO_INPUT_SCALE));
        g.add(x, g.scale(y, 1.0 / WO_INPUT_SCALE))
    }
}

/// Key of a block's relative position table, relative to `encoder.block.N.`.
const REL_BIAS: &str = "layer.0.SelfAttention.relative_attention_bias.weight";

/// transformers `T5EncoderModel` (T5 v1.1: gated-GELU feed-forward, relative position bias) or
/// `UMT5EncoderModel` (the same with a position table per block).
pub struct T5Encoder {
    config: T5Config,
    embed: Param,
    /// Relative position tables [heads, buckets]: one shared by every block (T5) or one per
    /// block (umT5).
    rel_bias: Vec<Param>,
    blocks: Vec<Block>,
    final_norm: RmsNorm,
}

impl T5Encoder {
    /// Declares the weights under HF names relative to `wb` (`shared.weight` or
    /// `encoder.embed_tokens.weight`, `encoder.block.{i}...`, `encoder.final_layer_norm.weight`).
    /// A position table in block 1 means umT5: then every block must have one.
    pub fn new(wb: &WeightBuilder<'_, '_>, config: T5Config) -> Result<Self, RunnerError> {
        let c = &config;
        let embed_key = EMBED_KEYS
            .iter()
            .copied()
            .find(|k| wb.contains(k))
            .unwrap_or(EMBED_KEYS[0]);
        let embed_path = embed_key.trim_end_matches(".weight");
        let embed = wb
            .pp(embed_path)
            .get("weight", [c.d_model, c.vocab, 1, 1], Storage::Any)?;
        let encoder = wb.pp("encoder");
        let table_ne = [c.num_heads, c.num_buckets, 1, 1];
        let mut rel_bias = vec![encoder
            .pp("block.0")
            .get(REL_BIAS, table_ne, Storage::F32)?];
        let per_block = c.num_layers > 1 && encoder.pp("block.1").contains(REL_BIAS);
        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let bw = encoder.pp("block").pp(i);
            if i > 0 && per_block {
                rel_bias.push(bw.get(REL_BIAS, table_ne, Storage::F32)?);
            } else if i > 0 && bw.contains(REL_BIAS) {
                return Err(RunnerError::BadData {
                    key: bw.key(REL_BIAS),
                    origin: "the T5 text encoder weights".into(),
                    reason: "a position table in this block but none in block 1: neither T5 \
                             (block 0's table only) nor umT5 (one per block)"
                        .into(),
                });
            }
            blocks.push(Block::new(&bw, c)?);
        }
        if blocks.is_empty() {
            return Err(RunnerError::MissingTensor {
                key: encoder.key("block.0.layer.0.SelfAttention.q.weight"),
                origin: "the T5 text encoder weights".into(),
            });
        }
        let final_norm = RmsNorm::new(&encoder.pp("final_layer_norm"), c.d_model, c.eps)?;
        log::debug!(
            "T5 encoder: {}",
            if per_block {
                "umT5 (a position table per block)"
            } else {
                "T5 (block 0's position table shared)"
            }
        );
        Ok(Self {
            config,
            embed,
            rel_bias,
            blocks,
            final_norm,
        })
    }

    pub fn config(&self) -> &T5Config {
        &self.config
    }

    /// Whether every block has its own relative position table (umT5, the text encoder of
    /// Wan 2.x) rather than sharing block 0's (T5 v1.1).
    pub fn is_umt5(&self) -> bool {
        self.rel_bias.len() > 1
    }

    /// `token_ids`: i32 [n]; the first `valid_len` tokens are real and the rest padding (their
    /// keys are masked; their rows are computed but meaningless). `valid_len >= n` means no
    /// padding. Returns the last hidden state [d_model, n].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        token_ids: Tensor<'g>,
        valid_len: usize,
    ) -> Tensor<'g> {
        let c = &self.config;
        let n = token_ids.ne()[0];
        let mut x = g.get_rows(g.param(self.embed), token_ids);
        let buckets = self.bucket_input(g, n);
        let mask = (valid_len < n).then(|| {
            let mask: Vec<f32> = (0..n)
                .map(|k| if k < valid_len { 0.0 } else { MASKED })
                .collect();
            g.input_f32("t5.key_mask", [n, 1, 1, 1], mask)
        });
        let shared = match self.rel_bias.as_slice() {
            [table] => Some(self.position_bias(g, *table, buckets, n, mask)),
            _ => None,
        };
        for (i, block) in self.blocks.iter().enumerate() {
            let bias =
                shared.unwrap_or_else(|| self.position_bias(g, self.rel_bias[i], buckets, n, mask));
            x = block.forward(g, c, x, bias);
            x = g.cut(&format!("t5.blocks.{i}"), "x", x);
        }
        self.final_norm.forward(g, x)
    }

    /// Bucket of every (query q, key k) pair at index k + n·q: i32 [n·n].
    fn bucket_input<'g>(&self, g: &'g GraphCtx<'g>, n: usize) -> Tensor<'g> {
        let c = &self.config;
        let buckets: Vec<i32> = (0..n as i64)
            .flat_map(|q| {
                (0..n as i64).map(move |k| {
                    relative_position_bucket(k - q, c.num_buckets, c.max_distance) as i32
                })
            })
            .collect();
        g.input_i32("t5.rel_buckets", [n * n, 1, 1, 1], buckets)
    }

    /// One position table looked up at the `n·n` `buckets`, plus the key mask: [n_k, n_q, heads].
    fn position_bias<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        table: Param,
        buckets: Tensor<'g>,
        n: usize,
        mask: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        // [heads, n_k·n_q] -> [heads, n_k, n_q] -> [n_k, n_q, heads]
        let bias = g.get_rows(g.param(table), buckets);
        let bias = g.reshape(bias, [self.config.num_heads, n, n, 1]);
        let bias = g.cont(g.permute(bias, [2, 0, 1, 3]));
        match mask {
            Some(mask) => g.add(bias, mask),
            None => bias,
        }
    }
}
