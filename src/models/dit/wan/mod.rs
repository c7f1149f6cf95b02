//! The Wan 2.1 / 2.2 video diffusion transformer (diffusers `WanTransformer3DModel`,
//! upstream `wan.hpp`): a latent video cut into 3D patches by a Conv3d, N blocks of rope
//! self-attention over all patches (3-axis rope: frame, row, column, from 0 on each axis),
//! cross-attention to the umT5 text states, and a tanh-GELU feed-forward, all modulated by
//! the timestep; then a modulated output norm and projection back to patches.
//!
//! Covers Wan 2.1 T2V (1.3B, 14B), I2V-14B (CLIP image tokens through `img_emb`, attended
//! beside the text), FLF2V-14B (the image branch's position table), Wan 2.2 T2V / I2V-14B
//! (the caller concatenates mask and condition channels into the latent) and TI2V-5B
//! (48 channels; per-frame timesteps via [`Wan::forward_per_frame`]) and Wan 2.1 VACE (a
//! control branch whose hints join the main stream, `vace.rs`; without a control input a
//! VACE file runs as its base model). Not done: batches larger than one.
//!
//! Both checkpoint layouts load ([`WanLayout`]). A latent not a whole number of patches is
//! zero-padded and the output cropped, as upstream.

mod blocks;
mod config;
mod embed;
mod names;
mod patch;
mod vace;

pub use config::{
    axes_dims, heads_hint, WanConfig, WanHints, WanImageBranch, WanLayout, WanVace, NORM_EPS,
    RELEASED_HEAD_DIM, ROPE_THETA,
};
pub(crate) use names::other_layout_name;
pub use vace::VaceContext;

use crate::ggml::Tensor;
use crate::nn;
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use blocks::{Block, BlockInputs, Rope};
use embed::{Head, ImageEmbedding, TextEmbedding, TimeEmbedding};
use vace::VaceBranch;

/// Cut-group prefix of this model's graph-cut marks.
pub const CUT_PREFIX: &str = "wan";

/// One call's inputs (shapes in ggml order, batch 1).
pub struct WanInputs<'g> {
    /// The noisy latent [W, H, T, C_in] (PyTorch [C, T, H, W]).
    pub latent: Tensor<'g>,
    /// Text-encoder states [text_dim, L].
    pub text: Tensor<'g>,
    /// CLIP-vision features [image in_dim, n] for models with an image branch (I2V: 257
    /// tokens; FLF2V: both images, 514).
    pub image: Option<Tensor<'g>>,
    /// The model's timestep, in [0, 1000] as diffusers passes it (see
    /// [`Wan::forward_per_frame`] for one per frame).
    pub timestep: f32,
    /// VACE models: the control video and the hints' strength.
    pub vace: Option<VaceContext<'g>>,
}

/// A Wan transformer: weight handles and sizes.
#[derive(Clone, Debug)]
pub struct Wan {
    config: WanConfig,
    /// The Conv3d kernel as stored, [pw, ph, pt, C·D], used as the matrix [pw·ph·pt·C, D].
    patch_weight: Param,
    patch_bias: Param,
    time: TimeEmbedding,
    text: TextEmbedding,
    image: Option<ImageEmbedding>,
    blocks: Vec<Block>,
    vace: Option<VaceBranch>,
    head: Head,
}

