//! The other names a model weight goes by in LoRA files: each family lists the alias rules of
//! its architectures (`Family::lora_aliases`), and a LoRA module matches a weight when its
//! flattened name equals the weight's own or an alias's (see [`super::keys::flatten`]).
//!
//! An alias may name a part of a fused weight (diffusers' separate `to_q`/`to_k`/`to_v` on an
//! original-layout `qkv`): its difference then lands on that part's rows.

use crate::weights::names::{PIXART_BLOCK, PIXART_TOP};

/// Rows `index·R/of .. (index + span)·R/of` of a weight with R rows: a part of a fused weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSlice {
    pub index: usize,
    pub of: usize,
    pub span: usize,
}

impl RowSlice {
    /// Slice `index` of `of` equal ones.
    pub const fn one(index: usize, of: usize) -> RowSlice {
        RowSlice { index, of, span: 1 }
    }

    /// (first row, rows) of this slice of `rows` rows.
    pub fn rows(&self, rows: usize) -> (usize, usize) {
        let unit = rows / self.of.max(1);
        (self.index * unit, self.span * unit)
    }
}

/// Another name of a module (dotted, without `.weight`), and the part of the module's rows it
/// covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alias {
    pub name: String,
    pub part: Option<RowSlice>,
}

impl Alias {
    fn whole(name: String) -> Alias {
        Alias { name, part: None }
    }
}

/// Alias rule: the other names of each model module (declared names without `.weight`),
/// given all of the component's modules (a rule may read the layout from them).
pub type AliasRule = fn(&[&str]) -> Vec<Vec<Alias>>;

/// A rule that looks at one name at a time.
fn each(names: &[&str], f: impl Fn(&str) -> Vec<Alias>) -> Vec<Vec<Alias>> {
    names.iter().map(|n| f(n)).collect()
}

/// LDM resnet leaves and their diffusers names.
const RESNET_LEAVES: [(&str, &str); 6] = [
    ("in_layers.0", "norm1"),
    ("in_layers.2", "conv1"),
    ("emb_layers.1", "time_emb_proj"),
    ("out_layers.0", "norm2"),
    ("out_layers.3", "conv2"),
    ("skip_connection", "conv_shortcut"),
];

/// Whole-module LDM ↔ diffusers names outside the blocks.
const UNET_TOP: [(&str, &str); 7] = [
    ("input_blocks.0.0", "conv_in"),
    ("time_embed.0", "time_embedding.linear_1"),
    ("time_embed.2", "time_embedding.linear_2"),
    ("label_emb.0.0", "add_embedding.linear_1"),
    ("label_emb.0.2", "add_embedding.linear_2"),
    ("out.0", "conv_norm_out"),
    ("out.2", "conv_out"),
];

/// `idx.rest` → (idx, rest).
fn index_rest(s: &str) -> Option<(usize, &str)> {
    let (i, rest) = s.split_once('.').unwrap_or((s, ""));
    Some((i.parse().ok()?, rest))
}

fn resnet_to_diffusers(leaf: &str) -> Option<&'static str> {
    RESNET_LEAVES
        .iter()
        .find(|(l, _)| *l == leaf)
        .map(|(_, d)| *d)
}

fn resnet_to_ldm(leaf: &str) -> Option<&'static str> {
    RESNET_LEAVES
        .iter()
        .find(|(_, d)| *d == leaf)
        .map(|(l, _)| *l)
}

fn join(head: String, rest: &str) -> String {
    if rest.is_empty() {
        head
    } else {
        format!("{head}.{rest}")
    }
}

