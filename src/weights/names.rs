//! Checkpoint name normalisation (model families are detected by their registry entries,
//! `pipeline::registry`).
//!
//! Checkpoints name the same tensor differently depending on who saved them: a full SD-style
//! checkpoint says `model.diffusion_model.x_embedder.proj.weight`, ComfyUI's split files say
//! `diffusion_model.x_embedder...`, a bare file says `x_embedder...`. The store keeps one
//! canonical spelling per component (the prefixes stable-diffusion.cpp uses in its
//! `name_conversion.cpp` / `model_loader.cpp`), so a model only ever asks for
//! `<Component::prefix()><name inside the component>`.
//!
//! | name starts with                    | component   |
//! |-------------------------------------|-------------|
//! | `model.diffusion_model.`            | Diffusion   |
//! | `diffusion_model.`                  | Diffusion   |
//! | `first_stage_model.`, `vae.`        | Vae         |
//! | `text_encoders.t5xxl.transformer.`, `text_encoders.t5xxl.` | T5 |
//! | `text_encoders.llm.`                | Llm         |
//! | `cond_stage_model.transformer.`, `text_encoder.`, `te.` | TextEncoder |
//! | `cond_stage_model.model.` (SD2 OpenCLIP), `conditioner.embedders.0.transformer.`, `text_encoders.clip_l.` | TextEncoder |
//! | `cond_stage_model.1.transformer.`, `conditioner.embedders.1.model.`, `conditioner.embedders.0.model.` (SDXL refiner), `text_encoders.clip_g.` | TextEncoder2 |

/// A model component, each with one canonical name prefix in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    Diffusion,
    Vae,
    /// T5 text encoder (PixArt).
    T5,
    /// LLM text encoder (Qwen Image 2.1's Qwen3-VL).
    Llm,
    /// Any other text encoder (the generic `cond_stage_model.transformer.` slot: SD1's and
    /// SDXL's CLIP ViT-L, SD2's OpenCLIP ViT-H).
    TextEncoder,
    /// SDXL's second text encoder (OpenCLIP ViT-bigG), upstream's `cond_stage_model.1.` slot.
    TextEncoder2,
}

impl Component {
    /// The canonical prefix of this component's tensors in the store.
    pub fn prefix(self) -> &'static str {
        match self {
            Component::Diffusion => "model.diffusion_model.",
            Component::Vae => "first_stage_model.",
            Component::T5 => "text_encoders.t5xxl.transformer.",
            Component::Llm => "text_encoders.llm.",
            Component::TextEncoder => "cond_stage_model.transformer.",
            Component::TextEncoder2 => "cond_stage_model.1.transformer.",
        }
    }

    fn is_text(self) -> bool {
        matches!(
            self,
            Component::T5 | Component::Llm | Component::TextEncoder | Component::TextEncoder2
        )
    }
}

/// Known prefixes, longest first within each component so the most specific one wins.
/// The CLIP ones keep what follows them as the file spelled it (`text_model.…` for HF
/// layouts, `transformer.resblocks.…` for OpenCLIP): the CLIP weight source reads both.
const PREFIXES: [(&str, Component); 21] = [
    ("model.diffusion_model.", Component::Diffusion),
    ("diffusion_model.", Component::Diffusion),
    ("first_stage_model.", Component::Vae),
    ("vae.", Component::Vae),
    ("text_encoders.t5xxl.transformer.", Component::T5),
    ("text_encoders.t5xxl.", Component::T5),
    ("text_encoders.llm.", Component::Llm),
    ("cond_stage_model.1.transformer.", Component::TextEncoder2),
    ("conditioner.embedders.1.model.", Component::TextEncoder2),
    ("conditioner.embedders.0.model.", Component::TextEncoder2),
    ("text_encoders.clip_g.transformer.", Component::TextEncoder2),
    ("text_encoders.clip_g.", Component::TextEncoder2),
    ("text_encoder_2.", Component::TextEncoder2),
    ("te.1.", Component::TextEncoder2),
    ("cond_stage_model.transformer.", Component::TextEncoder),
    ("cond_stage_model.model.", Component::TextEncoder),
    (
        "conditioner.embedders.0.transformer.",
        Component::TextEncoder,
    ),
    ("text_encoders.clip_l.transformer.", Component::TextEncoder),
    ("text_encoders.clip_l.", Component::TextEncoder),
    ("text_encoder.", Component::TextEncoder),
    ("te.", Component::TextEncoder),
];

