//! Wan transformer sizes and checkpoint layout, read off the weight shapes; the head count
//! (not in any shape: the q/k RMS norms span all heads) from `config.json` or the released
//! models' 128-wide heads.

use crate::runner::{RunnerError, WeightBuilder};

use super::names::{Names, DIFFUSERS, ORIGINAL};

const ORIGIN: &str = "the Wan transformer weights";

/// Epsilon of the blocks' layer norms, the q/k RMS norms and the output norm (`eps`).
pub const NORM_EPS: f32 = 1e-6;
/// Epsilon of the image embedder's two layer norms (PyTorch's `LayerNorm` default).
pub const IMAGE_NORM_EPS: f32 = 1e-5;
/// Rope base of all three axes.
pub const ROPE_THETA: f32 = 10_000.0;
/// Head size of every released Wan model (1.3B 1536 = 12 × 128, 5B 3072 = 24 × 128,
/// 14B 5120 = 40 × 128): the head count when `config.json` does not give it.
pub const RELEASED_HEAD_DIM: usize = 128;

/// How the checkpoint names its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WanLayout {
    /// The Wan repository's names, as in ComfyUI / the official single files / GGUFs:
    /// `blocks.N.self_attn.q`, `cross_attn.k_img`, `norm3` (the cross-attention norm),
    /// `ffn.0`, `modulation`, `head.head`, `img_emb.proj.N`.
    Original,
    /// diffusers `WanTransformer3DModel`: `attn1.to_q`, `attn2.add_k_proj`, `norm2`,
    /// `ffn.net.0.proj`, `scale_shift_table`, `proj_out`, `condition_embedder.*`.
    Diffusers,
}

impl WanLayout {
    pub(crate) fn names(self) -> &'static Names {
        match self {
            WanLayout::Original => &ORIGINAL,
            WanLayout::Diffusers => &DIFFUSERS,
        }
    }
}

/// The I2V / FLF2V image branch: CLIP-vision features through `img_emb`, attended by every
/// block's cross-attention beside the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WanImageBranch {
    /// CLIP feature width (1280 for the released models).
    pub in_dim: usize,
    /// FLF2V's learned position table over both images' tokens (514), if present.
    pub pos_len: Option<usize>,
}

/// The VACE branch: a patch embedding of the control video and one block per hint, each hint
/// added to the main stream after its main block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WanVace {
    /// Control channels (96: inactive and reactive latents, 16 each, and the 8×8 mask).
    pub in_channels: usize,
    /// For VACE block k, the main block after which its hint is added (diffusers'
    /// `vace_layers`), strictly increasing from 0.
    pub layers: Vec<usize>,
}

/// What `config.json` says that the weights cannot: the head count and, for VACE, the main
/// blocks the hints join.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WanHints {
    pub heads: Option<usize>,
    pub vace_layers: Option<Vec<usize>>,
}

impl WanHints {
    /// `num_attention_heads` and `vace_layers` of a diffusers `config.json`.
    pub fn from_config(config: &serde_json::Value) -> Self {
        let vace_layers = config.get("vace_layers").and_then(|v| {
            v.as_array()?
                .iter()
                .map(|x| x.as_u64().and_then(|x| usize::try_from(x).ok()))
                .collect::<Option<Vec<usize>>>()
        });
        Self {
            heads: heads_hint(config),
            vace_layers,
        }
    }
}

impl From<Option<usize>> for WanHints {
    fn from(heads: Option<usize>) -> Self {
        Self {
            heads,
            vace_layers: None,
        }
    }
}

/// Sizes of a Wan 2.1 / 2.2 transformer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WanConfig {
    pub layout: WanLayout,
    /// (frames, rows, columns) per patch: (1, 2, 2) in every release.
    pub patch: [usize; 3],
    pub in_channels: usize,
    pub out_channels: usize,
    pub dim: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    /// Width of the text encoder's states (umT5-XXL: 4096).
    pub text_dim: usize,
    /// Sinusoid width of the timestep embedding (256).
    pub freq_dim: usize,
    pub layers: usize,
    /// The blocks' q/k RMS norms (all releases have them).
    pub qk_norm: bool,
    /// The affine layer norm before cross-attention (all releases have it).
    pub cross_attn_norm: bool,
    pub image: Option<WanImageBranch>,
    /// The VACE control branch (`vace_blocks`, `vace_patch_embedding`), if the file has one.
    pub vace: Option<WanVace>,
    /// Rope dims per head for the (frame, row, column) axes.
    pub axes_dims: [usize; 3],
}