/// An LDM UNet module's diffusers name, with `slots` blocks per level (SD's three: two
/// resnets or attentions, then the down-sampler; three per up level).
fn unet_ldm_to_diffusers(name: &str, slots: usize) -> Option<String> {
    if let Some((_, d)) = UNET_TOP.iter().find(|(l, _)| *l == name) {
        return Some(d.to_string());
    }
    if let Some(rest) = name.strip_prefix("input_blocks.") {
        let (n, rest) = index_rest(rest)?;
        let (slot, leaf) = index_rest(rest)?;
        let (level, j) = ((n.checked_sub(1)?) / slots, (n - 1) % slots);
        return match slot {
            0 if j + 1 == slots && leaf == "op" => {
                Some(format!("down_blocks.{level}.downsamplers.0.conv"))
            }
            0 if j + 1 < slots => Some(format!(
                "down_blocks.{level}.resnets.{j}.{}",
                resnet_to_diffusers(leaf)?
            )),
            1 if j + 1 < slots => Some(join(format!("down_blocks.{level}.attentions.{j}"), leaf)),
            _ => None,
        };
    }
    if let Some(rest) = name.strip_prefix("middle_block.") {
        let (slot, leaf) = index_rest(rest)?;
        return match slot {
            0 | 2 => Some(format!(
                "mid_block.resnets.{}.{}",
                slot / 2,
                resnet_to_diffusers(leaf)?
            )),
            1 => Some(join("mid_block.attentions.0".into(), leaf)),
            _ => None,
        };
    }
    if let Some(rest) = name.strip_prefix("output_blocks.") {
        let (n, rest) = index_rest(rest)?;
        let (slot, leaf) = index_rest(rest)?;
        let (level, j) = (n / slots, n % slots);
        return match slot {
            0 => Some(format!(
                "up_blocks.{level}.resnets.{j}.{}",
                resnet_to_diffusers(leaf)?
            )),
            1 | 2 if leaf == "conv" => Some(format!("up_blocks.{level}.upsamplers.0.conv")),
            1 => Some(join(format!("up_blocks.{level}.attentions.{j}"), leaf)),
            _ => None,
        };
    }
    None
}

/// A diffusers UNet module's LDM names with `slots` blocks per level (the up-sampler has two
/// possible places).
fn unet_diffusers_to_ldm(name: &str, slots: usize) -> Vec<String> {
    if let Some((l, _)) = UNET_TOP.iter().find(|(_, d)| *d == name) {
        return vec![l.to_string()];
    }
    let parse = |prefix: &str| -> Option<(usize, &str, usize, String)> {
        let rest = name.strip_prefix(prefix)?;
        let (level, rest) = index_rest(rest)?;
        let (kind, rest) = rest.split_once('.')?;
        let (j, leaf) = index_rest(rest)?;
        Some((level, kind, j, leaf.to_string()))
    };
    if let Some((level, kind, j, leaf)) = parse("down_blocks.") {
        let n = slots * level + j + 1;
        return match kind {
            "resnets" => resnet_to_ldm(&leaf)
                .map(|l| vec![format!("input_blocks.{n}.0.{l}")])
                .unwrap_or_default(),
            "attentions" => vec![join(format!("input_blocks.{n}.1"), &leaf)],
            "downsamplers" if leaf == "conv" => {
                vec![format!("input_blocks.{}.0.op", slots * (level + 1))]
            }
            _ => Vec::new(),
        };
    }
    if let Some((level, kind, j, leaf)) = parse("up_blocks.") {
        let n = slots * level + j;
        return match kind {
            "resnets" => resnet_to_ldm(&leaf)
                .map(|l| vec![format!("output_blocks.{n}.0.{l}")])
                .unwrap_or_default(),
            "attentions" => vec![join(format!("output_blocks.{n}.1"), &leaf)],
            "upsamplers" if leaf == "conv" => (1..=2)
                .map(|s| format!("output_blocks.{}.{s}.conv", slots * level + slots - 1))
                .collect(),
            _ => Vec::new(),
        };
    }
    if let Some(rest) = name.strip_prefix("mid_block.") {
        let (kind, rest) = rest.split_once('.').unwrap_or((rest, ""));
        let Some((j, leaf)) = index_rest(rest) else {
            return Vec::new();
        };
        return match kind {
            "resnets" => resnet_to_ldm(leaf)
                .map(|l| vec![format!("middle_block.{}.{l}", 2 * j)])
                .unwrap_or_default(),
            "attentions" => vec![join("middle_block.1".into(), leaf)],
            _ => Vec::new(),
        };
    }
    Vec::new()
}

