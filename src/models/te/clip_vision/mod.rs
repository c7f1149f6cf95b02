//! CLIP vision encoder (transformers `CLIPVisionModel` / `CLIPVisionModelWithProjection`:
//! OpenCLIP ViT-H/14 as Wan 2.1 I2V / FLF2V use it through `--clip_vision`, OpenAI ViT-L/14,
//! ViT-bigG/14).
//!
//! - [`ClipVisionConfig`]: sizes from the weights ([`ClipVisionConfig::detect`]); heads,
//!   activation and LayerNorm epsilon from [`ClipVisionHparams`] (`config.json`, the file
//!   layout, or what the caller knows; 16 heads otherwise).
//! - [`ClipVisionModel`]: weights under transformers names and a pure `forward` returning the
//!   hidden state after any layer and the pooled (post-LN class token, optionally projected)
//!   output from one graph.
//! - [`ClipVisionSource`]: serves transformers (ComfyUI's `clip_vision_h.safetensors`),
//!   OpenCLIP and stable-diffusion.cpp-converted files under transformers names.
//! - [`clip_vision_preprocess`]: stable-diffusion.cpp's resize / crop / normalisation.
//! - [`encode`], [`encode_hidden`]: one call on a [`Runner`].
//!
//! Loading a file on its own (prefix `""`):
//! ```ignore
//! let store = TensorStore::open(path)?;
//! let source = ClipVisionSource::new(&store, "");
//! let hp = ClipVisionHparams::new(ClipActivation::Gelu)
//!     .with_store_config(&store, "")?
//!     .with_openclip_layout(source.layout().is_openclip());
//! let Loaded { model, runner } = Runner::load("clip_vision", &source, opts, |wb| {
//!     ClipVisionModel::new(wb, ClipVisionConfig::detect(wb, &hp)?)
//! })?;
//! let pixels = clip_vision_preprocess(&image, model.config().image_size)?;
//! let tokens = encode_hidden(&runner, &model, &pixels, model.config().layers)?; // Wan, upstream
//! ```
//!
//! **What Wan 2.1 I2V / FLF2V take** (stable-diffusion.cpp `generate_video`:
//! `get_clip_vision_output(start_image, return_pooled = false, clip_skip = -2)`): the init image
//! is first resized to the output size (`sd_image_to_tensor(image, W, H)`, nearest), then
//! [`clip_vision_preprocess`]ed to 224; the tower's encoder treats a `clip_skip` ≤ 0 as unset,
//! so **all** layers run (32 for ViT-H), and the hidden output is the last layer's state
//! *without* `post_layernorm`, all 257 tokens ([1280, 257] in ggml order);
//! [`ClipVisionOutputs::upstream`]`(layers, false, -2)` says exactly that. Without an init
//! image upstream uses zeros of that shape; FLF2V concatenates the start and end images'
//! outputs along the tokens. diffusers' `WanImageToVideoPipeline` and ComfyUI instead take the
//! *penultimate* layer (`hidden_states[-2]`, `layers - 1`), and diffusers preprocesses with
//! `CLIPImageProcessor` (bicubic; see [`clip_vision_preprocess`]'s module).
//!
//! Other differences from upstream, transformers being followed where upstream is an
//! approximation or a bug: the activation comes from `config.json` / the caller (upstream picks
//! gelu for hidden 1024 or 1280 and quick_gelu otherwise: right for ViT-H, wrong for OpenAI
//! ViT-L and bigG), and is exact (ggml's `gelu` is the tanh form, `gelu_quick` reads an f16
//! table); upstream forces the patch kernel to f16, here it keeps the file's type. OpenCLIP
//! names are read here (upstream maps them only inside full checkpoints, where it applies
//! `proj` as a `Linear` weight, transposed); `proj` is applied as `x @ P`, as OpenCLIP does.

mod config;
mod model;
mod preprocess;
mod source;

pub use config::{ClipVisionConfig, ClipVisionHparams, DEFAULT_EPS, DEFAULT_HEADS};
pub use model::{
    ClipVisionHidden, ClipVisionModel, ClipVisionOutputs, ClipVisionPooled, ClipVisionTensors,
};
pub use preprocess::{clip_vision_preprocess, clip_vision_resize_size};
pub use source::{ClipVisionLayout, ClipVisionSource, PROJECTION, TOWER};

use crate::models::te::clip::{clip_skip_layers, split_outputs};
use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;

/// The `clip_skip` stable-diffusion.cpp passes for Wan 2.1 I2V / FLF2V (which its encoder
/// treats as unset: every layer runs).
pub const WAN_CLIP_SKIP: i32 = -2;

impl ClipVisionOutputs {
    /// What stable-diffusion.cpp's `get_clip_vision_output(image, return_pooled, clip_skip)`
    /// computes for a `layers`-deep tower: with `return_pooled`, the projected pooled output
    /// after [`clip_skip_layers`]`(layers, clip_skip)` layers; otherwise the hidden state
    /// after that many layers, without `post_layernorm`.
    pub fn upstream(layers: usize, return_pooled: bool, clip_skip: i32) -> Self {
        let depth = clip_skip_layers(layers, clip_skip);
        if return_pooled {
            Self {
                hidden: None,
                pooled: Some(ClipVisionPooled {
                    layers: depth,
                    project: true,
                }),
            }
        } else {
            Self {
                hidden: Some(ClipVisionHidden {
                    layers: depth,
                    post_norm: false,
                }),
                pooled: None,
            }
        }
    }