/// Splits a known component prefix off `name`: `("model.diffusion_model.x.weight")` →
/// `Some((Diffusion, "x.weight"))`; `None` when no known prefix matches.
pub fn split_component(name: &str) -> Option<(Component, &str)> {
    PREFIXES
        .iter()
        .find_map(|&(p, c)| name.strip_prefix(p).map(|rest| (c, rest)))
}

/// The component whose canonical prefix is `prefix`, if any.
pub fn component_of_prefix(prefix: &str) -> Option<Component> {
    PREFIXES
        .iter()
        .find(|&&(p, _)| p == prefix)
        .map(|&(_, c)| c)
}

/// The store name of a tensor called `name` in a file added with `prefix`.
///
/// * A name with a known component prefix is rewritten to that component's canonical prefix —
///   or to `prefix` itself when `prefix` is a known prefix of the same component (text encoders
///   count as one family, so a T5 file whose names say `text_encoder.` lands under the T5 prefix
///   it was loaded with).
/// * Any other name gets `prefix` prepended (unless it already starts with it).
pub fn normalize_name(name: &str, prefix: &str) -> String {
    let given = component_of_prefix(prefix);
    if let Some((comp, rest)) = split_component(name) {
        let same = given.is_some_and(|g| g == comp || (g.is_text() && comp.is_text()));
        let target = match given {
            Some(g) if same => g.prefix(),
            _ => comp.prefix(),
        };
        return format!("{target}{rest}");
    }
    if name.starts_with(prefix) {
        name.to_string()
    } else {
        format!("{prefix}{name}")
    }
}

/// llama.cpp GGUF T5 names → HF transformers names (`enc.blk.3.attn_q.weight` →
/// `encoder.block.3.layer.0.SelfAttention.q.weight`); `None` for names outside the scheme.
/// Mapping as in stable-diffusion.cpp's `convert_cond_stage_model_name` T5 table.
pub fn t5_llamacpp_to_hf(name: &str) -> Option<String> {
    const TOP: [(&str, &str); 3] = [
        ("token_embd.", "shared."),
        ("enc.output_norm.", "encoder.final_layer_norm."),
        ("dec.output_norm.", "decoder.final_layer_norm."),
    ];
    const LAYER: [(&str, &str); 10] = [
        ("attn_q.", "layer.0.SelfAttention.q."),
        ("attn_k.", "layer.0.SelfAttention.k."),
        ("attn_v.", "layer.0.SelfAttention.v."),
        ("attn_o.", "layer.0.SelfAttention.o."),
        (
            "attn_rel_b.",
            "layer.0.SelfAttention.relative_attention_bias.",
        ),
        ("attn_norm.", "layer.0.layer_norm."),
        ("ffn_norm.", "layer.1.layer_norm."),
        ("ffn_gate.", "layer.1.DenseReluDense.wi_0."),
        ("ffn_up.", "layer.1.DenseReluDense.wi_1."),
        ("ffn_down.", "layer.1.DenseReluDense.wo."),
    ];
    if let Some(out) = TOP
        .iter()
        .find_map(|(a, b)| name.strip_prefix(a).map(|r| format!("{b}{r}")))
    {
        return Some(out);
    }
    let rest = name.strip_prefix("enc.blk.")?;
    let (idx, tail) = rest.split_once('.')?;
    if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    LAYER.iter().find_map(|(a, b)| {
        tail.strip_prefix(a)
            .map(|r| format!("encoder.block.{idx}.{b}{r}"))
    })
}

/// A tensor name mapped to another naming scheme. `part = Some((i, n))` means the source tensor
/// is part `i` of `n` equal slices, concatenated along the output dimension (PyTorch dim 0,
/// ggml's outermost), of the fused target tensor `name` — e.g. diffusers' separate to_q/to_k/to_v
/// become one `attn.qkv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedName {
    pub name: String,
    pub part: Option<(usize, usize)>,
}

