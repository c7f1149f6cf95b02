//! CLIP vision tower hyper-parameters: sizes from the weight shapes; the head count, activation
//! and LayerNorm epsilon from `config.json` or the caller.

use std::collections::BTreeSet;

use serde_json::Value;

use super::source::{PROJECTION, TOWER};
use crate::models::te::clip::detect::{count_layers, heads_and_act, projection_dim};
use crate::models::te::clip::ClipActivation;
use crate::runner::{RunnerError, WeightBuilder};
use crate::weights::TensorStore;

pub(crate) const ORIGIN: &str = "the CLIP vision encoder weights";

/// Heads of every released CLIP vision tower (OpenAI ViT-L/14 1024 → 64, OpenCLIP ViT-H/14
/// 1280 → 80, ViT-bigG/14 1664 → 104): the head size varies, the count does not.
pub const DEFAULT_HEADS: usize = 16;

/// LayerNorm epsilon of every released CLIP vision tower (transformers' default).
pub const DEFAULT_EPS: f32 = 1e-5;

/// What the weights do not say. [`ClipVisionConfig::detect`] resolves it: `heads` from
/// `config.json` else [`DEFAULT_HEADS`]; the activation from `config.json`'s `hidden_act`, else
/// gelu for an OpenCLIP-layout file, else `fallback_act` (what the caller knows the tower is:
/// OpenCLIP ViT-H / bigG → gelu, OpenAI ViT-L → quick_gelu).
#[derive(Clone, Debug, PartialEq)]
pub struct ClipVisionHparams {
    pub heads: Option<usize>,
    pub hidden_act: Option<ClipActivation>,
    pub eps: Option<f32>,
    /// The file used OpenCLIP names ([`ClipVisionSource::layout`](super::ClipVisionSource::layout)).
    pub openclip_layout: bool,
    pub fallback_act: ClipActivation,
}

impl ClipVisionHparams {
    /// Nothing known but the caller's activation.
    pub fn new(fallback_act: ClipActivation) -> Self {
        Self {
            heads: None,
            hidden_act: None,
            eps: None,
            openclip_layout: false,
            fallback_act,
        }
    }

    /// Takes `num_attention_heads`, `hidden_act` and `layer_norm_eps` from a transformers
    /// `config.json`: a `CLIPVisionConfig` (what `CLIPVisionModel(WithProjection)` saves) or a
    /// `CLIPConfig` with `vision_config`. Absent keys leave the field unset; an unknown
    /// `hidden_act` or a non-positive head count is an error (guessing would give wrong
    /// outputs silently).
    pub fn with_config_json(mut self, config: &Value) -> Result<Self, RunnerError> {
        let vision = config.get("vision_config").unwrap_or(config);
        let bad = |reason: String| RunnerError::BadData {
            key: "config.json".into(),
            origin: ORIGIN.into(),
            reason,
        };
        let (heads, act) = heads_and_act(vision, bad)?;
        self.heads = heads.or(self.heads);
        self.hidden_act = act.or(self.hidden_act);
        if let Some(v) = vision.get("layer_norm_eps") {
            let eps = v
                .as_f64()
                .filter(|&e| e > 0.0 && e.is_finite())
                .ok_or_else(|| bad(format!("layer_norm_eps {v} is not a positive number")))?;
            self.eps = Some(eps as f32);
        }
        Ok(self)
    }

    /// [`ClipVisionHparams::with_config_json`] with the `config.json` kept beside the files
    /// that hold the tower's tensors under `prefix` (a diffusers / transformers folder), if
    /// any. Other components' configs in the same store are not read.
    pub fn with_store_config(self, store: &TensorStore, prefix: &str) -> Result<Self, RunnerError> {
        let tower_files: BTreeSet<usize> = store.with_prefix(prefix).map(|t| t.file).collect();
        let config = store
            .files()
            .iter()
            .enumerate()
            .filter(|(i, _)| tower_files.contains(i))
            .find_map(|(_, f)| f.config.as_ref());
        match config {
            Some(cfg) => self.with_config_json(cfg),
            None => Ok(self),
        }
    }

    /// Records whether the file used OpenCLIP names.
    pub fn with_openclip_layout(mut self, openclip: bool) -> Self {
        self.openclip_layout = openclip;
        self
    }

    /// The activation by the precedence above.
    pub fn activation(&self) -> ClipActivation {
        ClipActivation::resolve(self.hidden_act, self.openclip_layout, self.fallback_act)
    }
}