/// Blocks per level: an LDM file's first down-sampler sits at `input_blocks.<slots>` (with
/// a single level, past its last block); a diffusers folder has `layers_per_block` resnets a
/// level, plus the down-sampler's slot (diffusers' conversion; SD and SDXL have 3, tiny models
/// fewer).
fn unet_slots(names: &[&str]) -> usize {
    let input_block = |n: &&str| -> Option<(usize, String)> {
        let (i, rest) = n.strip_prefix("input_blocks.")?.split_once('.')?;
        Some((i.parse().ok()?, rest.to_string()))
    };
    let blocks: Vec<(usize, String)> = names.iter().filter_map(input_block).collect();
    let ldm = blocks
        .iter()
        .filter(|(_, rest)| rest == "0.op")
        .map(|(i, _)| *i)
        .min()
        .or_else(|| blocks.iter().map(|(i, _)| i + 1).max());
    let diffusers = names
        .iter()
        .filter_map(|n| {
            let rest = n.strip_prefix("down_blocks.0.resnets.")?;
            rest.split_once('.')?.0.parse::<usize>().ok()
        })
        .max()
        .map(|j| j + 2);
    ldm.or(diffusers).unwrap_or(3).max(2)
}

/// UNet modules: the other layout's name (LDM single files ↔ diffusers folders).
pub fn unet(names: &[&str]) -> Vec<Vec<Alias>> {
    let slots = unet_slots(names);
    each(names, |name| {
        let mut out: Vec<Alias> = unet_ldm_to_diffusers(name, slots)
            .into_iter()
            .map(Alias::whole)
            .collect();
        out.extend(
            unet_diffusers_to_ldm(name, slots)
                .into_iter()
                .map(Alias::whole),
        );
        out
    })
}

/// CLIP text encoders: transformers 5's `CLIPTextModel` names have no `text_model.` level.
pub fn clip(names: &[&str]) -> Vec<Vec<Alias>> {
    each(names, |name| {
        name.strip_prefix("text_model.")
            .map(|rest| vec![Alias::whole(rest.to_string())])
            .unwrap_or_default()
    })
}

/// PixArt: an original-layout module's diffusers names (the fused projections as parts).
pub fn pixart(names: &[&str]) -> Vec<Vec<Alias>> {
    each(names, pixart_one)
}

fn pixart_one(name: &str) -> Vec<Alias> {
    let dotted = format!("{name}.");
    if let Some((d, _)) = PIXART_TOP.iter().find(|(_, o)| *o == dotted) {
        return vec![Alias::whole(d.trim_end_matches('.').to_string())];
    }
    if name == "final_layer.scale_shift_table" {
        return vec![Alias::whole("scale_shift_table".into())];
    }
    let Some((idx, tail)) = name.strip_prefix("blocks.").and_then(|r| r.split_once('.')) else {
        return Vec::new();
    };
    let tail = format!("{tail}.");
    let mut out: Vec<Alias> = PIXART_BLOCK
        .iter()
        .filter(|(_, o, _)| *o == tail)
        .map(|(d, _, part)| Alias {
            name: format!("transformer_blocks.{idx}.{}", d.trim_end_matches('.')),
            part: part.map(|(i, n)| RowSlice::one(i, n)),
        })
        .collect();
    if out.is_empty() {
        out.push(Alias::whole(format!(
            "transformer_blocks.{idx}.{}",
            tail.trim_end_matches('.')
        )));
    }
    out
}

/// Qwen Image 2.1: a single file's fused `img_mlp.gate_up` is diffusers' `gate_layer` (first
/// half of the rows) and `proj` (second half).
pub fn qwen_image_2_1(names: &[&str]) -> Vec<Vec<Alias>> {
    each(names, qwen_gate_up)
}

fn qwen_gate_up(name: &str) -> Vec<Alias> {
    match name.strip_suffix(".gate_up") {
        Some(head) => vec![
            Alias {
                name: format!("{head}.gate_layer"),
                part: Some(RowSlice::one(0, 2)),
            },
            Alias {
                name: format!("{head}.proj"),
                part: Some(RowSlice::one(1, 2)),
            },
        ],
        None => Vec::new(),
    }
}

