//! Qwen3-VL vision tower hyper-parameters: sizes from the weight shapes, the rest (head count,
//! deepstack layer indices, rope base) from a `config.json` or mmproj GGUF metadata.

use serde_json::Value;

use super::source::{llamacpp_deepstack_layers, IN_CHANNELS, PATCH_WEIGHT};
use crate::runner::{RunnerError, WeightBuilder};
use crate::weights::TensorStore;

const ORIGIN: &str = "the Qwen3-VL vision tower weights";

/// Heads of every released Qwen3-VL vision tower (hidden 1024 → head_dim 64, 1152 → 72).
pub const DEFAULT_HEADS: usize = 16;

/// Rope base of the vision tower's 2-D rope (transformers' default; released configs set none).
pub const DEFAULT_VISION_ROPE_THETA: f32 = 10_000.0;

/// What the weights do not say. Every field is optional; [`Qwen3VlVisionConfig::detect`]
/// fills the gaps with documented defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VisionHparams {
    pub heads: Option<usize>,
    /// Block indices after which the deepstack mergers read, in merger order.
    pub deepstack_indexes: Option<Vec<usize>>,
    pub patch_size: Option<usize>,
    pub temporal_patch_size: Option<usize>,
    pub rope_theta: Option<f32>,
}

/// Reads [`VisionHparams`] from the files of `store` under `prefix`: a `config.json`
/// (`vision_config.{num_heads, deepstack_visual_indexes, patch_size, temporal_patch_size,
/// rope_parameters.rope_theta}`, or the same keys at the top level of a vision-only config) or
/// mmproj GGUF metadata (`clip.vision.attention.head_count`, `clip.vision.patch_size`,
/// `clip.vision.is_deepstack_layers`, else the layers of the `v.deepstack.L.*` tensors).
pub fn qwen3_vl_vision_hparams(store: &TensorStore, prefix: &str) -> VisionHparams {
    let mut h = VisionHparams::default();
    for f in store.files() {
        let g = &f.gguf;
        h.heads = h.heads.or_else(|| {
            g.get_u32("clip.vision.attention.head_count")
                .map(|v| v as usize)
        });
        h.patch_size = h
            .patch_size
            .or_else(|| g.get_u32("clip.vision.patch_size").map(|v| v as usize));
        if h.deepstack_indexes.is_none() {
            if let Some(flags) = g
                .get("clip.vision.is_deepstack_layers")
                .and_then(|v| v.as_array())
            {
                let idx: Vec<usize> = flags
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.as_bool().unwrap_or(false))
                    .map(|(i, _)| i)
                    .collect();
                h.deepstack_indexes = Some(idx);
            }
        }
        if let Some(cfg) = &f.config {
            let v = cfg.get("vision_config").unwrap_or(cfg);
            let uint = |key: &str| v.get(key).and_then(Value::as_u64).map(|x| x as usize);
            h.heads = h.heads.or_else(|| uint("num_heads"));
            h.patch_size = h.patch_size.or_else(|| uint("patch_size"));
            h.temporal_patch_size = h
                .temporal_patch_size
                .or_else(|| uint("temporal_patch_size"));
            h.rope_theta = h.rope_theta.or_else(|| {
                v.pointer("/rope_parameters/rope_theta")
                    .and_then(Value::as_f64)
                    .map(|x| x as f32)
            });
            if h.deepstack_indexes.is_none() {
                h.deepstack_indexes = v
                    .get("deepstack_visual_indexes")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(|x| x.as_u64().map(|i| i as usize)).collect());
            }
        }
    }
    if h.deepstack_indexes.is_none() {
        let layers = llamacpp_deepstack_layers(store, prefix);
        if !layers.is_empty() {
            h.deepstack_indexes = Some(layers);
        }
    }
    h
}

/// Sizes of a transformers `Qwen3VLVisionModel`.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3VlVisionConfig {
    pub hidden: usize,
    pub depth: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub in_channels: usize,
    /// Width of the merged tokens (the language model's hidden size).
    pub out_hidden: usize,
    /// Rows of the learned position table (a square grid).
    pub num_position_embeddings: usize,
    /// Block indices whose outputs feed the deepstack mergers, in merger order.
    pub deepstack_indexes: Vec<usize>,
    /// Epsilon of every LayerNorm.
    pub eps: f32,
    pub rope_theta: f32,
}