/// diffusers → original PixArt names outside the blocks (prefixes).
pub const PIXART_TOP: [(&str, &str); 11] = [
    ("pos_embed.proj.", "x_embedder.proj."),
    (
        "adaln_single.emb.timestep_embedder.linear_1.",
        "t_embedder.mlp.0.",
    ),
    (
        "adaln_single.emb.timestep_embedder.linear_2.",
        "t_embedder.mlp.2.",
    ),
    (
        "adaln_single.emb.resolution_embedder.linear_1.",
        "csize_embedder.mlp.0.",
    ),
    (
        "adaln_single.emb.resolution_embedder.linear_2.",
        "csize_embedder.mlp.2.",
    ),
    (
        "adaln_single.emb.aspect_ratio_embedder.linear_1.",
        "ar_embedder.mlp.0.",
    ),
    (
        "adaln_single.emb.aspect_ratio_embedder.linear_2.",
        "ar_embedder.mlp.2.",
    ),
    ("adaln_single.linear.", "t_block.1."),
    ("caption_projection.linear_1.", "y_embedder.y_proj.fc1."),
    ("caption_projection.linear_2.", "y_embedder.y_proj.fc2."),
    ("proj_out.", "final_layer.linear."),
];

/// Part `i` of `n` equal row slices of a fused tensor.
pub type FusedPart = Option<(usize, usize)>;

/// diffusers block-relative prefix → original prefix, with the part of a fused tensor.
pub const PIXART_BLOCK: [(&str, &str, FusedPart); 10] = [
    ("attn1.to_q.", "attn.qkv.", Some((0, 3))),
    ("attn1.to_k.", "attn.qkv.", Some((1, 3))),
    ("attn1.to_v.", "attn.qkv.", Some((2, 3))),
    ("attn1.to_out.0.", "attn.proj.", None),
    ("attn2.to_q.", "cross_attn.q_linear.", None),
    ("attn2.to_k.", "cross_attn.kv_linear.", Some((0, 2))),
    ("attn2.to_v.", "cross_attn.kv_linear.", Some((1, 2))),
    ("attn2.to_out.0.", "cross_attn.proj.", None),
    ("ff.net.0.proj.", "mlp.fc1.", None),
    ("ff.net.2.", "mlp.fc2.", None),
];

