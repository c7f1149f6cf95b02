//! Qwen3 language-model hyper-parameters, read off the weight shapes.

use crate::runner::{RunnerError, WeightBuilder};

use super::source::DEFAULT_ROPE_THETA;

const ORIGIN: &str = "the Qwen3 LLM text encoder weights";

/// Sizes of a Qwen3 (Qwen3-VL text) decoder used as an encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3Config {
    /// Rows of the token embedding table.
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    /// Key/value heads (grouped-query attention: `heads` is a multiple of it).
    pub kv_heads: usize,
    /// Per-head width; independent of `hidden / heads` in Qwen3.
    pub head_dim: usize,
    pub intermediate: usize,
    /// Epsilon of every RMS norm (q/k norms included).
    pub eps: f32,
    /// NeoX rope base frequency.
    pub rope_theta: f32,
    /// Per-head RMS norms on q and k (Qwen3); Qwen2 / Qwen2.5-VL have none.
    pub qk_norm: bool,
    /// Biases on the q, k and v projections (Qwen2 / Qwen2.5-VL).
    pub qkv_bias: bool,
}

/// Qwen2 and Qwen2.5-VL head width (every released size); used when neither the weights (no
/// q/k norms) nor a config name the head count.
pub const QWEN2_HEAD_DIM: usize = 128;

impl Qwen3Config {
    /// Reads the sizes from plain Qwen3 names relative to `wb` (see `Qwen3Source`):
    /// `embed_tokens.weight` [hidden, vocab]; layer 0's `q_norm.weight` [head_dim],
    /// `q_proj.weight` [hidden, heads·head_dim], `k_proj.weight` [hidden, kv_heads·head_dim],
    /// `gate_proj.weight` [hidden, intermediate]; the layer count is the number of consecutive
    /// `layers.{i}` present. `rope_theta` / `eps` come from outside the weights (`qwen3_hparams`).
    pub fn detect(
        wb: &WeightBuilder<'_, '_>,
        rope_theta: Option<f32>,
        eps: Option<f32>,
    ) -> Result<Self, RunnerError> {
        Self::detect_with_heads(wb, rope_theta, eps, None)
    }

    /// [`Self::detect`] for Qwen3 and for Qwen2 / Qwen2.5-VL (no q/k norms, biased q/k/v):
    /// without q/k norms the head width is `q rows / heads` with `heads` from the model's
    /// config (`qwen3_heads`), else [`QWEN2_HEAD_DIM`].
    pub fn detect_with_heads(
        wb: &WeightBuilder<'_, '_>,
        rope_theta: Option<f32>,
        eps: Option<f32>,
        heads_hint: Option<usize>,
    ) -> Result<Self, RunnerError> {
        let shape = |name: &str| wb.require_ne(name, ORIGIN);
        let bad = |name: &str, reason: String| wb.bad_data(name, ORIGIN, reason);
        let [hidden, vocab, ..] = shape("embed_tokens.weight")?;
        let attn = "layers.0.self_attn";
        let qn_key = format!("{attn}.q_norm.weight");
        let q_key = format!("{attn}.q_proj.weight");
        let [q_in, q_rows, ..] = shape(&q_key)?;
        let qk_norm = wb.contains(&qn_key);
        let head_dim = if qk_norm {
            shape(&qn_key)?[0]
        } else {
            match heads_hint {
                Some(h) if h > 0 && q_rows.is_multiple_of(h) => q_rows / h,
                Some(h) => {
                    return Err(bad(
                        &q_key,
                        format!("{q_rows} rows do not split into the config's {h} heads"),
                    ))
                }
                None => QWEN2_HEAD_DIM,
            }
        };
        let k_key = format!("{attn}.k_proj.weight");
        let [_, k_rows, ..] = shape(&k_key)?;
        if head_dim == 0
            || !head_dim.is_multiple_of(2)
            || q_in != hidden
            || !q_rows.is_multiple_of(head_dim)
        {
            return Err(bad(
                &q_key,
                format!(
                    "shape [{q_in}, {q_rows}] does not fit hidden {hidden} and head_dim {head_dim}"
                ),
            ));
        }
        let heads = q_rows / head_dim;
        if k_rows == 0
            || !k_rows.is_multiple_of(head_dim)
            || !heads.is_multiple_of(k_rows / head_dim)
        {
            return Err(bad(
                &k_key,
                format!("{k_rows} rows are not a divisor of {heads} heads × {head_dim}"),
            ));
        }
        let [_, intermediate, ..] = shape("layers.0.mlp.gate_proj.weight")?;
        let layers = (0..)
            .take_while(|i| wb.contains(&format!("layers.{i}.self_attn.q_proj.weight")))
            .count();
        let config = Self {
            vocab,
            hidden,
            layers,
            heads,
            kv_heads: k_rows / head_dim,
            head_dim,
            intermediate,
            eps: eps.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
            qk_norm,
            qkv_bias: wb.contains(&format!("{attn}.q_proj.bias")),
        };
        log::debug!(
            "Qwen3 text encoder: {} layers, hidden {}, {} heads ({} kv) × {}, ffn {}, vocab {}, rope θ {}",
            config.layers,
            config.hidden,
            config.heads,
            config.kv_heads,
            config.head_dim,
            config.intermediate,
            config.vocab,
            config.rope_theta
        );
        Ok(config)
    }
}