/// FLUX.1 / Chroma whole modules: BFL name ↔ diffusers name, inside a double block, a single
/// block, or at the top.
const FLUX_DOUBLE: [(&str, &str); 10] = [
    ("img_attn.proj", "attn.to_out.0"),
    ("txt_attn.proj", "attn.to_add_out"),
    ("img_mlp.0", "ff.net.0.proj"),
    ("img_mlp.2", "ff.net.2"),
    ("txt_mlp.0", "ff_context.net.0.proj"),
    ("txt_mlp.2", "ff_context.net.2"),
    ("img_mod.lin", "norm1.linear"),
    ("txt_mod.lin", "norm1_context.linear"),
    ("img_attn.qkv", ""),
    ("txt_attn.qkv", ""),
];
const FLUX_SINGLE: [(&str, &str); 2] = [("linear2", "proj_out"), ("modulation.lin", "norm.linear")];
const FLUX_TOP: [(&str, &str); 9] = [
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
    (
        "time_in.in_layer",
        "time_text_embed.timestep_embedder.linear_1",
    ),
    (
        "time_in.out_layer",
        "time_text_embed.timestep_embedder.linear_2",
    ),
    (
        "vector_in.in_layer",
        "time_text_embed.text_embedder.linear_1",
    ),
    (
        "vector_in.out_layer",
        "time_text_embed.text_embedder.linear_2",
    ),
    (
        "guidance_in.in_layer",
        "time_text_embed.guidance_embedder.linear_1",
    ),
    (
        "guidance_in.out_layer",
        "time_text_embed.guidance_embedder.linear_2",
    ),
    ("final_layer.linear", "proj_out"),
];

/// FLUX.1 and Chroma: a BFL-layout module's diffusers names (the fused `qkv` and single-block
/// `linear1` as row slices: q, k, v, and the MLP input four times as wide, FLUX's ratio) and a
/// diffusers-layout module's BFL name (whole modules only).
/// Wan 2.1 / 2.2: the original (Wan-AI, ComfyUI) and diffusers names of each module, both
/// ways, so a LoRA for either layout fits a file of the other.
pub fn wan(names: &[&str]) -> Vec<Vec<Alias>> {
    each(names, |n| {
        crate::models::dit::wan::other_layout_name(n)
            .map(Alias::whole)
            .into_iter()
            .collect()
    })
}

pub fn flux(names: &[&str]) -> Vec<Vec<Alias>> {
    each(names, flux_one)
}

fn flux_one(name: &str) -> Vec<Alias> {
    let whole = |n: String| vec![Alias::whole(n)];
    let slices = |head: String, parts: &[&str], of: usize, last_span: usize| -> Vec<Alias> {
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| Alias {
                name: format!("{head}.{p}"),
                part: Some(RowSlice {
                    index: i,
                    of,
                    span: if i + 1 == parts.len() { last_span } else { 1 },
                }),
            })
            .collect()
    };
    if let Some((_, d)) = FLUX_TOP.iter().find(|(b, _)| *b == name) {
        return whole(d.to_string());
    }
    if let Some((b, _)) = FLUX_TOP.iter().find(|(_, d)| *d == name) {
        return whole(b.to_string());
    }
    if let Some((i, rest)) = name.strip_prefix("double_blocks.").and_then(index_rest) {
        let head = format!("transformer_blocks.{i}");
        return match rest {
            "img_attn.qkv" => slices(format!("{head}.attn"), &["to_q", "to_k", "to_v"], 3, 1),
            "txt_attn.qkv" => slices(
                format!("{head}.attn"),
                &["add_q_proj", "add_k_proj", "add_v_proj"],
                3,
                1,
            ),
            _ => FLUX_DOUBLE
                .iter()
                .find(|(b, d)| *b == rest && !d.is_empty())
                .map_or_else(Vec::new, |(_, d)| whole(format!("{head}.{d}"))),
        };
    }
    if let Some((i, rest)) = name
        .strip_prefix("transformer_blocks.")
        .and_then(index_rest)
    {
        return FLUX_DOUBLE
            .iter()
            .find(|(_, d)| *d == rest && !d.is_empty())
            .map_or_else(Vec::new, |(b, _)| whole(format!("double_blocks.{i}.{b}")));
    }
    if let Some((i, rest)) = name.strip_prefix("single_blocks.").and_then(index_rest) {
        let head = format!("single_transformer_blocks.{i}");
        if rest == "linear1" {
            let mut out = slices(format!("{head}.attn"), &["to_q", "to_k", "to_v"], 7, 1);
            out.push(Alias {
                name: format!("{head}.proj_mlp"),
                part: Some(RowSlice {
                    index: 3,
                    of: 7,
                    span: 4,
                }),
            });
            return out;
        }
        return FLUX_SINGLE
            .iter()
            .find(|(b, _)| *b == rest)
            .map_or_else(Vec::new, |(_, d)| whole(format!("{head}.{d}")));
    }
    if let Some((i, rest)) = name
        .strip_prefix("single_transformer_blocks.")
        .and_then(index_rest)
    {
        return FLUX_SINGLE
            .iter()
            .find(|(_, d)| *d == rest)
            .map_or_else(Vec::new, |(b, _)| whole(format!("single_blocks.{i}.{b}")));
    }
    Vec::new()
}

