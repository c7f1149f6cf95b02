//! MiniMax-H3's packed audio+video transformer (diffusers `MiniMaxH3Transformer3DModel`,
//! upstream `minimax_h3.hpp`): one stack of self-attention blocks over a single sequence
//! holding the refined text, keyframe rows, the stereo audio latents and the video patches
//! ([`layout`]). No cross-attention; modalities differ only by their input projections,
//! their output heads and the AdaLN row every span of the sequence picks (timestep ×
//! modality).
//!
//! Inputs are rows: video patches [C·pt·ph·pw, rows] (keyframe rows first), audio latents
//! [C_audio, rows] channel-major, text states [text_dim, L]. The outputs are the network's
//! own predictions for the generated rows (diffusers' sign: the velocity towards the clean
//! sample as t = 1 − σ grows); a sampler's denoiser negates them.
//!
//! Both released variants load: the time-embedder one, and the pruned one whose AdaLN input
//! is interpolated from `adaln_t_table` (no SiLU before its projections).

mod block;
mod config;
pub mod layout;

pub use block::Span;
pub use config::{MiniMaxH3Config, MiniMaxH3Hints, MiniMaxH3Layout, MiniMaxH3Time};
pub use layout::{Keyframe, LayoutRequest, PackedLayout, Reference, Run, Source, Target};

use crate::ggml::Tensor;
use crate::nn::{self, Linear, RmsNorm};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::adaln::columns;
use block::{Block, RefinerBlock, Rope};

/// Cut-group prefix of this model's graph-cut marks (upstream's names).
pub const CUT_PREFIX: &str = "minimax_h3";

/// f32 bytes.
const ES: usize = 4;

/// One call's inputs.
pub struct MiniMaxH3Inputs<'g, 'a> {
    /// Video patch rows [video_features, layout.video_rows].
    pub video: Tensor<'g>,
    /// Audio rows [audio_channels, layout.audio_rows].
    pub audio: Tensor<'g>,
    /// Text-encoder states [text_dim, layout.text_rows] (`None` for an empty prompt).
    pub text: Option<Tensor<'g>>,
    pub layout: &'a PackedLayout,
    /// Keeps the refined text (after `condition_proj` and the token refiner) in the runner's
    /// named cache under this name, and reuses it when it is there (upstream's
    /// `minimax_h3_context_cache`): the text does not depend on the timestep.
    pub text_cache: Option<&'a str>,
}

/// Predictions for the generated rows.
pub struct MiniMaxH3Outputs<'g> {
    /// [video_features, layout.video.len]
    pub video: Tensor<'g>,
    /// [audio_channels, layout.audio.len]
    pub audio: Tensor<'g>,
}

#[derive(Clone, Copy, Debug)]
enum TimeInput {
    Embedder { first: Linear, second: Linear },
    Table(Param),
}

#[derive(Clone, Debug)]
pub struct MiniMaxH3 {
    config: MiniMaxH3Config,
    video_in: Linear,
    audio_in: Linear,
    text_in: Linear,
    time: TimeInput,
    refiner: Vec<RefinerBlock>,
    refiner_norm: RmsNorm,
    blocks: Vec<Block>,
    final_norm: RmsNorm,
    final_mod: Linear,
    video_out: Linear,
    audio_out: Linear,
}

