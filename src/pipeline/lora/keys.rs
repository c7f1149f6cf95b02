//! LoRA tensor names: which model part a tensor adapts, which module, and which piece of the
//! adapter it is, for every common spelling (kohya/A1111, diffusers/PEFT, the older diffusers
//! attention-processor format, ComfyUI, LyCORIS LoHa/LoKr, full differences).
//!
//! Names arrive as the weights store normalised them: a file's `text_encoder.` is
//! `cond_stage_model.transformer.`, `text_encoder_2.` is `cond_stage_model.1.transformer.`,
//! `diffusion_model.` is `model.diffusion_model.` (see `weights::names`).

/// The model part a LoRA tensor adapts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    /// The UNet / diffusion transformer.
    Diffusion,
    /// Text encoder 1, 2 or 3 (kohya's `lora_te1_`…`lora_te3_`; `lora_te_` is 1).
    TextEncoder(u8),
}

impl std::fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoraTarget::Diffusion => f.write_str("diffusion model"),
            LoraTarget::TextEncoder(n) => write!(f, "text encoder {n}"),
        }
    }
}

/// One piece of an adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    Down,
    Up,
    /// LoCon's Tucker core (`lora_mid`).
    Mid,
    Alpha,
    Scale,
    /// A full difference of the weight (`.diff`) or of the bias (`.diff_b`).
    Diff,
    DiffBias,
    HadaW1A,
    HadaW1B,
    HadaW2A,
    HadaW2B,
    HadaT1,
    HadaT2,
    LokrW1,
    LokrW1A,
    LokrW1B,
    LokrW2,
    LokrW2A,
    LokrW2B,
    LokrT2,
    /// DoRA magnitudes (PEFT `lora_magnitude_vector`, kohya `dora_scale`).
    Magnitude,
}

/// Piece suffixes, longest first where one ends another.
const PARTS: [(&str, Part); 33] = [
    (".lora_down.weight", Part::Down),
    (".lora_up.weight", Part::Up),
    (".lora_mid.weight", Part::Mid),
    (".lora_A.default.weight", Part::Down),
    (".lora_B.default.weight", Part::Up),
    (".lora_A.weight", Part::Down),
    (".lora_B.weight", Part::Up),
    (".lora_linear_layer.down.weight", Part::Down),
    (".lora_linear_layer.up.weight", Part::Up),
    ("_lora.down.weight", Part::Down),
    ("_lora.up.weight", Part::Up),
    (".lora.down.weight", Part::Down),
    (".lora.up.weight", Part::Up),
    (".lora_magnitude_vector.default.weight", Part::Magnitude),
    (".lora_magnitude_vector.default", Part::Magnitude),
    (".lora_magnitude_vector", Part::Magnitude),
    (".dora_scale", Part::Magnitude),
    (".alpha", Part::Alpha),
    (".scale", Part::Scale),
    (".diff_b", Part::DiffBias),
    (".diff", Part::Diff),
    (".hada_w1_a", Part::HadaW1A),
    (".hada_w1_b", Part::HadaW1B),
    (".hada_w2_a", Part::HadaW2A),
    (".hada_w2_b", Part::HadaW2B),
    (".hada_t1", Part::HadaT1),
    (".hada_t2", Part::HadaT2),
    (".lokr_w1_a", Part::LokrW1A),
    (".lokr_w1_b", Part::LokrW1B),
    (".lokr_w2_a", Part::LokrW2A),
    (".lokr_w2_b", Part::LokrW2B),
    (".lokr_w1", Part::LokrW1),
    (".lokr_w2", Part::LokrW2),
];

/// kohya's flat prefixes (module names with `.` written `_`).
const FLAT: [(&str, LoraTarget); 7] = [
    ("lora_unet_", LoraTarget::Diffusion),
    ("lora_transformer_", LoraTarget::Diffusion),
    ("lycoris_", LoraTarget::Diffusion),
    ("lora_te1_", LoraTarget::TextEncoder(1)),
    ("lora_te2_", LoraTarget::TextEncoder(2)),
    ("lora_te3_", LoraTarget::TextEncoder(3)),
    ("lora_te_", LoraTarget::TextEncoder(1)),
];