/// SD3 whole modules inside a joint block: Stability name ↔ diffusers name (the context
/// stream's adaptive norm is left out: the last block stores its halves swapped).
const SD3_BLOCK: [(&str, &str); 10] = [
    ("x_block.attn.proj", "attn.to_out.0"),
    ("context_block.attn.proj", "attn.to_add_out"),
    ("x_block.attn2.proj", "attn2.to_out.0"),
    ("x_block.mlp.fc1", "ff.net.0.proj"),
    ("x_block.mlp.fc2", "ff.net.2"),
    ("context_block.mlp.fc1", "ff_context.net.0.proj"),
    ("context_block.mlp.fc2", "ff_context.net.2"),
    ("x_block.adaLN_modulation.1", "norm1.linear"),
    ("x_block.attn.qkv", ""),
    ("context_block.attn.qkv", ""),
];
const SD3_TOP: [(&str, &str); 6] = [
    ("x_embedder.proj", "pos_embed.proj"),
    (
        "t_embedder.mlp.0",
        "time_text_embed.timestep_embedder.linear_1",
    ),
    (
        "t_embedder.mlp.2",
        "time_text_embed.timestep_embedder.linear_2",
    ),
    ("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1"),
    ("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2"),
    ("final_layer.linear", "proj_out"),
];

/// SD3 / SD3.5: a Stability-layout module's diffusers names (fused `qkv` as q, k, v row
/// slices) and a diffusers-layout module's Stability name (whole modules).
pub fn sd3(names: &[&str]) -> Vec<Vec<Alias>> {
    each(names, sd3_one)
}