impl MiniMaxH3 {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: MiniMaxH3Config) -> Result<Self, RunnerError> {
        let c = &config;
        let l = c.layout;
        let d = c.hidden;
        let time = match c.time {
            MiniMaxH3Time::Embedder { freq_dim, hidden } => {
                let (first, second) = l.time_mlp();
                TimeInput::Embedder {
                    first: Linear::new(&wb.pp(first), freq_dim, hidden, true)?,
                    second: Linear::new(&wb.pp(second), hidden, c.time_embed_dim, true)?,
                }
            }
            MiniMaxH3Time::CurveTable { grid } => TimeInput::Table(wb.get(
                "adaln_t_table",
                [c.time_embed_dim, grid, 1, 1],
                Storage::F32,
            )?),
        };
        let [norm, modulation, video_out, audio_out] = l.final_layer();
        let blocks = (0..c.layers)
            .map(|i| Block::new(&wb.pp(l.blocks()).pp(i), c))
            .collect::<Result<Vec<_>, _>>()?;
        let refiner = (0..c.refiner_layers)
            .map(|i| RefinerBlock::new(&wb.pp(l.refiner_blocks()).pp(i), c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            video_in: Linear::new(&wb.pp(l.video_in()), c.video_features(), d, true)?,
            audio_in: Linear::new(&wb.pp(l.audio_in()), c.audio_channels, d, true)?,
            text_in: Linear::new(&wb.pp(l.text_in()), c.text_dim, d, true)?,
            time,
            refiner,
            refiner_norm: RmsNorm::new(
                &wb.pp("token_refiner").pp("final_norm"),
                d,
                c.final_norm_eps,
            )?,
            blocks,
            final_norm: RmsNorm::new(&wb.pp(norm), d, c.final_norm_eps)?,
            final_mod: Linear::new(&wb.pp(modulation), c.time_embed_dim, 2 * d, true)?,
            video_out: Linear::new(&wb.pp(video_out), d, c.video_features(), true)?,
            audio_out: Linear::new(&wb.pp(audio_out), d, c.audio_channels, true)?,
            config,
        })
    }

    pub fn config(&self) -> &MiniMaxH3Config {
        &self.config
    }

    /// The text rows after `condition_proj` and the token refiner [D, L, 1].
    pub fn refine_text<'g>(&self, g: &'g GraphCtx<'g>, text: Tensor<'g>) -> Tensor<'g> {
        let mut x = self.text_in.forward(g, text);
        x = g.cut(&format!("{CUT_PREFIX}.condition_proj"), "hidden_states", x);
        for (i, block) in self.refiner.iter().enumerate() {
            let y = block.forward(g, x, &self.config);
            x = g.cut(
                &format!("{CUT_PREFIX}.token_refiner.blocks.{i}"),
                "hidden_states",
                y,
            );
        }
        self.refiner_norm.forward(g, x)
    }

    /// The AdaLN input [time_embed_dim, T] for the layout's timesteps.
    fn adaln_input<'g>(&self, g: &'g GraphCtx<'g>, timesteps: &[f32]) -> Tensor<'g> {
        let n = timesteps.len();
        match self.time {
            TimeInput::Embedder { first, second } => {
                let MiniMaxH3Time::Embedder { freq_dim, .. } = self.config.time else {
                    unreachable!("the time input follows the config")
                };
                // Timesteps enter unscaled, in [0, 1].
                let f = nn::timestep_embedding(timesteps, freq_dim, true, 0.0, 1.0, 10_000.0);
                let t = g.input_f32("minimax_h3.t_freq", [freq_dim, n, 1, 1], f);
                g.silu(second.forward(g, g.silu(first.forward(g, t))))
            }
            TimeInput::Table(table) => {
                let MiniMaxH3Time::CurveTable { grid } = self.config.time else {
                    unreachable!("the time input follows the config")
                };
                let (lower, upper, frac) = curve_points(timesteps, grid);
                let table = g.param(table);
                let lo = g.get_rows(
                    table,
                    g.input_i32("minimax_h3.curve_lo", [n, 1, 1, 1], lower),
                );
                let hi = g.get_rows(
                    table,
                    g.input_i32("minimax_h3.curve_hi", [n, 1, 1, 1], upper),
                );
                let frac = g.input_f32("minimax_h3.curve_frac", [1, n, 1, 1], frac);
                g.add(lo, g.mul(g.sub(hi, lo), frac))
            }
        }
    }

    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &MiniMaxH3Inputs<'g, '_>,
    ) -> Result<MiniMaxH3Outputs<'g>, RunnerError> {
        let c = &self.config;
        let l = inputs.layout;
        let [vf, vn, vb, _] = inputs.video.ne();
        let [af, an, ab, _] = inputs.audio.ne();
        let [tf, tn, tb, _] = inputs.text.map_or([c.text_dim, 0, 1, 1], |t| t.ne());
        if vf != c.video_features()
            || af != c.audio_channels
            || tf != c.text_dim
            || (vn, an, tn) != (l.video_rows, l.audio_rows, l.text_rows)
            || (vb, ab, tb) != (1, 1, 1)
            || l.spans.is_empty()
            || l.video.len == 0
        {
            return Err(RunnerError::Internal(format!(
                "MiniMax-H3 inputs: video {:?}, audio {:?}, text {:?} for a layout of \
                 {} video / {} audio / {} text rows",
                inputs.video.ne(),
                inputs.audio.ne(),
                inputs.text.map(|t| t.ne()),
                l.video_rows,
                l.audio_rows,
                l.text_rows
            )));
        }
        let video = self.video_in.forward(g, inputs.video);
        let audio = (l.audio_rows > 0).then(|| self.audio_in.forward(g, inputs.audio));
        let text = match (inputs.text, inputs.text_cache) {
            (None, _) => None,
            (Some(t), None) => Some(self.refine_text(g, t)),
            (Some(t), Some(key)) => Some(match g.cache_get(key) {
                Some(cached) if cached.ne() == [c.hidden, tn, 1, 1] => cached,
                _ => g.cache_store(key, self.refine_text(g, t)),
            }),
        };

        // The packed sequence, run by run.
        let mut x: Option<Tensor<'g>> = None;
        for run in &l.runs {
            let src = match run.source {
                Source::Text => text,
                Source::Video => Some(video),
                Source::Audio => audio,
            };
            let Some(src) = src else { continue };
            let part = if run.from == 0 && run.len == src.ne()[1] {
                src
            } else {
                columns(g, src, run.from, run.len)
            };
            x = Some(match x {
                Some(x) => g.concat(x, part, 1),
                None => part,
            });
        }
        let mut x = x.ok_or_else(|| RunnerError::Internal("empty MiniMax-H3 sequence".into()))?;

        let adaln_in = self.adaln_input(g, &l.timesteps);
        let rope = self.rope(g, l);
        for (i, block) in self.blocks.iter().enumerate() {
            let y = block.forward(g, x, adaln_in, &l.spans, rope, c);
            x = g.cut(&format!("{CUT_PREFIX}.blocks.{i}"), "hidden_states", y);
        }

        // Output heads on the generated rows, each with its timestep's (shift, scale).
        let d = c.hidden;
        let mods = g.cont(self.final_mod.forward(g, adaln_in));
        let head = |target: &Target, out: &Linear| {
            let piece = |k: usize| {
                g.cont(g.view(
                    mods,
                    [d, 1, 1, 1],
                    [d * ES; 3],
                    (target.timestep * 2 + k) * d * ES,
                ))
            };
            let y = self
                .final_norm
                .forward(g, columns(g, x, target.start, target.len));
            let y = g.add(g.add(y, g.mul(y, piece(1))), piece(0));
            out.forward(g, y)
        };
        let video_out = head(&l.video, &self.video_out);
        let audio_out = if l.audio.len > 0 {
            head(&l.audio, &self.audio_out)
        } else {
            g.input_f32(
                "minimax_h3.no_audio",
                [c.audio_channels, 0, 1, 1],
                Vec::new(),
            )
        };
        Ok(MiniMaxH3Outputs {
            video: video_out,
            audio: audio_out,
        })
    }

    fn rope<'g>(&self, g: &'g GraphCtx<'g>, l: &PackedLayout) -> Rope<'g> {
        let c = &self.config;
        let f = c.rope_freq_dim;
        let positions: Vec<Vec<f32>> = l.positions.iter().map(|p| p.to_vec()).collect();
        // One frequency set shared by the three axes: angles [t | h | w], `rotate_half`.
        let (cos, sin) = nn::rope_table(&positions, &[2 * f, 2 * f, 2 * f], c.rope_theta);
        let ne = [3 * f, 1, l.len(), 1];
        Rope {
            cos: g.input_f32("minimax_h3.rope_cos", ne, cos),
            sin: g.input_f32("minimax_h3.rope_sin", ne, sin),
        }
    }
}