/// diffusers PixArt names (`PixArtTransformer2DModel`) → original PixArt repo names, without
/// component prefix. Names outside the table come back unchanged. Same correspondence as
/// stable-diffusion.cpp's PixArt name conversion.
pub fn pixart_diffusers_to_original(name: &str) -> MappedName {
    let plain = |n: String| MappedName {
        name: n,
        part: None,
    };
    if name == "scale_shift_table" {
        return plain("final_layer.scale_shift_table".into());
    }
    if let Some(n) = PIXART_TOP
        .iter()
        .find_map(|(a, b)| name.strip_prefix(a).map(|r| format!("{b}{r}")))
    {
        return plain(n);
    }
    let Some((idx, tail)) = name
        .strip_prefix("transformer_blocks.")
        .and_then(|r| r.split_once('.'))
    else {
        return plain(name.to_string());
    };
    if let Some((b, r, part)) = PIXART_BLOCK
        .iter()
        .find_map(|(a, b, part)| tail.strip_prefix(a).map(|r| (b, r, *part)))
    {
        return MappedName {
            name: format!("blocks.{idx}.{b}{r}"),
            part,
        };
    }
    plain(format!("blocks.{idx}.{tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_table() {
        let d = Component::Diffusion.prefix();
        let cases = [
            (
                "x_embedder.proj.weight",
                d,
                "model.diffusion_model.x_embedder.proj.weight",
            ),
            (
                "diffusion_model.x.weight",
                d,
                "model.diffusion_model.x.weight",
            ),
            (
                "model.diffusion_model.x.weight",
                d,
                "model.diffusion_model.x.weight",
            ),
            (
                "model.diffusion_model.x.weight",
                "",
                "model.diffusion_model.x.weight",
            ),
            (
                "vae.decoder.conv_in.weight",
                "",
                "first_stage_model.decoder.conv_in.weight",
            ),
            (
                "first_stage_model.decoder.conv_in.weight",
                d,
                "first_stage_model.decoder.conv_in.weight",
            ),
            (
                "decoder.conv_in.weight",
                "vae.",
                "vae.decoder.conv_in.weight",
            ),
            (
                "text_encoder.shared.weight",
                Component::T5.prefix(),
                "text_encoders.t5xxl.transformer.shared.weight",
            ),
            (
                "shared.weight",
                Component::T5.prefix(),
                "text_encoders.t5xxl.transformer.shared.weight",
            ),
            (
                "te.shared.weight",
                "",
                "cond_stage_model.transformer.shared.weight",
            ),
            ("plain", "", "plain"),
        ];
        for (name, prefix, want) in cases {
            assert_eq!(normalize_name(name, prefix), want, "{name} with {prefix}");
        }
    }

    #[test]
    fn clip_slots() {
        let l = Component::TextEncoder.prefix();
        let g = Component::TextEncoder2.prefix();
        let cases = [
            // SD1 and SDXL's CLIP-L, SD2's OpenCLIP-H: the rest of the name as the file has it.
            (
                "cond_stage_model.transformer.text_model.final_layer_norm.weight",
                "",
                "cond_stage_model.transformer.text_model.final_layer_norm.weight",
            ),
            (
                "cond_stage_model.model.ln_final.weight",
                "",
                "cond_stage_model.transformer.ln_final.weight",
            ),
            (
                "conditioner.embedders.0.transformer.text_model.x",
                "",
                "cond_stage_model.transformer.text_model.x",
            ),
            (
                "conditioner.embedders.1.model.ln_final.bias",
                "",
                "cond_stage_model.1.transformer.ln_final.bias",
            ),
            // The SDXL refiner has only bigG, as embedder 0.
            (
                "conditioner.embedders.0.model.positional_embedding",
                "",
                "cond_stage_model.1.transformer.positional_embedding",
            ),
            (
                "text_encoders.clip_g.transformer.text_model.x",
                "",
                "cond_stage_model.1.transformer.text_model.x",
            ),
            (
                "te.1.text_model.x",
                "",
                "cond_stage_model.1.transformer.text_model.x",
            ),
            // A ComfyUI clip_l file under --clip_l, a bare one under --clip_g.
            (
                "text_encoders.clip_l.transformer.text_model.x",
                l,
                "cond_stage_model.transformer.text_model.x",
            ),
            (
                "text_model.x",
                g,
                "cond_stage_model.1.transformer.text_model.x",
            ),
        ];
        for (name, prefix, want) in cases {
            assert_eq!(normalize_name(name, prefix), want, "{name} with {prefix}");
        }
    }

    #[test]
    fn pixart_names() {
        let m = pixart_diffusers_to_original;
        assert_eq!(m("pos_embed.proj.weight").name, "x_embedder.proj.weight");
        assert_eq!(m("adaln_single.linear.bias").name, "t_block.1.bias");
        assert_eq!(m("scale_shift_table").name, "final_layer.scale_shift_table");
        assert_eq!(m("proj_out.weight").name, "final_layer.linear.weight");
        let k = m("transformer_blocks.12.attn1.to_k.weight");
        assert_eq!(
            (k.name.as_str(), k.part),
            ("blocks.12.attn.qkv.weight", Some((1, 3)))
        );
        let v = m("transformer_blocks.0.attn2.to_v.bias");
        assert_eq!(
            (v.name.as_str(), v.part),
            ("blocks.0.cross_attn.kv_linear.bias", Some((1, 2)))
        );
        assert_eq!(
            m("transformer_blocks.3.scale_shift_table").name,
            "blocks.3.scale_shift_table"
        );
        assert_eq!(
            m("transformer_blocks.3.ff.net.2.weight").name,
            "blocks.3.mlp.fc2.weight"
        );
        assert_eq!(m("other.weight").name, "other.weight");
    }

    #[test]
    fn t5_gguf_names() {
        assert_eq!(
            t5_llamacpp_to_hf("enc.blk.3.attn_q.weight").as_deref(),
            Some("encoder.block.3.layer.0.SelfAttention.q.weight")
        );
        assert_eq!(
            t5_llamacpp_to_hf("enc.blk.0.ffn_gate.weight").as_deref(),
            Some("encoder.block.0.layer.1.DenseReluDense.wi_0.weight")
        );
        assert_eq!(
            t5_llamacpp_to_hf("token_embd.weight").as_deref(),
            Some("shared.weight")
        );
        assert_eq!(t5_llamacpp_to_hf("enc.blk.x.attn_q.weight"), None);
        assert_eq!(t5_llamacpp_to_hf("other"), None);
    }
}