impl WanConfig {
    /// The layout when `wb` holds a Wan transformer (a 3D patch embedding beside the first
    /// block's self-attention), else `None`.
    pub fn recognise(wb: &WeightBuilder<'_, '_>) -> Option<WanLayout> {
        if !wb.contains("patch_embedding.weight") {
            return None;
        }
        [WanLayout::Original, WanLayout::Diffusers]
            .into_iter()
            .find(|l| wb.contains(&format!("blocks.0.{}.weight", l.names().self_q)))
    }

    /// Every size from the weight shapes; `heads_hint` is `config.json`'s
    /// `num_attention_heads` when there is one ([`heads_hint`]), else the head count is
    /// `dim / 128` as in every release.
    pub fn detect(
        wb: &WeightBuilder<'_, '_>,
        hints: impl Into<WanHints>,
    ) -> Result<Self, RunnerError> {
        let hints = hints.into();
        let layout = Self::recognise(wb).ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key("blocks.0.self_attn.q.weight"),
            origin: ORIGIN.into(),
        })?;
        let n = layout.names();
        let shape = |name: &str| wb.require_ne(&format!("{name}.weight"), ORIGIN);
        let bad =
            |name: &str, reason: String| wb.bad_data(&format!("{name}.weight"), ORIGIN, reason);

        let q = format!("blocks.0.{}", n.self_q);
        let [dim, dim_out, ..] = shape(&q)?;
        if dim == 0 || dim_out != dim {
            return Err(bad(
                &q,
                format!("a {dim}×{dim_out} projection is not square"),
            ));
        }
        // The Conv3d kernel [D, C, pt, ph, pw] is stored folded as ggml [pw, ph, pt, C·D].
        let [pw, ph, pt, cd] = shape("patch_embedding")?;
        if pw == 0 || ph == 0 || pt == 0 || !cd.is_multiple_of(dim) || cd == 0 {
            return Err(bad(
                "patch_embedding",
                format!(
                    "shape {:?} is not a {dim}-output 3D patch kernel",
                    [pw, ph, pt, cd]
                ),
            ));
        }
        let per_patch = pw * ph * pt;
        let [_, out_feat, ..] = shape(n.proj_out)?;
        if out_feat == 0 || !out_feat.is_multiple_of(per_patch) {
            return Err(bad(
                n.proj_out,
                format!("{out_feat} outputs are not {per_patch} patch positions × channels"),
            ));
        }
        let heads = match hints.heads {
            Some(h) => h,
            None if dim.is_multiple_of(RELEASED_HEAD_DIM) => dim / RELEASED_HEAD_DIM,
            None => {
                return Err(bad(
                    &q,
                    format!(
                        "width {dim} is not a multiple of {RELEASED_HEAD_DIM}: the head count \
                         needs config.json's num_attention_heads"
                    ),
                ))
            }
        };
        if heads == 0 || !dim.is_multiple_of(heads) || !(dim / heads).is_multiple_of(2) {
            return Err(bad(
                &q,
                format!("{heads} heads do not split width {dim} into even head sizes"),
            ));
        }
        let head_dim = dim / heads;
        let block0 = |name: &str| format!("blocks.0.{name}");
        let image = if wb.contains(&format!("{}.weight", n.img_fc1)) {
            Some(WanImageBranch {
                in_dim: shape(n.img_norm1)?[0],
                pos_len: wb.source_ne(n.img_pos).map(|ne| ne[1]),
            })
        } else {
            None
        };
        let count =
            |fmt: &dyn Fn(usize) -> String| (0..).take_while(|&i| wb.contains(&fmt(i))).count();
        let config = Self {
            layout,
            patch: [pt, ph, pw],
            in_channels: cd / dim,
            out_channels: out_feat / per_patch,
            dim,
            heads,
            head_dim,
            ffn_dim: shape(&block0(n.ffn[0]))?[1],
            text_dim: shape(n.text[0])?[0],
            freq_dim: shape(n.time[0])?[0],
            layers: count(&|i| format!("blocks.{i}.{}.weight", n.self_q)),
            qk_norm: wb.contains(&format!("{}.weight", block0(n.self_norm_q))),
            cross_attn_norm: wb.contains(&format!("{}.weight", block0(n.cross_norm))),
            image,
            vace: None,
            axes_dims: axes_dims(head_dim),
        };
        let vace_blocks = count(&|i| format!("vace_blocks.{i}.{}.weight", n.self_q));
        let config = Self {
            vace: detect_vace(wb, &config, vace_blocks, hints.vace_layers)?,
            ..config
        };
        log::debug!("wan: {config:?}");
        Ok(config)
    }

    /// Input features of one patch token (pt · ph · pw · C_in).
    pub fn patch_features(&self) -> usize {
        self.patch.iter().product::<usize>() * self.in_channels
    }
}

