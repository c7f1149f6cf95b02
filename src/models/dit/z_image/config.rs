//! Z-Image transformer sizes, read off the weight shapes (the rest from `config.json` or the
//! released model's rules).

use crate::runner::{RunnerError, WeightBuilder};

const ORIGIN: &str = "the Z-Image transformer weights";

/// RMS-norm epsilon of the blocks and the caption embedder (diffusers `norm_eps`).
pub const NORM_EPS: f32 = 1e-5;
/// q/k RMS norms (diffusers hard-codes 1e-5; upstream uses 1e-6).
pub const QK_NORM_EPS: f32 = 1e-5;
/// The final layer's affine-free layer norm.
pub const FINAL_NORM_EPS: f32 = 1e-6;
/// Rope base of the released models (`rope_theta`).
pub const ROPE_THETA: f32 = 256.0;
/// Timesteps enter as `t_scale · (1 − σ)`.
pub const T_SCALE: f32 = 1000.0;
/// Both token streams are padded to a multiple of this with learned pad tokens.
pub const SEQ_MULTIPLE: usize = 32;

/// How the weights are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZImageLayout {
    /// The released / ComfyUI single files: `x_embedder`, fused `attention.qkv`,
    /// `attention.out`, `q_norm`.
    Original,
    /// diffusers `ZImageTransformer2DModel`: `all_x_embedder.{p}-{f}`, `to_q/k/v`, `to_out.0`,
    /// `norm_q`.
    Diffusers,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ZImageConfig {
    pub layout: ZImageLayout,
    pub patch_size: usize,
    /// Frames per patch (1 for images).
    pub frame_patch: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub dim: usize,
    pub head_dim: usize,
    pub heads: usize,
    pub ffn_hidden: usize,
    pub layers: usize,
    pub refiner_layers: usize,
    /// Width of the text encoder's states (`cap_feat_dim`).
    pub cap_dim: usize,
    /// Sinusoid width of the timestep embedding and the adaptive-norm input width.
    pub t_freq_dim: usize,
    pub adaln_dim: usize,
    /// Rope axes (caption index, row, column), summing to `head_dim`.
    pub axes_dims: [usize; 3],
    pub rope_theta: f32,
}

impl ZImageConfig {
    /// The layout when `wb` holds a Z-Image transformer (`cap_embedder` beside a layer with
    /// adaptive norms), else `None`.
    pub fn recognise(wb: &WeightBuilder<'_, '_>) -> Option<ZImageLayout> {
        if !wb.contains("cap_embedder.1.weight")
            || !wb.contains("layers.0.adaLN_modulation.0.weight")
        {
            return None;
        }
        if wb.contains("x_embedder.weight") {
            Some(ZImageLayout::Original)
        } else {
            diffusers_patch(wb).map(|_| ZImageLayout::Diffusers)
        }
    }

    pub fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self, RunnerError> {
        let layout = Self::recognise(wb).ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key("cap_embedder.1.weight"),
            origin: ORIGIN.into(),
        })?;
        let shape = |name: &str| wb.require_ne(name, ORIGIN);
        let bad = |name: &str, reason: String| wb.bad_data(name, ORIGIN, reason);
        // The released files' names do not carry the patch size: theirs is 2 × 2 × 1.
        let (patch_size, frame_patch, x_key, final_key) = match layout {
            ZImageLayout::Original => (
                2,
                1,
                "x_embedder.weight".to_string(),
                "final_layer.linear.weight".to_string(),
            ),
            ZImageLayout::Diffusers => {
                let (p, f) = diffusers_patch(wb).unwrap_or((2, 1));
                (
                    p,
                    f,
                    format!("all_x_embedder.{p}-{f}.weight"),
                    format!("all_final_layer.{p}-{f}.linear.weight"),
                )
            }
        };
        let per_patch = patch_size * patch_size * frame_patch;
        let [x_feat, dim, ..] = shape(&x_key)?;
        let [_, out_feat, ..] = shape(&final_key)?;
        if dim == 0 || !x_feat.is_multiple_of(per_patch) || !out_feat.is_multiple_of(per_patch) {
            return Err(bad(
                &x_key,
                format!("{x_feat} features are not {per_patch} patch pixels × channels"),
            ));
        }
        let qn = match layout {
            ZImageLayout::Original => "layers.0.attention.q_norm.weight",
            ZImageLayout::Diffusers => "layers.0.attention.norm_q.weight",
        };
        let [head_dim, ..] = shape(qn)?;
        if head_dim == 0 || !dim.is_multiple_of(head_dim) || !head_dim.is_multiple_of(2) {
            return Err(bad(
                qn,
                format!("head size {head_dim} does not divide {dim}"),
            ));
        }
        let [cap_dim, ..] = shape("cap_embedder.0.weight")?;
        let [_, ffn_hidden, ..] = shape("layers.0.feed_forward.w1.weight")?;
        let [t_freq_dim, ..] = shape("t_embedder.mlp.0.weight")?;
        let [_, adaln_dim, ..] = shape("t_embedder.mlp.2.weight")?;
        let count = |prefix: &str| {
            (0..)
                .take_while(|i| wb.contains(&format!("{prefix}.{i}.attention_norm1.weight")))
                .count()
        };
        Ok(Self {
            layout,
            patch_size,
            frame_patch,
            in_channels: x_feat / per_patch,
            out_channels: out_feat / per_patch,
            dim,
            head_dim,
            heads: dim / head_dim,
            ffn_hidden,
            layers: count("layers"),
            refiner_layers: count("noise_refiner"),
            cap_dim,
            t_freq_dim,
            adaln_dim,
            axes_dims: default_axes(head_dim),
            rope_theta: ROPE_THETA,
        })
    }

    /// Rope axes from `config.json` (`axes_dims`), which must sum to the head size.
    pub fn with_axes_dims(mut self, axes: [usize; 3]) -> Result<Self, RunnerError> {
        if axes.iter().sum::<usize>() != self.head_dim || axes.iter().any(|a| a % 2 != 0) {
            return Err(RunnerError::Internal(format!(
                "Z-Image axes_dims {axes:?} do not split the head size {} into even parts",
                self.head_dim
            )));
        }
        self.axes_dims = axes;
        Ok(self)
    }

    pub fn with_rope_theta(mut self, theta: f32) -> Self {
        self.rope_theta = theta;
        self
    }

    /// Features of one patch token (p · p · f · C).
    pub fn patch_features(&self, channels: usize) -> usize {
        self.patch_size * self.patch_size * self.frame_patch * channels
    }
}

/// The released [32, 48, 48] split of a 128 head scaled to other heads: a quarter for the
/// caption index, the rest halved between rows and columns (rounded to even).
pub fn default_axes(head_dim: usize) -> [usize; 3] {
    let first = (head_dim / 4) & !1;
    let hw = ((head_dim - first) / 2) & !1;
    [head_dim - 2 * hw, hw, hw]
}

/// `(patch, frame patch)` of diffusers' `all_x_embedder.{p}-{f}` name.
fn diffusers_patch(wb: &WeightBuilder<'_, '_>) -> Option<(usize, usize)> {
    (1..=8)
        .flat_map(|p| (1..=4).map(move |f| (p, f)))
        .find(|(p, f)| wb.contains(&format!("all_x_embedder.{p}-{f}.weight")))
}

#[cfg(test)]
mod tests {
    use super::default_axes;

    #[test]
    fn default_axes_match_the_released_split() {
        assert_eq!(default_axes(128), [32, 48, 48]);
        assert_eq!(default_axes(16), [4, 6, 6]);
        assert_eq!(default_axes(64), [16, 24, 24]);
    }
}
