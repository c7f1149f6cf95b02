//! Wan VACE's control branch (diffusers `WanVACETransformer3DModel`, upstream
//! `VaceWanAttentionBlock`): the control video [W, H, T, 96] is cut into patches by its own
//! Conv3d; VACE block 0 projects those tokens and adds the main stream's patch tokens; every
//! VACE block is a Wan block on the control stream that also emits a hint through its output
//! projection. Hint k, times the strength, is added to the main stream after main block
//! `layers[k]`.

use crate::ggml::Tensor;
use crate::nn::Linear;
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::blocks::{Block, BlockInputs};
use super::config::{WanConfig, WanVace};
use super::patch;

/// The control input of one call.
#[derive(Clone, Copy)]
pub struct VaceContext<'g> {
    /// The control latent [W, H, T, C_vace] (PyTorch [C, T, H, W]), the size of the noisy latent.
    pub context: Tensor<'g>,
    /// `--vace-strength`: the factor of every hint (diffusers' `control_hidden_states_scale`).
    pub strength: f32,
}

#[derive(Clone, Debug)]
struct VaceBlock {
    block: Block,
    /// Block 0 only: projects the control tokens before the main tokens are added.
    proj_in: Option<Linear>,
    proj_out: Linear,
}

/// The VACE weights: patch embedding and blocks.
#[derive(Clone, Debug)]
pub(super) struct VaceBranch {
    /// The Conv3d kernel as stored, [pw, ph, pt, C_vace·D].
    patch_weight: Param,
    patch_bias: Param,
    blocks: Vec<VaceBlock>,
}

impl VaceBranch {
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &WanConfig,
        v: &WanVace,
    ) -> Result<Self, RunnerError> {
        let n = c.layout.names();
        let [pt, ph, pw] = c.patch;
        let pe = wb.pp("vace_patch_embedding");
        let blocks = (0..v.layers.len())
            .map(|k| {
                let b = wb.pp("vace_blocks").pp(k);
                Ok(VaceBlock {
                    block: Block::new(&b, c)?,
                    proj_in: (k == 0)
                        .then(|| Linear::new(&b.pp(n.vace_in), c.dim, c.dim, true))
                        .transpose()?,
                    proj_out: Linear::new(&b.pp(n.vace_out), c.dim, c.dim, true)?,
                })
            })
            .collect::<Result<Vec<_>, RunnerError>>()?;
        Ok(Self {
            patch_weight: pe.get(
                "weight",
                [pw, ph, pt, v.in_channels * c.dim],
                Storage::Float,
            )?,
            patch_bias: pe.get("bias", [c.dim, 1, 1, 1], Storage::F32)?,
            blocks,
        })
    }

    /// The control stream entering VACE block 0: the patched control video through the
    /// patch embedding and block 0's input projection, plus the main patch tokens `x` [D, N].
    pub fn embed<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        ctx: &VaceContext<'g>,
        x: Tensor<'g>,
        c: &WanConfig,
        v: &WanVace,
    ) -> Tensor<'g> {
        let [pt, ph, pw] = c.patch;
        let tokens = patch::patchify(g, patch::pad(g, ctx.context, c.patch), c.patch);
        let kernel = g.reshape(
            g.param(self.patch_weight),
            [pw * ph * pt * v.in_channels, c.dim, 1, 1],
        );
        let h = g.linear(kernel, tokens, Some(g.param(self.patch_bias)));
        match &self.blocks[0].proj_in {
            Some(p) => g.add(p.forward(g, h), x),
            None => g.add(h, x),
        }
    }

    /// VACE block `k` on the control stream `ctl` [D, N]: the next control stream and the hint
    /// (already scaled by `strength`).
    pub fn block<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        k: usize,
        ctl: Tensor<'g>,
        inputs: &BlockInputs<'g>,
        c: &WanConfig,
        strength: f32,
    ) -> (Tensor<'g>, Tensor<'g>) {
        let b = &self.blocks[k];
        let ctl = b.block.forward(g, ctl, inputs, c);
        let hint = b.proj_out.forward(g, ctl);
        let hint = if strength == 1.0 {
            hint
        } else {
            g.scale(hint, strength)
        };
        (ctl, hint)
    }
}