/// Lower row, upper row and fraction of each timestep on a `grid`-row curve table over
/// [0, 1] (upstream's interpolation; the last interval is closed).
pub fn curve_points(timesteps: &[f32], grid: usize) -> (Vec<i32>, Vec<i32>, Vec<f32>) {
    let last = grid.saturating_sub(2) as f32;
    let mut lower = Vec::with_capacity(timesteps.len());
    let mut upper = Vec::with_capacity(timesteps.len());
    let mut frac = Vec::with_capacity(timesteps.len());
    for &t in timesteps {
        let pos = t.clamp(0.0, 1.0) * (grid - 1) as f32;
        let i = pos.floor().min(last);
        lower.push(i as i32);
        upper.push(i as i32 + 1);
        frac.push(pos - i);
    }
    (lower, upper, frac)
}

/// Video patch rows [C·pt·ph·pw, (T/pt)(H/ph)(W/pw)] of a latent [W, H, T, C] (ggml order):
/// frame-major, then row-major patches; features (channel, t, h, w) with w fastest.
pub fn patchify(
    latent: &crate::tensor::HostTensor,
    patch: [usize; 3],
) -> crate::tensor::HostTensor {
    let [w, h, t, c] = latent.ne;
    let [pt, ph, pw] = patch;
    let (nt, nh, nw) = (t / pt, h / ph, w / pw);
    let f = c * pt * ph * pw;
    let mut data = vec![0f32; f * nt * nh * nw];
    for ch in 0..c {
        for z in 0..nt * pt {
            for y in 0..nh * ph {
                for x in 0..nw * pw {
                    let row = ((z / pt) * nh + y / ph) * nw + x / pw;
                    let feat = ((ch * pt + z % pt) * ph + y % ph) * pw + x % pw;
                    data[row * f + feat] = latent.data[x + w * (y + h * (z + t * ch))];
                }
            }
        }
    }
    crate::tensor::HostTensor {
        ne: [f, nt * nh * nw, 1, 1],
        data,
    }
}

/// The inverse of [`patchify`] for rows of a (T, H, W) latent with `c` channels.
pub fn unpatchify(
    rows: &crate::tensor::HostTensor,
    c: usize,
    size: [usize; 3],
    patch: [usize; 3],
) -> crate::tensor::HostTensor {
    let [t, h, w] = size;
    let [pt, ph, pw] = patch;
    let (nh, nw) = (h / ph, w / pw);
    let f = c * pt * ph * pw;
    let mut data = vec![0f32; w * h * t * c];
    for ch in 0..c {
        for z in 0..t {
            for y in 0..h {
                for x in 0..w {
                    let row = ((z / pt) * nh + y / ph) * nw + x / pw;
                    let feat = ((ch * pt + z % pt) * ph + y % ph) * pw + x % pw;
                    data[x + w * (y + h * (z + t * ch))] = rows.data[row * f + feat];
                }
            }
        }
    }
    crate::tensor::HostTensor {
        ne: [w, h, t, c],
        data,
    }
}
