//! MiniMax-H3 transformer sizes, read off the weight shapes; what shapes cannot tell (patch,
//! rope frequencies, epsilons) from `config.json` when it is beside the weights, else the
//! released model's values.

use crate::runner::{RunnerError, WeightBuilder};

const ORIGIN: &str = "the MiniMax-H3 transformer weights";

/// How the weights are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MiniMaxH3Layout {
    /// The released single files (Comfy-Org, the GGUFs made from them): `video_patch_proj`,
    /// fused `attn.qkv_proj` ([q; k; v] rows), `mlp.fc1` with [gate; value] rows,
    /// `final_layer.*`.
    Original,
    /// diffusers `MiniMaxH3Transformer3DModel`: `proj_in`, `to_q/k/v`, `ff.net.0.proj` with
    /// [value; gate] rows, `norm_out`, `proj_out`.
    Diffusers,
}

/// Where the AdaLN input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MiniMaxH3Time {
    /// Sinusoid features → `time_embedder` MLP; the AdaLN projections take its SiLU.
    Embedder { freq_dim: usize, hidden: usize },
    /// The pruned checkpoints' `adaln_t_table` [grid, time_embed_dim]: rows sampled on a
    /// uniform grid over t ∈ [0, 1], interpolated linearly; the projections take them as is.
    CurveTable { grid: usize },
}

/// What `config.json` adds to the shapes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MiniMaxH3Hints {
    pub patch: Option<[usize; 3]>,
    pub rope_freq_dim: Option<usize>,
    pub rope_theta: Option<f32>,
    pub norm_eps: Option<f32>,
    pub qk_norm_eps: Option<f32>,
    pub final_norm_eps: Option<f32>,
}

impl MiniMaxH3Hints {
    pub fn from_config(config: &serde_json::Value) -> Self {
        let f = |k: &str| config.get(k).and_then(|v| v.as_f64()).map(|v| v as f32);
        let u = |v: &serde_json::Value| v.as_u64().and_then(|v| usize::try_from(v).ok());
        let patch = config
            .get("patch_size")
            .and_then(|p| p.as_array())
            .filter(|a| a.len() == 3)
            .and_then(|a| Some([u(&a[0])?, u(&a[1])?, u(&a[2])?]));
        Self {
            patch,
            rope_freq_dim: config.get("rope_freq_dim").and_then(u),
            rope_theta: f("rope_theta"),
            norm_eps: f("norm_eps"),
            qk_norm_eps: f("qk_norm_eps"),
            final_norm_eps: f("final_norm_eps"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MiniMaxH3Config {
    pub layout: MiniMaxH3Layout,
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub layers: usize,
    pub refiner_layers: usize,
    pub video_channels: usize,
    pub audio_channels: usize,
    /// (t, h, w) patch of the video latents.
    pub patch: [usize; 3],
    pub text_dim: usize,
    pub time: MiniMaxH3Time,
    /// Width of the AdaLN input (the time embedding / curve-table rows).
    pub time_embed_dim: usize,
    /// Rotary frequencies per axis; 6 × this many head channels rotate.
    pub rope_freq_dim: usize,
    pub rope_theta: f32,
    pub norm_eps: f32,
    pub qk_norm_eps: f32,
    pub final_norm_eps: f32,
}

impl MiniMaxH3Layout {
    pub fn blocks(self) -> &'static str {
        match self {
            Self::Original => "blocks",
            Self::Diffusers => "transformer_blocks",
        }
    }
    pub fn refiner_blocks(self) -> &'static str {
        match self {
            Self::Original => "token_refiner.blocks",
            Self::Diffusers => "token_refiner.refiner_blocks",
        }
    }
    pub fn video_in(self) -> &'static str {
        match self {
            Self::Original => "video_patch_proj",
            Self::Diffusers => "proj_in",
        }
    }
    pub fn audio_in(self) -> &'static str {
        match self {
            Self::Original => "audio_patch_proj",
            Self::Diffusers => "audio_proj_in",
        }
    }
    pub fn text_in(self) -> &'static str {
        match self {
            Self::Original => "condition_proj",
            Self::Diffusers => "context_embedder",
        }
    }
    /// (first, second) linear of the timestep MLP.
    pub fn time_mlp(self) -> (&'static str, &'static str) {
        match self {
            Self::Original => ("time_embedder.proj_in", "time_embedder.proj_out"),
            Self::Diffusers => ("time_embedder.linear_1", "time_embedder.linear_2"),
        }
    }
    /// (norm, modulation, video head, audio head) of the output layer.
    pub fn final_layer(self) -> [&'static str; 4] {
        match self {
            Self::Original => [
                "final_layer.norm",
                "final_layer.adaln_proj.linear",
                "final_layer.video_out",
                "final_layer.audio_out",
            ],
            Self::Diffusers => [
                "norm_out.norm",
                "norm_out.linear",
                "proj_out",
                "audio_proj_out",
            ],
        }
    }
    /// (q norm, k norm, output projection) inside `attn`.
    pub fn attn(self) -> [&'static str; 3] {
        match self {
            Self::Original => ["q_norm", "k_norm", "out_proj"],
            Self::Diffusers => ["norm_q", "norm_k", "to_out.0"],
        }
    }
    /// (gated input projection, output projection) of the feed-forward.
    pub fn ffn(self) -> [&'static str; 2] {
        match self {
            Self::Original => ["mlp.fc1", "mlp.fc2"],
            Self::Diffusers => ["ff.net.0.proj", "ff.net.2"],
        }
    }
}

/// Released values (diffusers' defaults, upstream's `Config`).
const PATCH: [usize; 3] = [1, 2, 2];
/// Without `rope.inv_freq` or `config.json`: the released model rotates 3/4 of each head
/// (6 × 16 of 128 channels), i.e. head size / 8 frequencies per axis.
const HEAD_PER_ROPE_FREQ: usize = 8;
const ROPE_THETA: f32 = 10_000.0;
const EPS: f32 = 1e-5;