fn sd3_one(name: &str) -> Vec<Alias> {
    let whole = |n: String| vec![Alias::whole(n)];
    if let Some((_, d)) = SD3_TOP.iter().find(|(s, _)| *s == name) {
        return whole(d.to_string());
    }
    if let Some((s, _)) = SD3_TOP.iter().find(|(_, d)| *d == name) {
        return whole(s.to_string());
    }
    if let Some((i, rest)) = name.strip_prefix("joint_blocks.").and_then(index_rest) {
        let head = format!("transformer_blocks.{i}");
        let qkv = |attn: &str, parts: [&str; 3]| -> Vec<Alias> {
            parts
                .iter()
                .enumerate()
                .map(|(k, p)| Alias {
                    name: format!("{head}.{attn}.{p}"),
                    part: Some(RowSlice::one(k, 3)),
                })
                .collect()
        };
        return match rest {
            "x_block.attn.qkv" => qkv("attn", ["to_q", "to_k", "to_v"]),
            "x_block.attn2.qkv" => qkv("attn2", ["to_q", "to_k", "to_v"]),
            "context_block.attn.qkv" => qkv("attn", ["add_q_proj", "add_k_proj", "add_v_proj"]),
            _ => SD3_BLOCK
                .iter()
                .find(|(s, d)| *s == rest && !d.is_empty())
                .map_or_else(Vec::new, |(_, d)| whole(format!("{head}.{d}"))),
        };
    }
    if let Some((i, rest)) = name
        .strip_prefix("transformer_blocks.")
        .and_then(index_rest)
    {
        return SD3_BLOCK
            .iter()
            .find(|(_, d)| *d == rest && !d.is_empty())
            .map_or_else(Vec::new, |(s, _)| whole(format!("joint_blocks.{i}.{s}")));
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(a: Vec<Alias>) -> Vec<String> {
        a.into_iter().map(|a| a.name).collect()
    }

    /// SD's three slots per level.
    fn unet(name: &str) -> Vec<Alias> {
        let mut out: Vec<Alias> = unet_ldm_to_diffusers(name, 3)
            .into_iter()
            .map(Alias::whole)
            .collect();
        out.extend(unet_diffusers_to_ldm(name, 3).into_iter().map(Alias::whole));
        out
    }

    #[test]
    fn flux_fused_modules_take_their_row_slices() {
        let a = flux_one("single_blocks.3.linear1");
        assert_eq!(a.len(), 4);
        assert_eq!(a[3].name, "single_transformer_blocks.3.proj_mlp");
        assert_eq!(a[3].part.unwrap().rows(7 * 8), (3 * 8, 4 * 8));
        assert_eq!(a[1].part.unwrap().rows(7 * 8), (8, 8));
        let q = flux_one("double_blocks.0.txt_attn.qkv");
        assert_eq!(q[2].name, "transformer_blocks.0.attn.add_v_proj");
        assert_eq!(
            names(flux_one("transformer_blocks.1.attn.to_out.0")),
            ["double_blocks.1.img_attn.proj"]
        );
        assert_eq!(names(flux_one("img_in")), ["x_embedder"]);
        assert!(flux_one("transformer_blocks.0.attn.to_q").is_empty());
    }

    #[test]
    fn sd3_fused_qkv_takes_thirds() {
        let a = sd3_one("joint_blocks.2.context_block.attn.qkv");
        assert_eq!(a[1].name, "transformer_blocks.2.attn.add_k_proj");
        assert_eq!(a[1].part, Some(RowSlice::one(1, 3)));
        assert_eq!(
            names(sd3_one("transformer_blocks.0.ff.net.2")),
            ["joint_blocks.0.x_block.mlp.fc2"]
        );
        assert_eq!(names(sd3_one("pos_embed.proj")), ["x_embedder.proj"]);
    }

    #[test]
    fn unet_layouts_both_ways() {
        let pairs = [
            ("input_blocks.0.0", "conv_in"),
            (
                "input_blocks.1.0.in_layers.2",
                "down_blocks.0.resnets.0.conv1",
            ),
            (
                "input_blocks.5.1.transformer_blocks.0.attn1.to_q",
                "down_blocks.1.attentions.1.transformer_blocks.0.attn1.to_q",
            ),
            ("input_blocks.6.0.op", "down_blocks.1.downsamplers.0.conv"),
            (
                "middle_block.2.emb_layers.1",
                "mid_block.resnets.1.time_emb_proj",
            ),
            ("middle_block.1.proj_in", "mid_block.attentions.0.proj_in"),
            (
                "output_blocks.4.0.skip_connection",
                "up_blocks.1.resnets.1.conv_shortcut",
            ),
            (
                "output_blocks.5.1.proj_out",
                "up_blocks.1.attentions.2.proj_out",
            ),
            ("time_embed.2", "time_embedding.linear_2"),
            ("label_emb.0.0", "add_embedding.linear_1"),
        ];
        for (ldm, diffusers) in pairs {
            assert_eq!(names(unet(ldm)), vec![diffusers.to_string()], "{ldm}");
            assert!(
                names(unet(diffusers)).contains(&ldm.to_string()),
                "{diffusers}"
            );
        }
        assert_eq!(
            names(unet("output_blocks.2.1.conv")),
            vec!["up_blocks.0.upsamplers.0.conv".to_string()]
        );
        assert_eq!(
            names(unet("up_blocks.1.upsamplers.0.conv")),
            vec!["output_blocks.5.1.conv", "output_blocks.5.2.conv"]
        );
    }

    #[test]
    fn unet_slots_from_the_names() {
        let ldm = [
            "input_blocks.1.0.in_layers.2",
            "input_blocks.2.0.op",
            "input_blocks.3.1.proj_in",
        ];
        assert_eq!(unet_slots(&ldm), 2);
        let a = super::unet(&ldm);
        assert_eq!(
            names(a[2].clone()),
            vec!["down_blocks.1.attentions.0.proj_in"]
        );
        let diffusers = [
            "down_blocks.0.resnets.0.conv1",
            "down_blocks.1.attentions.0.proj_in",
        ];
        assert_eq!(unet_slots(&diffusers), 2);
        assert_eq!(unet_slots(&["conv_in"]), 3);
        // One level, no down-sampler: the slots run past the last block.
        assert_eq!(
            unet_slots(&["input_blocks.0.0", "input_blocks.2.1.proj_in"]),
            3
        );
    }

    #[test]
    fn pixart_fused_parts() {
        let a = pixart_one("blocks.3.attn.qkv");
        assert_eq!(a.len(), 3);
        assert_eq!(a[1].name, "transformer_blocks.3.attn1.to_k");
        assert_eq!(a[1].part, Some(RowSlice::one(1, 3)));
        assert_eq!(
            names(pixart_one("t_embedder.mlp.0")),
            vec!["adaln_single.emb.timestep_embedder.linear_1"]
        );
    }
}
