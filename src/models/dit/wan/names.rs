//! Tensor names of the two Wan checkpoint layouts, relative to the model root (blocks:
//! relative to `blocks.N`). diffusers' `convert_wan_transformer_to_diffusers` maps the first
//! to the second; note the swapped norms: the original `norm3` is diffusers' affine `norm2`.

/// Names inside one attention module.
pub(crate) struct AttnNames {
    pub q: &'static str,
    pub k: &'static str,
    pub v: &'static str,
    pub o: &'static str,
    pub norm_q: &'static str,
    pub norm_k: &'static str,
    /// I2V: the image tokens' key / value projections and key norm.
    pub k_img: &'static str,
    pub v_img: &'static str,
    pub norm_k_img: &'static str,
}

pub(crate) struct Names {
    pub text: [&'static str; 2],
    pub time: [&'static str; 2],
    pub time_proj: &'static str,
    pub proj_out: &'static str,
    /// The output norm's [1, 2, D] (shift, scale) table.
    pub head_table: &'static str,
    pub img_norm1: &'static str,
    pub img_fc1: &'static str,
    pub img_fc2: &'static str,
    pub img_norm2: &'static str,
    /// FLF2V's position table (the full tensor name).
    pub img_pos: &'static str,
    pub self_attn: &'static str,
    pub cross_attn: &'static str,
    pub attn: AttnNames,
    /// `self_attn.q` / `attn1.to_q`, for detection.
    pub self_q: &'static str,
    pub self_norm_q: &'static str,
    /// The affine layer norm before cross-attention.
    pub cross_norm: &'static str,
    pub ffn: [&'static str; 2],
    /// A block's [1, 6, D] modulation table.
    pub table: &'static str,
    /// VACE block 0's input projection and every VACE block's hint projection.
    pub vace_in: &'static str,
    pub vace_out: &'static str,
}

pub(crate) const ORIGINAL: Names = Names {
    text: ["text_embedding.0", "text_embedding.2"],
    time: ["time_embedding.0", "time_embedding.2"],
    time_proj: "time_projection.1",
    proj_out: "head.head",
    head_table: "head.modulation",
    img_norm1: "img_emb.proj.0",
    img_fc1: "img_emb.proj.1",
    img_fc2: "img_emb.proj.3",
    img_norm2: "img_emb.proj.4",
    img_pos: "img_emb.emb_pos",
    self_attn: "self_attn",
    cross_attn: "cross_attn",
    attn: AttnNames {
        q: "q",
        k: "k",
        v: "v",
        o: "o",
        norm_q: "norm_q",
        norm_k: "norm_k",
        k_img: "k_img",
        v_img: "v_img",
        norm_k_img: "norm_k_img",
    },
    self_q: "self_attn.q",
    self_norm_q: "self_attn.norm_q",
    cross_norm: "norm3",
    ffn: ["ffn.0", "ffn.2"],
    table: "modulation",
    vace_in: "before_proj",
    vace_out: "after_proj",
};

pub(crate) const DIFFUSERS: Names = Names {
    text: [
        "condition_embedder.text_embedder.linear_1",
        "condition_embedder.text_embedder.linear_2",
    ],
    time: [
        "condition_embedder.time_embedder.linear_1",
        "condition_embedder.time_embedder.linear_2",
    ],
    time_proj: "condition_embedder.time_proj",
    proj_out: "proj_out",
    head_table: "scale_shift_table",
    img_norm1: "condition_embedder.image_embedder.norm1",
    img_fc1: "condition_embedder.image_embedder.ff.net.0.proj",
    img_fc2: "condition_embedder.image_embedder.ff.net.2",
    img_norm2: "condition_embedder.image_embedder.norm2",
    img_pos: "condition_embedder.image_embedder.pos_embed",
    self_attn: "attn1",
    cross_attn: "attn2",
    attn: AttnNames {
        q: "to_q",
        k: "to_k",
        v: "to_v",
        o: "to_out.0",
        norm_q: "norm_q",
        norm_k: "norm_k",
        k_img: "add_k_proj",
        v_img: "add_v_proj",
        norm_k_img: "norm_added_k",
    },
    self_q: "attn1.to_q",
    self_norm_q: "attn1.norm_q",
    cross_norm: "norm2",
    ffn: ["ffn.net.0.proj", "ffn.net.2"],
    table: "scale_shift_table",
    vace_in: "proj_in",
    vace_out: "proj_out",
};

/// The name of module `name` (relative to the model root, without `.weight`) in the other
/// layout, for the modules that carry weights: a LoRA written for one layout then finds the
/// weights of a file in the other.
pub(crate) fn other_layout_name(name: &str) -> Option<String> {
    let (a, b) = (&ORIGINAL, &DIFFUSERS);
    let top = [
        (a.text[0], b.text[0]),
        (a.text[1], b.text[1]),
        (a.time[0], b.time[0]),
        (a.time[1], b.time[1]),
        (a.time_proj, b.time_proj),
        (a.proj_out, b.proj_out),
        (a.img_norm1, b.img_norm1),
        (a.img_fc1, b.img_fc1),
        (a.img_fc2, b.img_fc2),
        (a.img_norm2, b.img_norm2),
    ];
    let swap = |pairs: &[(String, String)], n: &str| {
        pairs.iter().find_map(|(x, y)| {
            if x == n {
                Some(y.clone())
            } else if y == n {
                Some(x.clone())
            } else {
                None
            }
        })
    };
    let block = ["blocks.", "vace_blocks."]
        .into_iter()
        .find_map(|p| name.strip_prefix(p).map(|rest| (p, rest)));
    if let Some((prefix, rest)) = block {
        let (index, leaf) = rest.split_once('.')?;
        let (aa, ba) = (&a.attn, &b.attn);
        let leaves = [
            (aa.q, ba.q),
            (aa.k, ba.k),
            (aa.v, ba.v),
            (aa.o, ba.o),
            (aa.norm_q, ba.norm_q),
            (aa.norm_k, ba.norm_k),
            (aa.k_img, ba.k_img),
            (aa.v_img, ba.v_img),
            (aa.norm_k_img, ba.norm_k_img),
        ];
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (x, y) in [(a.self_attn, b.self_attn), (a.cross_attn, b.cross_attn)] {
            for (lx, ly) in leaves {
                pairs.push((format!("{x}.{lx}"), format!("{y}.{ly}")));
            }
        }
        pairs.push((a.cross_norm.into(), b.cross_norm.into()));
        pairs.push((a.ffn[0].into(), b.ffn[0].into()));
        pairs.push((a.ffn[1].into(), b.ffn[1].into()));
        pairs.push((a.vace_in.into(), b.vace_in.into()));
        pairs.push((a.vace_out.into(), b.vace_out.into()));
        return swap(&pairs, leaf).map(|other| format!("{prefix}{index}.{other}"));
    }
    let pairs: Vec<(String, String)> = top
        .iter()
        .map(|(x, y)| (x.to_string(), y.to_string()))
        .collect();
    swap(&pairs, name)
}

#[cfg(test)]
mod tests {
    use super::other_layout_name;

    #[test]
    fn names_cross_between_layouts_both_ways() {
        for (orig, diff) in [
            ("blocks.3.self_attn.q", "blocks.3.attn1.to_q"),
            ("blocks.0.cross_attn.o", "blocks.0.attn2.to_out.0"),
            ("blocks.12.cross_attn.k_img", "blocks.12.attn2.add_k_proj"),
            ("blocks.1.norm3", "blocks.1.norm2"),
            ("blocks.1.ffn.2", "blocks.1.ffn.net.2"),
            (
                "text_embedding.0",
                "condition_embedder.text_embedder.linear_1",
            ),
            ("head.head", "proj_out"),
            ("vace_blocks.1.self_attn.k", "vace_blocks.1.attn1.to_k"),
            ("vace_blocks.0.before_proj", "vace_blocks.0.proj_in"),
            ("vace_blocks.2.after_proj", "vace_blocks.2.proj_out"),
        ] {
            assert_eq!(other_layout_name(orig).as_deref(), Some(diff));
            assert_eq!(other_layout_name(diff).as_deref(), Some(orig));
        }
        assert_eq!(other_layout_name("blocks.0.modulation"), None);
        assert_eq!(other_layout_name("patch_embedding"), None);
    }
}
