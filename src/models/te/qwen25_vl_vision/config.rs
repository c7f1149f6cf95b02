//! Qwen2.5-VL vision tower hyper-parameters: sizes from the weight shapes, the rest (head count,
//! attention window, full-attention blocks, rope base) from a `config.json` or mmproj GGUF
//! metadata, with the released towers' values otherwise.

use std::collections::BTreeSet;

use serde_json::Value;

use super::source::PATCH_WEIGHT;
use crate::models::te::qwen3_vl_vision::IN_CHANNELS;
use crate::runner::{RunnerError, WeightBuilder};
use crate::weights::TensorStore;

const ORIGIN: &str = "the Qwen2.5-VL vision tower weights";

/// Heads of every released Qwen2.5-VL vision tower (hidden 1280 → head_dim 80).
pub const DEFAULT_HEADS: usize = 16;
/// Attention window side in pixels of the released towers (4×4 merged units at patch 14).
pub const DEFAULT_WINDOW_SIZE: usize = 112;
/// Blocks with full attention in the released 32-block towers.
pub const DEFAULT_FULLATT_BLOCKS: [usize; 4] = [7, 15, 23, 31];
pub const DEFAULT_PATCH_SIZE: usize = 14;
pub const DEFAULT_TEMPORAL_PATCH_SIZE: usize = 2;
/// transformers' axial rope base (released configs set none).
pub const DEFAULT_ROPE_THETA: f32 = 10_000.0;

/// What the weights do not say. Every field is optional; [`Qwen25VlVisionConfig::detect`]
/// fills the gaps with the released 7B values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Qwen25VlVisionHparams {
    pub heads: Option<usize>,
    /// Attention window side in pixels (`window_size`).
    pub window_size: Option<usize>,
    /// Blocks with full attention (`fullatt_block_indexes`).
    pub fullatt_block_indexes: Option<Vec<usize>>,
    /// llama.cpp's form of the same: every `n`-th block (1-based) has full attention.
    pub n_wa_pattern: Option<usize>,
    pub patch_size: Option<usize>,
    pub temporal_patch_size: Option<usize>,
    pub rope_theta: Option<f32>,
}

/// Reads [`Qwen25VlVisionHparams`] from the files of `store`: a `config.json`
/// (`vision_config.{num_heads, window_size, fullatt_block_indexes, patch_size,
/// temporal_patch_size, rope_parameters.rope_theta}`, or the same keys at the top level of a
/// vision-only config) or mmproj GGUF metadata (`clip.vision.attention.head_count`,
/// `clip.vision.patch_size`, `clip.vision.window_size`, `clip.vision.n_wa_pattern`).
/// `prefix` is where the tower's tensors start; files without any are skipped.
pub fn qwen25_vl_vision_hparams(store: &TensorStore, prefix: &str) -> Qwen25VlVisionHparams {
    let mut h = Qwen25VlVisionHparams::default();
    // Only the files holding the tower: another component's config.json may share keys.
    let tower_files: BTreeSet<usize> = store.with_prefix(prefix).map(|t| t.file).collect();
    for (i, f) in store.files().iter().enumerate() {
        if !tower_files.contains(&i) {
            continue;
        }
        let g = &f.gguf;
        let u32_key = |key: &str| g.get_u32(key).map(|v| v as usize);
        h.heads = h
            .heads
            .or_else(|| u32_key("clip.vision.attention.head_count"));
        h.patch_size = h.patch_size.or_else(|| u32_key("clip.vision.patch_size"));
        h.window_size = h.window_size.or_else(|| u32_key("clip.vision.window_size"));
        h.n_wa_pattern = h
            .n_wa_pattern
            .or_else(|| u32_key("clip.vision.n_wa_pattern"));
        if let Some(cfg) = &f.config {
            let v = cfg.get("vision_config").unwrap_or(cfg);
            let uint = |key: &str| v.get(key).and_then(Value::as_u64).map(|x| x as usize);
            h.heads = h.heads.or_else(|| uint("num_heads"));
            h.window_size = h.window_size.or_else(|| uint("window_size"));
            h.patch_size = h.patch_size.or_else(|| uint("patch_size"));
            h.temporal_patch_size = h
                .temporal_patch_size
                .or_else(|| uint("temporal_patch_size"));
            h.rope_theta = h.rope_theta.or_else(|| {
                v.pointer("/rope_parameters/rope_theta")
                    .or_else(|| v.get("rope_theta"))
                    .and_then(Value::as_f64)
                    .map(|x| x as f32)
            });
            if h.fullatt_block_indexes.is_none() {
                h.fullatt_block_indexes = v
                    .get("fullatt_block_indexes")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(|x| x.as_u64().map(|i| i as usize)).collect());
            }
        }
    }
    h
}