    /// Wan 2.1 I2V / FLF2V's image tokens as stable-diffusion.cpp computes them (see the
    /// module docs): every layer, no `post_layernorm`.
    pub fn wan_i2v(config: &ClipVisionConfig) -> Self {
        Self::upstream(config.layers, false, WAN_CLIP_SKIP)
    }
}

/// The outputs of [`encode`], as [`ClipVisionOutputs`] asked: hidden [hidden, 1 + patches]
/// (ggml order: one row of `hidden` values per token, the class token first), pooled
/// [hidden or proj, 1].
#[derive(Debug)]
pub struct ClipVisionEncoded {
    pub hidden: Option<HostTensor>,
    pub pooled: Option<HostTensor>,
}

/// Checks `pixels` and `want` against the model: the pixels must be
/// [image_size, image_size, channels, 1] (see [`clip_vision_preprocess`]), layer counts at
/// most the depth, and a projection asked only of a file that has one.
pub fn check_request(
    model: &ClipVisionModel,
    pixels: &HostTensor,
    want: &ClipVisionOutputs,
) -> Result<(), RunnerError> {
    let c = model.config();
    let bad = |key: &str, reason: String| RunnerError::BadData {
        key: key.into(),
        origin: "the CLIP vision request".into(),
        reason,
    };
    let expected = [c.image_size, c.image_size, c.channels, 1];
    if pixels.ne != expected {
        return Err(bad(
            "pixel_values",
            format!(
                "shape {:?} is not the tower's input {expected:?} (ggml order; preprocess the \
                 image to {} px first)",
                pixels.ne, c.image_size
            ),
        ));
    }
    if !pixels.is_consistent() {
        return Err(RunnerError::InputSize {
            name: "pixel_values".into(),
            ne: pixels.ne,
            got: pixels.data.len(),
        });
    }
    let depths = [want.hidden.map(|h| h.layers), want.pooled.map(|p| p.layers)];
    if let Some(layers) = depths.into_iter().flatten().find(|&l| l > c.layers) {
        return Err(bad(
            "layers",
            format!("{layers} layers asked of a {}-layer tower", c.layers),
        ));
    }
    if want.pooled.is_some_and(|p| p.project) && !model.has_projection() {
        return Err(RunnerError::MissingTensor {
            key: PROJECTION.into(),
            origin: "the CLIP vision encoder weights (a projected output was asked)".into(),
        });
    }
    Ok(())
}

/// Encodes one preprocessed image ([`clip_vision_preprocess`]) after checking the request
/// ([`check_request`]).
pub fn encode(
    runner: &Runner,
    model: &ClipVisionModel,
    pixels: &HostTensor,
    want: &ClipVisionOutputs,
) -> Result<ClipVisionEncoded, RunnerError> {
    check_request(model, pixels, want)?;
    if want.hidden.is_none() && want.pooled.is_none() {
        return Ok(ClipVisionEncoded {
            hidden: None,
            pooled: None,
        });
    }
    let out = runner.compute(|g| {
        let x = g.input_f32("clip_vision.pixel_values", pixels.ne, pixels.data.clone());
        let t = model.forward(g, x, want);
        t.hidden.into_iter().chain(t.pooled).collect()
    })?;
    let (hidden, pooled) = split_outputs(
        out,
        want.hidden.is_some(),
        want.pooled.is_some(),
        "CLIP vision",
    )?;
    Ok(ClipVisionEncoded { hidden, pooled })
}

/// The hidden state after `layers` layers without `post_layernorm` (transformers'
/// `hidden_states[layers]`), [hidden, 1 + patches]. Wan as upstream: `layers` = the depth
/// ([`ClipVisionOutputs::wan_i2v`]); as diffusers: the depth − 1.
pub fn encode_hidden(
    runner: &Runner,
    model: &ClipVisionModel,
    pixels: &HostTensor,
    layers: usize,
) -> Result<HostTensor, RunnerError> {
    let want = ClipVisionOutputs {
        hidden: Some(ClipVisionHidden {
            layers,
            post_norm: false,
        }),
        pooled: None,
    };
    encode(runner, model, pixels, &want)?
        .hidden
        .ok_or_else(|| RunnerError::Internal("CLIP vision graph returned no hidden state".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_wan_request_runs_every_layer_without_post_norm() {
        let want = ClipVisionOutputs::upstream(32, false, WAN_CLIP_SKIP);
        assert_eq!(
            want.hidden,
            Some(ClipVisionHidden {
                layers: 32,
                post_norm: false
            })
        );
        assert_eq!(want.pooled, None);
        // IP-Adapter plus: `clip_skip` 2 → the penultimate layer.
        let plus = ClipVisionOutputs::upstream(32, false, 2);
        assert_eq!(plus.hidden.map(|h| h.layers), Some(31));
        // IP-Adapter: the projected pooled output after every layer.
        let pooled = ClipVisionOutputs::upstream(24, true, -1);
        assert_eq!(
            pooled.pooled,
            Some(ClipVisionPooled {
                layers: 24,
                project: true
            })
        );
        assert_eq!(pooled.hidden, None);
    }
}