impl MiniMaxH3Config {
    /// The layout when `wb` holds a MiniMax-H3 transformer, else `None`.
    pub fn recognise(wb: &WeightBuilder<'_, '_>) -> Option<MiniMaxH3Layout> {
        if wb.contains("video_patch_proj.weight")
            && wb.contains("token_refiner.blocks.0.attn.qkv_proj.weight")
        {
            Some(MiniMaxH3Layout::Original)
        } else if wb.contains("audio_proj_in.weight")
            && wb.contains("token_refiner.refiner_blocks.0.attn.to_q.weight")
        {
            Some(MiniMaxH3Layout::Diffusers)
        } else {
            None
        }
    }

    pub fn detect(wb: &WeightBuilder<'_, '_>, hints: &MiniMaxH3Hints) -> Result<Self, RunnerError> {
        let layout = Self::recognise(wb).ok_or_else(|| RunnerError::MissingTensor {
            key: wb.key("video_patch_proj.weight"),
            origin: ORIGIN.into(),
        })?;
        let shape = |name: &str| wb.require_ne(&format!("{name}.weight"), ORIGIN);
        let bad =
            |name: &str, reason: String| wb.bad_data(&format!("{name}.weight"), ORIGIN, reason);
        let count = |prefix: &str, leaf: &str| {
            (0..)
                .take_while(|i| wb.contains(&format!("{prefix}.{i}.{leaf}")))
                .count()
        };
        let blocks = layout.blocks();
        let layers = count(blocks, "norm1.weight");
        let refiner_layers = count(layout.refiner_blocks(), "norm1.weight");
        if layers == 0 {
            return Err(RunnerError::MissingTensor {
                key: wb.key(&format!("{blocks}.0.norm1.weight")),
                origin: ORIGIN.into(),
            });
        }

        let patch = hints.patch.unwrap_or(PATCH);
        let per_patch = patch.iter().product::<usize>();
        let [video_feat, hidden, ..] = shape(layout.video_in())?;
        if per_patch == 0 || !video_feat.is_multiple_of(per_patch) {
            return Err(bad(
                layout.video_in(),
                format!("{video_feat} features are not {patch:?} patches of latent channels"),
            ));
        }
        let [audio_channels, audio_hidden, ..] = shape(layout.audio_in())?;
        let [text_dim, text_hidden, ..] = shape(layout.text_in())?;
        if audio_hidden != hidden || text_hidden != hidden {
            return Err(bad(
                layout.audio_in(),
                format!("width {audio_hidden} / text width {text_hidden} differ from the video's {hidden}"),
            ));
        }

        let attn = format!("{blocks}.0.attn");
        let [qn, ..] = layout.attn();
        let [head_dim, ..] = shape(&format!("{attn}.{qn}"))?;
        let inner = match layout {
            MiniMaxH3Layout::Original => shape(&format!("{attn}.qkv_proj"))?[1] / 3,
            MiniMaxH3Layout::Diffusers => shape(&format!("{attn}.to_q"))?[1],
        };
        if head_dim == 0 || !inner.is_multiple_of(head_dim) || inner == 0 {
            return Err(bad(
                &format!("{attn}.{qn}"),
                format!("head size {head_dim} does not divide the attention width {inner}"),
            ));
        }
        let [fc1, _] = layout.ffn();
        let [_, ffn2, ..] = shape(&format!("{blocks}.0.{fc1}"))?;

        let (time, time_embed_dim) = if let Some(ne) = wb.source_ne("adaln_t_table") {
            let [dim, grid, ..] = ne;
            if grid < 2 {
                return Err(wb.bad_data(
                    "adaln_t_table",
                    ORIGIN,
                    format!("a curve table needs 2 rows or more, not {grid}"),
                ));
            }
            (MiniMaxH3Time::CurveTable { grid }, dim)
        } else {
            let (first, second) = layout.time_mlp();
            let [freq_dim, t_hidden, ..] = shape(first)?;
            let [_, dim, ..] = shape(second)?;
            (
                MiniMaxH3Time::Embedder {
                    freq_dim,
                    hidden: t_hidden,
                },
                dim,
            )
        };
        let rope_freq_dim = wb
            .source_ne("rope.inv_freq")
            .map(|ne| ne[0])
            .or(hints.rope_freq_dim)
            .unwrap_or(head_dim / HEAD_PER_ROPE_FREQ);
        if rope_freq_dim == 0 || 6 * rope_freq_dim > head_dim {
            return Err(bad(
                &format!("{attn}.{qn}"),
                format!(
                    "head size {head_dim} is smaller than the {} rotated channels",
                    6 * rope_freq_dim
                ),
            ));
        }
        Ok(Self {
            layout,
            hidden,
            heads: inner / head_dim,
            head_dim,
            ffn: ffn2 / 2,
            layers,
            refiner_layers,
            video_channels: video_feat / per_patch,
            audio_channels,
            patch,
            text_dim,
            time,
            time_embed_dim,
            rope_freq_dim,
            rope_theta: hints.rope_theta.unwrap_or(ROPE_THETA),
            norm_eps: hints.norm_eps.unwrap_or(EPS),
            qk_norm_eps: hints.qk_norm_eps.unwrap_or(EPS),
            final_norm_eps: hints.final_norm_eps.unwrap_or(EPS),
        })
    }

    /// Features of one video patch row.
    pub fn video_features(&self) -> usize {
        self.video_channels * self.patch.iter().product::<usize>()
    }

    /// Width of q / k / v (heads × head size; larger than `hidden` in the released model).
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }
}