impl Qwen3VlVisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Side of the learned position grid.
    pub fn grid_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt().round() as usize
    }

    /// Length of one patch vector (3 · T · P²).
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Reads the sizes from transformers names relative to `wb` (see `Qwen3VlVisionSource`):
    /// `pos_embed.weight` [hidden, positions], `patch_embed.proj.weight` [3·T·P², hidden],
    /// `blocks.0.mlp.linear_fc1.weight` [hidden, intermediate], `merger.linear_fc1.weight`
    /// [hidden·merge², ·], `merger.linear_fc2.weight` [·, out_hidden]; depth and deepstack
    /// count from which `blocks.{i}` / `deepstack_merger_list.{j}` exist.
    ///
    /// Without a head count in `hp`, [`DEFAULT_HEADS`] is used when it divides `hidden` into
    /// heads of a multiple of 4 (as every released tower), else heads of 64. Without deepstack
    /// indices, the released layouts are recognised by depth (24 blocks → [5, 11, 17], 27 →
    /// [8, 16, 24]); anything else needs a config.json or GGUF metadata.
    pub fn detect(wb: &WeightBuilder<'_, '_>, hp: &VisionHparams) -> Result<Self, RunnerError> {
        let shape = |name: &str| wb.require_ne(name, ORIGIN);
        let bad = |name: &str, reason: String| wb.bad_data(name, ORIGIN, reason);
        let [hidden, positions, ..] = shape("pos_embed.weight")?;
        let side = (positions as f64).sqrt().round() as usize;
        if hidden == 0 || side * side != positions {
            return Err(bad(
                "pos_embed.weight",
                format!("{positions} positions of width {hidden} are not a square grid"),
            ));
        }
        let [patch_dim, p_out, ..] = shape(PATCH_WEIGHT)?;
        let patch_size = hp.patch_size.unwrap_or(16);
        let temporal = hp.temporal_patch_size.unwrap_or(2);
        if p_out != hidden || patch_dim != IN_CHANNELS * temporal * patch_size * patch_size {
            return Err(bad(
                PATCH_WEIGHT,
                format!(
                    "shape [{patch_dim}, {p_out}] does not fit hidden {hidden}, patch {patch_size}, \
                     {temporal} frames"
                ),
            ));
        }
        let depth = (0..)
            .take_while(|i| wb.contains(&format!("blocks.{i}.attn.qkv.weight")))
            .count();
        if depth == 0 {
            return Err(RunnerError::MissingTensor {
                key: wb.key("blocks.0.attn.qkv.weight"),
                origin: ORIGIN.into(),
            });
        }
        let [_, intermediate, ..] = shape("blocks.0.mlp.linear_fc1.weight")?;
        let [merged, ..] = shape("merger.linear_fc1.weight")?;
        let merge = ((merged / hidden) as f64).sqrt().round() as usize;
        if merge == 0 || merge * merge * hidden != merged {
            return Err(bad(
                "merger.linear_fc1.weight",
                format!("input width {merged} is not hidden {hidden} times a square"),
            ));
        }
        let [_, out_hidden, ..] = shape("merger.linear_fc2.weight")?;
        let heads = match hp.heads {
            Some(h) => h,
            None if hidden.is_multiple_of(DEFAULT_HEADS * 4) => DEFAULT_HEADS,
            None => hidden / 64,
        };
        if heads == 0 || !hidden.is_multiple_of(heads) || !(hidden / heads).is_multiple_of(4) {
            return Err(bad(
                "blocks.0.attn.qkv.weight",
                format!("hidden {hidden} does not split into {heads} heads of a multiple of 4"),
            ));
        }
        let n_deepstack = (0..)
            .take_while(|j| wb.contains(&format!("deepstack_merger_list.{j}.linear_fc1.weight")))
            .count();
        let deepstack_indexes = match &hp.deepstack_indexes {
            Some(idx) => idx.clone(),
            None if n_deepstack == 0 => Vec::new(),
            None if n_deepstack == 3 && depth == 24 => vec![5, 11, 17],
            None if n_deepstack == 3 && depth == 27 => vec![8, 16, 24],
            None => {
                return Err(bad(
                    "deepstack_merger_list.0.linear_fc1.weight",
                    format!(
                        "{n_deepstack} deepstack mergers but no deepstack_visual_indexes \
                         (put the model's config.json beside the weights)"
                    ),
                ))
            }
        };
        if deepstack_indexes.len() != n_deepstack || deepstack_indexes.iter().any(|&i| i >= depth) {
            return Err(bad(
                "deepstack_merger_list",
                format!(
                    "{n_deepstack} deepstack mergers do not match layers {deepstack_indexes:?} \
                     of {depth} blocks"
                ),
            ));
        }
        let config = Self {
            hidden,
            depth,
            heads,
            intermediate,
            patch_size,
            temporal_patch_size: temporal,
            merge_size: merge,
            in_channels: IN_CHANNELS,
            out_hidden,
            num_position_embeddings: positions,
            deepstack_indexes,
            eps: 1e-6,
            rope_theta: hp.rope_theta.unwrap_or(DEFAULT_VISION_ROPE_THETA),
        };
        log::debug!(
            "Qwen3-VL vision: {} blocks, hidden {}, {} heads, ffn {}, out {}, {} positions, deepstack {:?}",
            config.depth,
            config.hidden,
            config.heads,
            config.intermediate,
            config.out_hidden,
            config.num_position_embeddings,
            config.deepstack_indexes
        );
        Ok(config)
    }
}