/// Dotted prefixes (after the store's normalisation).
const DOTTED: [(&str, LoraTarget); 9] = [
    ("model.diffusion_model.", LoraTarget::Diffusion),
    ("base_model.model.", LoraTarget::Diffusion),
    ("unet.", LoraTarget::Diffusion),
    ("transformer.", LoraTarget::Diffusion),
    ("lora_unet.", LoraTarget::Diffusion),
    (
        "cond_stage_model.1.transformer.",
        LoraTarget::TextEncoder(2),
    ),
    ("cond_stage_model.transformer.", LoraTarget::TextEncoder(1)),
    (
        "text_encoders.t5xxl.transformer.",
        LoraTarget::TextEncoder(3),
    ),
    ("text_encoders.llm.", LoraTarget::TextEncoder(1)),
];

/// What a LoRA tensor name says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraKey {
    pub target: LoraTarget,
    /// The adapted module, flattened (`.` → `_`), as kohya writes it and as it is matched.
    pub module: String,
    pub part: Part,
}

/// `a.b_c.d` → `a_b_c_d`: kohya's spelling, in which every naming scheme is compared.
pub fn flatten(name: &str) -> String {
    name.replace('.', "_")
}

/// Parses one tensor name of a LoRA file; `None` for names that are no adapter piece.
pub fn parse(name: &str) -> Option<LoraKey> {
    let (stem, part) = PARTS
        .iter()
        .find_map(|(suffix, part)| name.strip_suffix(suffix).map(|s| (s, *part)))?;
    if let Some((rest, target)) = FLAT
        .iter()
        .find_map(|(p, t)| stem.strip_prefix(p).map(|r| (r, *t)))
    {
        return Some(LoraKey {
            target,
            module: rest.to_string(),
            part,
        });
    }
    let (rest, target) = DOTTED
        .iter()
        .find_map(|(p, t)| stem.strip_prefix(p).map(|r| (r, *t)))
        .unwrap_or((stem, LoraTarget::Diffusion));
    Some(LoraKey {
        target,
        module: flatten(&processor_module(rest)),
        part,
    })
}

/// The older diffusers attention-processor names (`attn1.processor.to_out_lora`) as the
/// module they adapt (`attn1.to_out.0`).
fn processor_module(module: &str) -> String {
    let m = module.replace(".processor.", ".");
    match m.strip_suffix("to_out") {
        Some(head) if module.ends_with(".processor.to_out") => format!("{head}to_out.0"),
        _ => m,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(target: LoraTarget, module: &str, part: Part) -> Option<LoraKey> {
        Some(LoraKey {
            target,
            module: module.into(),
            part,
        })
    }

    #[test]
    fn kohya_names() {
        assert_eq!(
            parse("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"),
            key(
                LoraTarget::Diffusion,
                "down_blocks_0_attentions_0_proj_in",
                Part::Down
            )
        );
        assert_eq!(
            parse("lora_te2_text_model_encoder_layers_0_mlp_fc1.alpha"),
            key(
                LoraTarget::TextEncoder(2),
                "text_model_encoder_layers_0_mlp_fc1",
                Part::Alpha
            )
        );
        assert_eq!(
            parse("lora_te_text_model_encoder_layers_1_self_attn_q_proj.hada_w1_a"),
            key(
                LoraTarget::TextEncoder(1),
                "text_model_encoder_layers_1_self_attn_q_proj",
                Part::HadaW1A
            )
        );
    }

    #[test]
    fn diffusers_and_peft_names() {
        assert_eq!(
            parse("unet.mid_block.attentions.0.proj_out.lora_A.weight"),
            key(
                LoraTarget::Diffusion,
                "mid_block_attentions_0_proj_out",
                Part::Down
            )
        );
        assert_eq!(
            parse("cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.k_proj.lora.up.weight"),
            key(
                LoraTarget::TextEncoder(1),
                "text_model_encoder_layers_0_self_attn_k_proj",
                Part::Up
            )
        );
        assert_eq!(
            parse("unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_out_lora.down.weight"),
            key(
                LoraTarget::Diffusion,
                "down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_out_0",
                Part::Down
            )
        );
        assert_eq!(
            parse("transformer_blocks.0.attn.to_q.lora_B.weight"),
            key(
                LoraTarget::Diffusion,
                "transformer_blocks_0_attn_to_q",
                Part::Up
            )
        );
        assert_eq!(parse("transformer_blocks.0.attn.to_q.weight"), None);
    }
}