impl Wan {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: WanConfig) -> Result<Self, RunnerError> {
        let c = &config;
        let [pt, ph, pw] = c.patch;
        let pe = wb.pp("patch_embedding");
        let blocks = (0..c.layers)
            .map(|i| Block::new(&wb.pp("blocks").pp(i), c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            patch_weight: pe.get(
                "weight",
                [pw, ph, pt, c.in_channels * c.dim],
                Storage::Float,
            )?,
            patch_bias: pe.get("bias", [c.dim, 1, 1, 1], Storage::F32)?,
            time: TimeEmbedding::new(wb, c)?,
            text: TextEmbedding::new(wb, c)?,
            image: c
                .image
                .map(|i| ImageEmbedding::new(wb, c, i.in_dim, i.pos_len))
                .transpose()?,
            blocks,
            vace: c
                .vace
                .as_ref()
                .map(|v| VaceBranch::new(wb, c, v))
                .transpose()?,
            head: Head::new(wb, c)?,
            config,
        })
    }

    pub fn config(&self) -> &WanConfig {
        &self.config
    }

    fn check(
        &self,
        inputs: &WanInputs<'_>,
        frame_timesteps: Option<&[f32]>,
        frames: usize,
    ) -> Result<(), RunnerError> {
        let c = &self.config;
        let bad = |what: String| Err(RunnerError::Internal(format!("Wan inputs: {what}")));
        let [w, h, t, ch] = inputs.latent.ne();
        if ch != c.in_channels || w == 0 || h == 0 || t == 0 {
            return bad(format!(
                "latent {:?} (W, H, T, C); the model takes {} channels",
                inputs.latent.ne(),
                c.in_channels
            ));
        }
        let [td, l, b, b2] = inputs.text.ne();
        if td != c.text_dim || l == 0 || b != 1 || b2 != 1 {
            return bad(format!(
                "text {:?}; the model takes [{}, L] states",
                inputs.text.ne(),
                c.text_dim
            ));
        }
        match (c.image, inputs.image) {
            (None, None) => {}
            (None, Some(_)) => {
                return bad("image features for a model without an image branch".into())
            }
            (Some(_), None) => {
                return bad(
                    "this model has an image branch (I2V): CLIP image features are required".into(),
                )
            }
            (Some(i), Some(img)) => {
                let [id, n, b, b2] = img.ne();
                let too_long = i.pos_len.is_some_and(|p| n > p);
                if id != i.in_dim || n == 0 || b != 1 || b2 != 1 || too_long {
                    return bad(format!(
                        "image features {:?}; the model takes [{}, n ≤ {:?}]",
                        img.ne(),
                        i.in_dim,
                        i.pos_len
                    ));
                }
            }
        }
        match (&c.vace, &inputs.vace) {
            (None, Some(_)) => return bad("a control video for a model without VACE blocks".into()),
            (Some(v), Some(ctx)) if ctx.context.ne() != [w, h, t, v.in_channels] => {
                return bad(format!(
                    "VACE control {:?}; the model takes [{w}, {h}, {t}, {}] (the latent's size)",
                    ctx.context.ne(),
                    v.in_channels
                ))
            }
            _ => {}
        }
        if let Some(ts) = frame_timesteps {
            if ts.len() != frames {
                return bad(format!(
                    "{} frame timesteps for {frames} patch frames",
                    ts.len()
                ));
            }
        }
        Ok(())
    }

    /// The model output (flow velocity) [W, H, T, C_out].
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &WanInputs<'g>,
    ) -> Result<Tensor<'g>, RunnerError> {
        self.forward_impl(g, inputs, None)
    }

    /// Like [`Wan::forward`] with one timestep per patch frame (⌈T / pt⌉ of them) instead of
    /// `inputs.timestep`: Wan 2.2 TI2V gives its conditioning frame 0.
    pub fn forward_per_frame<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &WanInputs<'g>,
        frame_timesteps: &[f32],
    ) -> Result<Tensor<'g>, RunnerError> {
        self.forward_impl(g, inputs, Some(frame_timesteps))
    }

    fn forward_impl<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &WanInputs<'g>,
        frame_timesteps: Option<&[f32]>,
    ) -> Result<Tensor<'g>, RunnerError> {
        let c = &self.config;
        let [w, h, t, _] = inputs.latent.ne();
        let [pt, ph, pw] = c.patch;
        let frames = t.div_ceil(pt);
        self.check(inputs, frame_timesteps, frames)?;

        let x = patch::pad(g, inputs.latent, c.patch);
        let grid = patch::grid(x.ne(), c.patch);
        let tokens = patch::patchify(g, x, c.patch);
        let n = tokens.ne()[1];
        let kernel = g.reshape(
            g.param(self.patch_weight),
            [pw * ph * pt * c.in_channels, c.dim, 1, 1],
        );
        let x = g.linear(kernel, tokens, Some(g.param(self.patch_bias)));

        // Timesteps: one group of tokens, or one per patch frame.
        let ts: Vec<f32> = match frame_timesteps {
            Some(ts) => ts.to_vec(),
            None => vec![inputs.timestep],
        };
        let freqs = nn::timestep_embedding(&ts, c.freq_dim, true, 0.0, 1.0, 10_000.0);
        let freqs = g.input_f32("wan.t_freq", [c.freq_dim, ts.len(), 1, 1], freqs);
        let (temb, time_proj) = self.time.forward(g, freqs);

        let prelude = format!("{CUT_PREFIX}.prelude");
        let mut x = g.cut(&prelude, "x", x);
        let text = g.cut(&prelude, "text", self.text.forward(g, inputs.text));
        let image = match (&self.image, inputs.image) {
            (Some(e), Some(img)) => Some(g.cut(&prelude, "image", e.forward(g, img))),
            _ => None,
        };

        let [_, fh, fw] = grid;
        let positions: Vec<Vec<f32>> = (0..n)
            .map(|i| {
                vec![
                    (i / (fh * fw)) as f32,
                    (i / fw % fh) as f32,
                    (i % fw) as f32,
                ]
            })
            .collect();
        let (cos, sin) = nn::rope_table(&positions, &c.axes_dims, ROPE_THETA);
        let ne = [c.head_dim / 2, 1, n, 1];
        let rope = Rope {
            cos: g.input_f32("wan.rope_cos", ne, cos),
            sin: g.input_f32("wan.rope_sin", ne, sin),
        };

        let block_inputs = BlockInputs {
            time_proj,
            rope,
            text,
            image,
        };
        // VACE: the control stream and its strength, when the call has a control video.
        let mut control = match (&self.vace, &c.vace, &inputs.vace) {
            (Some(branch), Some(v), Some(ctx)) => {
                let ctl = branch.embed(g, ctx, x, c, v);
                Some((branch, v, g.cut(&prelude, "vace", ctl), ctx.strength))
            }
            _ => None,
        };
        for (i, block) in self.blocks.iter().enumerate() {
            let mut xi = block.forward(g, x, &block_inputs, c);
            let group = format!("{CUT_PREFIX}.blocks.{i}");
            if let Some((branch, v, ctl, strength)) = control.as_mut() {
                if let Some(k) = v.layers.iter().position(|&l| l == i) {
                    let (next, hint) = branch.block(g, k, *ctl, &block_inputs, c, *strength);
                    xi = g.add(xi, hint);
                    *ctl = g.cut(&group, "vace", next);
                }
            }
            x = g.cut(&group, "x", xi);
        }
        let y = self.head.forward(g, x, temb);
        let y = patch::unpatchify(g, y, c.patch, grid);
        Ok(patch::crop(g, y, [w, h, t]))
    }
}
