//! CLIP text encoder hyper-parameters: sizes from the weight shapes, the head count and
//! activation from `config.json` or the caller.

use serde_json::Value;

use super::detect::{count_layers, heads_and_act, projection_dim};
use crate::runner::{RunnerError, WeightBuilder};

const ORIGIN: &str = "the CLIP text encoder weights";

/// CLIP's attention head size: every released text tower (ViT-L/14 768 → 12 heads, ViT-H/14
/// 1024 → 16, ViT-bigG/14 1280 → 20) has heads of 64.
pub const HEAD_SIZE: usize = 64;

/// LayerNorm epsilon of every released CLIP text tower (transformers' default).
pub const DEFAULT_EPS: f32 = 1e-5;

/// The MLP activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClipActivation {
    /// `x · sigmoid(1.702 x)` (OpenAI CLIP, transformers `quick_gelu`).
    QuickGelu,
    /// Exact erf GELU (OpenCLIP ViT-H / bigG, transformers `gelu`).
    Gelu,
}

impl ClipActivation {
    /// transformers' `hidden_act` spelling; `None` for activations CLIP never used.
    pub fn from_hidden_act(name: &str) -> Option<Self> {
        match name {
            "quick_gelu" => Some(Self::QuickGelu),
            "gelu" => Some(Self::Gelu),
            _ => None,
        }
    }

    /// `config.json`'s `hidden_act`, else gelu for an OpenCLIP-layout file (OpenCLIP's towers
    /// all use it), else what the caller knows the component is.
    pub(crate) fn resolve(hidden_act: Option<Self>, openclip_layout: bool, fallback: Self) -> Self {
        match (hidden_act, openclip_layout) {
            (Some(act), _) => act,
            (None, true) => Self::Gelu,
            (None, false) => fallback,
        }
    }
}

/// What the weights do not say. [`ClipConfig::detect`] resolves it: `heads` from
/// `config.json` else `hidden / 64`; the activation from `config.json`'s `hidden_act`, else
/// gelu for an OpenCLIP-layout file, else `fallback_act` (what the caller knows the component
/// is: CLIP-L → quick_gelu, OpenCLIP ViT-H / bigG → gelu).
#[derive(Clone, Debug, PartialEq)]
pub struct ClipHparams {
    pub heads: Option<usize>,
    pub hidden_act: Option<ClipActivation>,
    pub eps: Option<f32>,
    /// The file used OpenCLIP names ([`ClipSource::layout`](super::ClipSource::layout)).
    pub openclip_layout: bool,
    pub fallback_act: ClipActivation,
}

impl ClipHparams {
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
    /// `config.json` (a `CLIPTextConfig`, or a `CLIPConfig` with `text_config`). An unknown
    /// `hidden_act` is an error: guessing would give wrong outputs silently.
    pub fn with_config_json(mut self, config: &Value) -> Result<Self, RunnerError> {
        let text = config.get("text_config").unwrap_or(config);
        let bad = |reason: String| RunnerError::BadData {
            key: "config.json".into(),
            origin: ORIGIN.into(),
            reason,
        };
        let (heads, act) = heads_and_act(text, bad)?;
        self.heads = heads.or(self.heads);
        self.hidden_act = act.or(self.hidden_act);
        if let Some(eps) = text.get("layer_norm_eps").and_then(Value::as_f64) {
            self.eps = Some(eps as f32);
        }
        Ok(self)
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

/// Sizes and settings of a CLIP text tower.
#[derive(Clone, Debug, PartialEq)]
pub struct ClipConfig {
    /// Rows of the token table (textual-inversion rows come on top, per call).
    pub vocab: usize,
    pub hidden: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub layers: usize,
    /// Rows of the position table: the longest sequence one call takes.
    pub max_positions: usize,
    pub act: ClipActivation,
    pub eps: f32,
    /// Output width of `text_projection`, when the file has one.
    pub projection_dim: Option<usize>,
}

impl ClipConfig {
    /// Reads the sizes from the weight shapes (transformers names relative to `wb`):
    /// `token_embedding` [hidden, vocab], `position_embedding` [hidden, positions], layer 0's
    /// `mlp.fc1` [hidden, intermediate], `text_projection.weight` [hidden, proj] if present;
    /// the layer count is the number of consecutive `encoder.layers.{i}` present.
    pub fn detect(wb: &WeightBuilder<'_, '_>, hp: &ClipHparams) -> Result<Self, RunnerError> {
        let tm = wb.pp("text_model");
        let shape = |name: &str| tm.require_ne(name, ORIGIN);

        let [hidden, vocab, ..] = shape("embeddings.token_embedding.weight")?;
        let pos_key = "embeddings.position_embedding.weight";
        let [pos_width, max_positions, ..] = shape(pos_key)?;
        if pos_width != hidden || max_positions == 0 {
            return Err(tm.bad_data(
                pos_key,
                ORIGIN,
                format!("shape [{pos_width}, {max_positions}] does not fit hidden {hidden}"),
            ));
        }
        let fc1_key = "encoder.layers.0.mlp.fc1.weight";
        let [fc1_in, intermediate, ..] = shape(fc1_key)?;
        if fc1_in != hidden {
            return Err(tm.bad_data(
                fc1_key,
                ORIGIN,
                format!("input width {fc1_in} is not hidden {hidden}"),
            ));
        }
        let layers = count_layers(&tm, ORIGIN)?;

        let heads = hp.heads.unwrap_or((hidden / HEAD_SIZE).max(1));
        if heads == 0 || hidden % heads != 0 {
            return Err(tm.bad_data(
                "embeddings.token_embedding.weight",
                ORIGIN,
                format!("hidden width {hidden} does not split into {heads} attention heads"),
            ));
        }

        let projection_dim = projection_dim(wb, super::source::PROJECTION, hidden, ORIGIN)?;

        let config = Self {
            vocab,
            hidden,
            heads,
            intermediate,
            layers,
            max_positions,
            act: hp.activation(),
            eps: hp.eps.unwrap_or(DEFAULT_EPS),
            projection_dim,
        };
        log::debug!(
            "CLIP text encoder: {} layers, hidden {}, {} heads, intermediate {}, vocab {}, \
             {} positions, {:?}, projection {:?}",
            config.layers,
            config.hidden,
            config.heads,
            config.intermediate,
            config.vocab,
            config.max_positions,
            config.act,
            config.projection_dim
        );
        Ok(config)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}