/// Sizes and settings of a CLIP vision tower (transformers `CLIPVisionConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct ClipVisionConfig {
    pub hidden: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub layers: usize,
    /// Input channels of the patch embedding (3 for every released tower).
    pub channels: usize,
    /// Side of the square patches (kernel and stride of the patch embedding).
    pub patch_size: usize,
    /// Side of the square input image: `patch_size · √(positions − 1)`.
    pub image_size: usize,
    pub act: ClipActivation,
    pub eps: f32,
    /// Output width of `visual_projection`, when the file has one.
    pub projection_dim: Option<usize>,
}

impl ClipVisionConfig {
    /// Reads the sizes from the weight shapes (transformers names relative to `wb`, see
    /// [`ClipVisionSource`](super::ClipVisionSource)): `embeddings.patch_embedding.weight`
    /// [P, P, C, hidden], `embeddings.class_embedding` [hidden],
    /// `embeddings.position_embedding.weight` [hidden, 1 + (image / P)²], layer 0's `mlp.fc1`
    /// [hidden, intermediate], `visual_projection.weight` [hidden, proj] if present; the layer
    /// count is the number of consecutive `encoder.layers.{i}` present.
    pub fn detect(wb: &WeightBuilder<'_, '_>, hp: &ClipVisionHparams) -> Result<Self, RunnerError> {
        let vm = wb.pp(TOWER.trim_end_matches('.'));
        let shape = |name: &str| vm.require_ne(name, ORIGIN);
        let bad = |name: &str, reason: String| vm.bad_data(name, ORIGIN, reason);

        let patch_key = "embeddings.patch_embedding.weight";
        let [kw, kh, channels, hidden] = shape(patch_key)?;
        if kw != kh || kw == 0 || channels == 0 || hidden == 0 {
            return Err(bad(
                patch_key,
                format!(
                    "shape [{kw}, {kh}, {channels}, {hidden}] is not a square patch kernel \
                     [P, P, channels, hidden]"
                ),
            ));
        }
        let patch_size = kw;

        let class_key = "embeddings.class_embedding";
        let class = shape(class_key)?;
        if class != [hidden, 1, 1, 1] {
            return Err(bad(
                class_key,
                format!("shape {class:?} is not [{hidden}] (the patch embedding's width)"),
            ));
        }

        let pos_key = "embeddings.position_embedding.weight";
        let [pos_width, positions, pos2, pos3] = shape(pos_key)?;
        let grid = (positions.saturating_sub(1) as f64).sqrt().round() as usize;
        if pos_width != hidden
            || pos2 != 1
            || pos3 != 1
            || grid == 0
            || grid * grid + 1 != positions
        {
            return Err(bad(
                pos_key,
                format!(
                    "shape [{pos_width}, {positions}] is not [{hidden}, 1 + a square number of \
                     patches]"
                ),
            ));
        }

        let fc1_key = "encoder.layers.0.mlp.fc1.weight";
        let [fc1_in, intermediate, ..] = shape(fc1_key)?;
        if fc1_in != hidden || intermediate == 0 {
            return Err(bad(
                fc1_key,
                format!("shape [{fc1_in}, {intermediate}] does not take the hidden width {hidden}"),
            ));
        }
        let layers = count_layers(&vm, ORIGIN)?;

        let heads = hp.heads.unwrap_or(DEFAULT_HEADS);
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(bad(
                patch_key,
                format!(
                    "hidden width {hidden} does not split into {heads} attention heads \
                     (put the model's config.json beside the weights)"
                ),
            ));
        }

        let projection_dim = projection_dim(wb, PROJECTION, hidden, ORIGIN)?;

        let config = Self {
            hidden,
            heads,
            intermediate,
            layers,
            channels,
            patch_size,
            image_size: grid * patch_size,
            act: hp.activation(),
            eps: hp.eps.unwrap_or(DEFAULT_EPS),
            projection_dim,
        };
        log::debug!(
            "CLIP vision encoder: {} layers, hidden {}, {} heads, intermediate {}, patch {}, \
             image {}, {:?}, projection {:?}",
            config.layers,
            config.hidden,
            config.heads,
            config.intermediate,
            config.patch_size,
            config.image_size,
            config.act,
            config.projection_dim
        );
        Ok(config)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Patches along one side of the image.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Tokens of the sequence: the class token and one per patch.
    pub fn tokens(&self) -> usize {
        self.grid() * self.grid() + 1
    }
}
