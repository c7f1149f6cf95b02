//! The original Wan 2.x T5 names (`wan/modules/t5.py`, as in `models_t5_umt5-xxl-enc-bf16.pth`)
//! mapped to transformers' names.
//!
//! Wan's `T5Encoder` keeps the same tensors under its own module tree: `token_embedding`,
//! `blocks.N.{norm1, attn.{q,k,v,o}, norm2, ffn.{gate.0, fc1, fc2}, pos_embedding.embedding}`,
//! `norm`. Its feed-forward computes `fc2(fc1(x) · gelu(gate.0(x)))`, so `gate.0` is the GELU
//! branch `wi_0` and `fc1` the linear branch `wi_1`.

/// Block-relative Wan name → transformers name under `encoder.block.N.`.
const BLOCK: [(&str, &str); 10] = [
    ("norm1.", "layer.0.layer_norm."),
    ("attn.q.", "layer.0.SelfAttention.q."),
    ("attn.k.", "layer.0.SelfAttention.k."),
    ("attn.v.", "layer.0.SelfAttention.v."),
    ("attn.o.", "layer.0.SelfAttention.o."),
    (
        "pos_embedding.embedding.",
        "layer.0.SelfAttention.relative_attention_bias.",
    ),
    ("norm2.", "layer.1.layer_norm."),
    ("ffn.gate.0.", "layer.1.DenseReluDense.wi_0."),
    ("ffn.fc1.", "layer.1.DenseReluDense.wi_1."),
    ("ffn.fc2.", "layer.1.DenseReluDense.wo."),
];

/// Wan names outside the blocks. `pos_embedding` is the one shared table of Wan's plain-T5
/// configuration (`shared_pos=True`); transformers keeps that table in block 0.
const TOP: [(&str, &str); 3] = [
    ("token_embedding.", "shared."),
    ("norm.", "encoder.final_layer_norm."),
    (
        "pos_embedding.embedding.",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.",
    ),
];

/// `blocks.3.ffn.fc1.weight` → `encoder.block.3.layer.1.DenseReluDense.wi_1.weight`;
/// `None` for names outside Wan's scheme.
pub fn wan_t5_to_hf(name: &str) -> Option<String> {
    if let Some(out) = TOP
        .iter()
        .find_map(|(a, b)| name.strip_prefix(a).map(|r| format!("{b}{r}")))
    {
        return Some(out);
    }
    let (idx, tail) = name.strip_prefix("blocks.")?.split_once('.')?;
    if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    BLOCK.iter().find_map(|(a, b)| {
        tail.strip_prefix(a)
            .map(|r| format!("encoder.block.{idx}.{b}{r}"))
    })
}

#[cfg(test)]
mod tests {
    use super::wan_t5_to_hf;

    #[test]
    fn maps_wan_names() {
        let cases = [
            ("token_embedding.weight", "shared.weight"),
            ("norm.weight", "encoder.final_layer_norm.weight"),
            (
                "blocks.0.attn.q.weight",
                "encoder.block.0.layer.0.SelfAttention.q.weight",
            ),
            (
                "blocks.23.pos_embedding.embedding.weight",
                "encoder.block.23.layer.0.SelfAttention.relative_attention_bias.weight",
            ),
            (
                "blocks.2.ffn.gate.0.weight",
                "encoder.block.2.layer.1.DenseReluDense.wi_0.weight",
            ),
            (
                "blocks.2.ffn.fc2.weight",
                "encoder.block.2.layer.1.DenseReluDense.wo.weight",
            ),
            (
                "blocks.1.norm2.weight",
                "encoder.block.1.layer.1.layer_norm.weight",
            ),
        ];
        for (wan, hf) in cases {
            assert_eq!(wan_t5_to_hf(wan).as_deref(), Some(hf), "{wan}");
        }
        assert_eq!(wan_t5_to_hf("blocks.x.attn.q.weight"), None);
        assert_eq!(wan_t5_to_hf("blocks.1.ffn.gate.1.weight"), None);
        assert_eq!(
            wan_t5_to_hf("encoder.block.0.layer.0.SelfAttention.q.weight"),
            None
        );
    }
}