/// The VACE branch of a file with `blocks` VACE blocks: its input width from
/// `vace_patch_embedding`, its hint positions from `config.json` or, without one, upstream's
/// rule (every `layers / blocks`-th main block from 0: 0, 2, …, 28 for 1.3B; 0, 5, …, 35 for
/// 14B, as diffusers' configs say).
fn detect_vace(
    wb: &WeightBuilder<'_, '_>,
    c: &WanConfig,
    blocks: usize,
    given: Option<Vec<usize>>,
) -> Result<Option<WanVace>, RunnerError> {
    if blocks == 0 {
        return Ok(None);
    }
    let name = "vace_patch_embedding";
    let [pw, ph, pt, cd] = wb.require_ne(&format!("{name}.weight"), ORIGIN)?;
    let bad = |reason: String| wb.bad_data(&format!("{name}.weight"), ORIGIN, reason);
    if [pt, ph, pw] != c.patch || cd == 0 || !cd.is_multiple_of(c.dim) {
        return Err(bad(format!(
            "shape {:?} is not a {}-output kernel of the model's patch {:?}",
            [pw, ph, pt, cd],
            c.dim,
            c.patch
        )));
    }
    let layers = match given {
        Some(l) => l,
        None => {
            let step = (c.layers / blocks).max(1);
            (0..blocks).map(|k| k * step).collect()
        }
    };
    let increasing = layers.windows(2).all(|w| w[0] < w[1]);
    if layers.len() != blocks
        || layers.first() != Some(&0)
        || !increasing
        || layers.last().is_some_and(|&l| l >= c.layers)
    {
        return Err(bad(format!(
            "VACE hint positions {layers:?} do not fit {blocks} VACE blocks over {} main blocks \
             (config.json's vace_layers must start at 0 and increase)",
            c.layers
        )));
    }
    Ok(Some(WanVace {
        in_channels: cd / c.dim,
        layers,
    }))
}

/// `num_attention_heads` of a diffusers `config.json`, when it is a positive integer.
pub fn heads_hint(config: &serde_json::Value) -> Option<usize> {
    let h = config.get("num_attention_heads")?.as_u64()?;
    usize::try_from(h).ok().filter(|&h| h > 0)
}

/// Wan's rope split of a head: rows and columns get 2·⌊d/6⌋ each, frames the rest
/// ([44, 42, 42] for 128).
pub fn axes_dims(head_dim: usize) -> [usize; 3] {
    let hw = 2 * (head_dim / 6);
    [head_dim - 2 * hw, hw, hw]
}

#[cfg(test)]
mod tests {
    use super::axes_dims;

    #[test]
    fn axes_match_the_released_split() {
        assert_eq!(axes_dims(128), [44, 42, 42]);
        assert_eq!(axes_dims(16), [8, 4, 4]);
        assert_eq!(axes_dims(12), [4, 4, 4]);
    }
}