/// Sizes of a transformers `Qwen2_5_VisionTransformerPretrainedModel`.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen25VlVisionConfig {
    pub hidden: usize,
    pub depth: usize,
    pub heads: usize,
    /// Width of the gated MLP.
    pub intermediate: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub in_channels: usize,
    /// Width of the merged tokens (the language model's hidden size).
    pub out_hidden: usize,
    /// Attention window side in pixels.
    pub window_size: usize,
    /// Blocks with full attention; the others attend within their window.
    pub fullatt_block_indexes: Vec<usize>,
    /// Epsilon of every RMSNorm.
    pub eps: f32,
    pub rope_theta: f32,
}

impl Qwen25VlVisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Length of one patch vector (3 · T · P²).
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Window side in merged units, floored as transformers does (112 px → 4).
    pub fn window_units(&self) -> usize {
        self.window_size / self.merge_size / self.patch_size
    }

    /// Reads the sizes from transformers names relative to `wb` (see `Qwen25VlVisionSource`):
    /// `patch_embed.proj.weight` [3·T·P², hidden], `blocks.0.mlp.gate_proj.weight`
    /// [hidden, intermediate], `merger.mlp.0.weight` [hidden·merge², ·],
    /// `merger.mlp.2.weight` [·, out_hidden]; depth from which `blocks.{i}` exist.
    ///
    /// Without values in `hp`: [`DEFAULT_HEADS`] (when it splits `hidden` into heads of a
    /// multiple of 4), [`DEFAULT_WINDOW_SIZE`], patch 14 × 2 frames, rope base 10000, and
    /// [`DEFAULT_FULLATT_BLOCKS`] for a 32-block tower (other depths need a config.json or
    /// GGUF metadata).
    pub fn detect(
        wb: &WeightBuilder<'_, '_>,
        hp: &Qwen25VlVisionHparams,
    ) -> Result<Self, RunnerError> {
        let shape = |name: &str| wb.require_ne(name, ORIGIN);
        let bad = |name: &str, reason: String| wb.bad_data(name, ORIGIN, reason);
        let [patch_dim, hidden, ..] = shape(PATCH_WEIGHT)?;
        let patch_size = hp.patch_size.unwrap_or(DEFAULT_PATCH_SIZE);
        let temporal = hp
            .temporal_patch_size
            .unwrap_or(DEFAULT_TEMPORAL_PATCH_SIZE);
        if hidden == 0 || patch_dim != IN_CHANNELS * temporal * patch_size * patch_size {
            return Err(bad(
                PATCH_WEIGHT,
                format!(
                    "shape [{patch_dim}, {hidden}] does not fit patch {patch_size} over \
                     {temporal} frames of {IN_CHANNELS} channels"
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
        let [_, intermediate, ..] = shape("blocks.0.mlp.gate_proj.weight")?;
        let [merged, ..] = shape("merger.mlp.0.weight")?;
        let merge = ((merged / hidden) as f64).sqrt().round() as usize;
        if merge == 0 || merge * merge * hidden != merged {
            return Err(bad(
                "merger.mlp.0.weight",
                format!("input width {merged} is not hidden {hidden} times a square"),
            ));
        }
        let [_, out_hidden, ..] = shape("merger.mlp.2.weight")?;
        let heads = hp.heads.unwrap_or(DEFAULT_HEADS);
        if heads == 0 || !hidden.is_multiple_of(heads) || !(hidden / heads).is_multiple_of(4) {
            return Err(bad(
                "blocks.0.attn.qkv.weight",
                format!(
                    "hidden {hidden} does not split into {heads} heads of a multiple of 4 \
                     (put the model's config.json beside the weights)"
                ),
            ));
        }
        let window_size = hp.window_size.unwrap_or(DEFAULT_WINDOW_SIZE);
        if window_size / merge / patch_size == 0 {
            return Err(bad(
                "vision_config.window_size",
                format!(
                    "a window of {window_size} px is under one {merge}x{merge} merge of \
                     {patch_size} px patches"
                ),
            ));
        }
        let fullatt_block_indexes = match (&hp.fullatt_block_indexes, hp.n_wa_pattern) {
            (Some(idx), _) => idx.clone(),
            (None, Some(n)) if n > 0 => (0..depth).filter(|i| (i + 1) % n == 0).collect(),
            (None, None) if depth == 32 => DEFAULT_FULLATT_BLOCKS.to_vec(),
            _ => {
                return Err(bad(
                    "blocks",
                    format!(
                        "{depth} blocks but no fullatt_block_indexes \
                         (put the model's config.json beside the weights)"
                    ),
                ))
            }
        };
        // transformers never reaches indexes past the depth (small models keep the released
        // list in their config): drop them.
        let fullatt_block_indexes: Vec<usize> = fullatt_block_indexes
            .into_iter()
            .filter(|&i| i < depth)
            .collect();
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
            window_size,
            fullatt_block_indexes,
            eps: 1e-6,
            rope_theta: hp.rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
        };
        log::debug!(
            "Qwen2.5-VL vision: {} blocks, hidden {}, {} heads, ffn {}, out {}, window {} px, full attention {:?}",
            config.depth,
            config.hidden,
            config.heads,
            config.intermediate,
            config.out_hidden,
            config.window_size,
            config.fullatt_block_indexes
        );
        Ok(config)
    }
}
