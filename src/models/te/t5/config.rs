//! T5 encoder hyper-parameters, read off the weight shapes.

use crate::runner::{RunnerError, WeightBuilder};

/// Where T5 weights are looked up when the detector or constructor needs them.
const ORIGIN: &str = "the T5 text encoder weights";

/// Key of the token embedding table: transformers saves it as `shared.weight`; some exports keep
/// only the tied copy `encoder.embed_tokens.weight`.
pub(crate) const EMBED_KEYS: [&str; 2] = ["shared.weight", "encoder.embed_tokens.weight"];

/// Sizes of a T5 (v1.1) encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct T5Config {
    /// Rows of the token embedding table.
    pub vocab: usize,
    pub d_model: usize,
    /// Per-head width of q/k/v (`inner = d_kv · num_heads`, which need not equal `d_model`).
    pub d_kv: usize,
    pub num_heads: usize,
    pub d_ff: usize,
    pub num_layers: usize,
    /// `relative_attention_num_buckets` (bidirectional: half per direction).
    pub num_buckets: usize,
    /// `relative_attention_max_distance`: not stored in the weights; 128 for every released
    /// T5 / T5 v1.1 / Flan-T5 checkpoint.
    pub max_distance: usize,
    /// `layer_norm_epsilon` of every RMS norm, final norm included.
    pub eps: f32,
}

impl T5Config {
    /// The inner width of the attention projections.
    pub fn inner_dim(&self) -> usize {
        self.d_kv * self.num_heads
    }

    /// Reads the sizes from the weight shapes (HF names, relative to `wb`):
    /// `shared.weight` [d_model, vocab], block 0's `relative_attention_bias.weight`
    /// [heads, buckets], `q.weight` [d_model, inner], `wi_0.weight` [d_model, d_ff]; the layer
    /// count is the number of consecutive `encoder.block.{i}` present.
    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let shape = |name: &str| wb.require_ne(name, ORIGIN);
        let bad = |name: &str, reason: String| wb.bad_data(name, ORIGIN, reason);

        let embed_key = EMBED_KEYS
            .iter()
            .copied()
            .find(|k| wb.contains(k))
            .unwrap_or(EMBED_KEYS[0]);
        let [d_model, vocab, ..] = shape(embed_key)?;

        let attn0 = "encoder.block.0.layer.0.SelfAttention";
        let rel_key = format!("{attn0}.relative_attention_bias.weight");
        let [num_heads, num_buckets, ..] = shape(&rel_key)?;
        if num_heads == 0 || num_buckets < 4 {
            return Err(bad(
                &rel_key,
                format!(
                    "{num_heads} heads × {num_buckets} buckets is not a T5 position-bias table"
                ),
            ));
        }

        let q_key = format!("{attn0}.q.weight");
        let [q_in, inner, ..] = shape(&q_key)?;
        if q_in != d_model || inner % num_heads != 0 {
            return Err(bad(
                &q_key,
                format!(
                    "shape [{q_in}, {inner}] does not fit d_model {d_model} and {num_heads} heads"
                ),
            ));
        }

        let ff = "encoder.block.0.layer.1.DenseReluDense";
        let wi0_key = format!("{ff}.wi_0.weight");
        if !wb.contains(&wi0_key) && wb.contains(&format!("{ff}.wi.weight")) {
            return Err(bad(
                &format!("{ff}.wi.weight"),
                "original T5 (ReLU feed-forward) is not supported; T5 v1.1 has wi_0/wi_1".into(),
            ));
        }
        let [_, d_ff, ..] = shape(&wi0_key)?;

        let num_layers = (0..)
            .take_while(|i| {
                wb.contains(&format!("encoder.block.{i}.layer.0.SelfAttention.q.weight"))
            })
            .count();

        let config = Self {
            vocab,
            d_model,
            d_kv: inner / num_heads,
            num_heads,
            d_ff,
            num_layers,
            num_buckets,
            max_distance: 128,
            eps: 1e-6,
        };
        log::debug!(
            "T5 encoder: {} layers, d_model {}, {} heads × {}, d_ff {}, vocab {}, {} buckets",
            config.num_layers,
            config.d_model,
            config.num_heads,
            config.d_kv,
            config.d_ff,
            config.vocab,
            config.num_buckets
        );
        Ok(config)
    }
}

/// transformers' bidirectional relative-position bucket of `rel = key_pos - query_pos`: half the
/// buckets per direction (positive offsets in the upper half); within a half, offsets below a
/// quarter of `num_buckets` get their own bucket, larger ones share log-spaced buckets up to
/// `max_distance`, beyond which all fall in the last bucket.
pub fn relative_position_bucket(rel: i64, num_buckets: usize, max_distance: usize) -> usize {
    let half = num_buckets / 2;
    let base = if rel > 0 { half } else { 0 };
    let dist = rel.unsigned_abs() as usize;
    let max_exact = (half / 2).max(1);
    if dist < max_exact {
        return base + dist;
    }
    // Same float32 arithmetic as the PyTorch reference, so bucket edges truncate alike.
    let ratio = (dist as f32 / max_exact as f32).ln();
    let log_range = (max_distance as f64 / max_exact as f64).ln() as f32;
    let large = max_exact + (ratio / log_range * (half - max_exact) as f32) as usize;
    base + large.min(half - 1)
}
