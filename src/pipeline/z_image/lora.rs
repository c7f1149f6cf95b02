//! Z-Image's LoRA names: a released-layout module's diffusers names (the fused `attention.qkv`
//! as `to_q`/`to_k`/`to_v` row thirds) and a diffusers-layout module's released name.

use crate::pipeline::lora::names::{Alias, RowSlice};

/// Top-level modules: released name ↔ diffusers name (patch 2 × 2 × 1, the only released one).
const TOP: [(&str, &str); 3] = [
    ("x_embedder", "all_x_embedder.2-1"),
    ("final_layer.linear", "all_final_layer.2-1.linear"),
    (
        "final_layer.adaLN_modulation.1",
        "all_final_layer.2-1.adaLN_modulation.1",
    ),
];

/// Block stacks whose modules are named alike in both layouts but for attention.
const STACKS: [&str; 3] = ["layers", "noise_refiner", "context_refiner"];

/// The alias rule (`Family::lora_aliases`).
pub fn z_image(names: &[&str]) -> Vec<Vec<Alias>> {
    names.iter().map(|n| one(n)).collect()
}

fn one(name: &str) -> Vec<Alias> {
    let whole = |n: String| {
        vec![Alias {
            name: n,
            part: None,
        }]
    };
    if let Some((_, d)) = TOP.iter().find(|(r, _)| *r == name) {
        return whole(d.to_string());
    }
    if let Some((r, _)) = TOP.iter().find(|(_, d)| *d == name) {
        return whole(r.to_string());
    }
    for stack in STACKS {
        let Some(rest) = name.strip_prefix(stack).and_then(|r| r.strip_prefix('.')) else {
            continue;
        };
        let Some((i, leaf)) = rest.split_once('.') else {
            continue;
        };
        let head = format!("{stack}.{i}");
        return match leaf {
            "attention.qkv" => ["to_q", "to_k", "to_v"]
                .iter()
                .enumerate()
                .map(|(k, p)| Alias {
                    name: format!("{head}.attention.{p}"),
                    part: Some(RowSlice::one(k, 3)),
                })
                .collect(),
            "attention.out" => whole(format!("{head}.attention.to_out.0")),
            "attention.to_out.0" => whole(format!("{head}.attention.out")),
            _ => Vec::new(),
        };
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_qkv_takes_the_split_names_as_thirds() {
        let a = one("layers.3.attention.qkv");
        assert_eq!(a.len(), 3);
        assert_eq!(a[1].name, "layers.3.attention.to_k");
        assert_eq!(a[1].part, Some(RowSlice::one(1, 3)));
        assert_eq!(
            one("context_refiner.0.attention.out")[0].name,
            "context_refiner.0.attention.to_out.0"
        );
        assert_eq!(one("x_embedder")[0].name, "all_x_embedder.2-1");
        assert_eq!(
            one("all_final_layer.2-1.linear")[0].name,
            "final_layer.linear"
        );
        assert!(one("layers.3.feed_forward.w1").is_empty());
    }
}
