//! The Qwen2.5-VL vision tower (transformers `Qwen2_5_VisionTransformerPretrainedModel`) for one
//! image as a ggml graph.
//!
//! - patch embedding: the bias-free Conv3d (kernel = stride = [T, P, P]) is a matmul over the
//!   patch vector; no learned positions;
//! - blocks: `x += proj(attn(rope(q), rope(k), v))` on `RMSNorm(x)`, then
//!   `x += down(silu(gate(h)) · up(h))` on `h = RMSNorm(x)`; 2-D rope (rotate-half layout), the
//!   first quarter of pairs turning with the patch row and the second with the column; blocks
//!   outside `fullatt_block_indexes` attend within their window only (see `window.rs`);
//! - merger: RMSNorm per patch, each merge window's merge² patches concatenated, `mlp.0`,
//!   exact GELU, `mlp.2`.
//!
//! Tokens stay in spatial-merge-window order (the processor's patch order) throughout, so the
//! merged tokens come out in raster order of the merge windows, as transformers returns them.

use crate::ggml::Tensor;
use crate::models::te::qwen3_vl_vision::{merge_order_coords, VisionError};
use crate::nn::{apply_rope, attention, rope_table, AttentionMask, Linear, RmsNorm, RopeLayout};
use crate::runner::{GraphCtx, Runner, RunnerError, WeightBuilder};
use crate::tensor::HostTensor;

use super::config::Qwen25VlVisionConfig;
use super::window::{window_ids, window_mask};

#[derive(Clone, Copy, Debug)]
struct Block {
    norm1: RmsNorm,
    qkv: Linear,
    proj: Linear,
    norm2: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    /// Full attention over the image instead of within windows.
    full: bool,
}

impl Block {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &Qwen25VlVisionConfig,
        full: bool,
    ) -> Result<Self, RunnerError> {
        let (d, ffn) = (c.hidden, c.intermediate);
        let attn = wb.pp("attn");
        let mlp = wb.pp("mlp");
        Ok(Self {
            norm1: RmsNorm::new(&wb.pp("norm1"), d, c.eps)?,
            qkv: Linear::new(&attn.pp("qkv"), d, 3 * d, true)?,
            proj: Linear::new(&attn.pp("proj"), d, d, true)?,
            norm2: RmsNorm::new(&wb.pp("norm2"), d, c.eps)?,
            gate: Linear::new(&mlp.pp("gate_proj"), d, ffn, true)?,
            up: Linear::new(&mlp.pp("up_proj"), d, ffn, true)?,
            down: Linear::new(&mlp.pp("down_proj"), ffn, d, true)?,
            full,
        })
    }

    /// x: [hidden, n]; cos/sin: rope tables [head_dim/2, 1, n]; `window` masks the windowed
    /// blocks (absent when the image is one window).
    fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        rope: (Tensor<'g>, Tensor<'g>),
        window: Option<&AttentionMask<'g>>,
        heads: usize,
    ) -> Tensor<'g> {
        let [d, n, ..] = x.ne();
        let hd = d / heads;
        let h = self.norm1.forward(g, x);
        let qkv = self.qkv.forward(g, h); // [3·d, n]: (q | k | v) × heads × head_dim
        let es = 4; // f32 bytes
        let part = |j: usize| {
            g.view(
                qkv,
                [hd, heads, n, 1],
                [hd * es, 3 * d * es, 3 * d * n * es],
                j * d * es,
            )
        };
        let (cos, sin) = rope;
        let q = apply_rope(g, part(0), cos, sin, RopeLayout::Halves);
        let k = apply_rope(g, part(1), cos, sin, RopeLayout::Halves);
        let v = g.cont(part(2));
        let flat = |t: Tensor<'g>| g.reshape(t, [d, n, 1, 1]);
        let mask = if self.full { None } else { window };
        let a = attention(g, flat(q), flat(k), flat(v), heads, mask);
        let x = g.add(x, self.proj.forward(g, g.reshape(a, [d, n, 1, 1])));

        let h = self.norm2.forward(g, x);
        let act = g.mul(g.silu(self.gate.forward(g, h)), self.up.forward(g, h));
        g.add(x, self.down.forward(g, act))
    }
}

/// transformers `Qwen2_5_VLPatchMerger`.
#[derive(Clone, Copy, Debug)]
struct Merger {
    ln_q: RmsNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Merger {
    fn new(wb: &WeightBuilder<'_, '_>, c: &Qwen25VlVisionConfig) -> Result<Self, RunnerError> {
        let merged = c.hidden * c.merge_size * c.merge_size;
        let mlp = wb.pp("mlp");
        Ok(Self {
            ln_q: RmsNorm::new(&wb.pp("ln_q"), c.hidden, c.eps)?,
            fc1: Linear::new(&mlp.pp(0), merged, merged, true)?,
            fc2: Linear::new(&mlp.pp(2), merged, c.out_hidden, true)?,
        })
    }

    /// x: [hidden, n] in merge-window order → [out_hidden, n / units].
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, units: usize) -> Tensor<'g> {
        let [hidden, n, ..] = x.ne();
        let x = g.reshape(
            g.cont(self.ln_q.forward(g, x)),
            [hidden * units, n / units, 1, 1],
        );
        self.fc2.forward(g, g.gelu_erf(self.fc1.forward(g, x)))
    }
}

/// transformers `Qwen2_5_VisionTransformerPretrainedModel` for single images.
pub struct Qwen25VlVision {
    config: Qwen25VlVisionConfig,
    patch: Linear,
    blocks: Vec<Block>,
    merger: Merger,
}

impl Qwen25VlVision {
    /// Declares the weights under transformers names relative to `visual.` (see
    /// `Qwen25VlVisionSource`).
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: Qwen25VlVisionConfig,
    ) -> Result<Self, RunnerError> {
        let c = &config;
        let patch = Linear::new(
            &wb.pp("patch_embed").pp("proj"),
            c.patch_dim(),
            c.hidden,
            false,
        )?;
        let blocks = (0..c.depth)
            .map(|i| {
                let full = c.fullatt_block_indexes.contains(&i);
                Block::new(&wb.pp("blocks").pp(i), c, full)
            })
            .collect::<Result<Vec<_>, RunnerError>>()?;
        let merger = Merger::new(&wb.pp("merger"), c)?;
        Ok(Self {
            config,
            patch,
            blocks,
            merger,
        })
    }

    pub fn config(&self) -> &Qwen25VlVisionConfig {
        &self.config
    }

    /// Checks that `n_values` patch values form a `grid_h`×`grid_w` grid this tower can run.
    pub fn check_input(
        &self,
        n_values: usize,
        grid_h: usize,
        grid_w: usize,
    ) -> Result<(), VisionError> {
        let c = &self.config;
        crate::models::te::qwen3_vl_vision::check_patch_grid(
            n_values,
            grid_h,
            grid_w,
            c.patch_dim(),
            c.merge_size,
        )
    }

    /// patches: [3·T·P², grid_h·grid_w] in merge-window order (the processor's `pixel_values`
    /// of one image, grid_t = 1) → merged tokens [out_hidden, grid_h·grid_w / merge²] in raster
    /// order of the merge windows. `grid_h`, `grid_w` must be multiples of the merge size (see
    /// [`Qwen25VlVision::check_input`]).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        patches: Tensor<'g>,
        grid_h: usize,
        grid_w: usize,
    ) -> Tensor<'g> {
        let c = &self.config;
        let n = grid_h * grid_w;
        let hd = c.head_dim();
        let mut x = self.patch.forward(g, patches);

        // 2-D rope: (row, column) per token, each axis over half of the rotated pairs.
        let positions: Vec<Vec<f32>> = merge_order_coords(grid_h, grid_w, c.merge_size)
            .into_iter()
            .map(|(r, col)| vec![r as f32, col as f32])
            .collect();
        let (cos, sin) = rope_table(&positions, &[hd / 2, hd / 2], c.rope_theta);
        let cos = g.input_f32("qwen25vl_vision.rope_cos", [hd / 2, 1, n, 1], cos);
        let sin = g.input_f32("qwen25vl_vision.rope_sin", [hd / 2, 1, n, 1], sin);

        let ids = window_ids(grid_h, grid_w, c.merge_size, c.window_units());
        let window = window_mask(&ids)
            .map(|m| AttentionMask(g.input_f32("qwen25vl_vision.window_mask", [n, n, 1, 1], m)));

        for (i, b) in self.blocks.iter().enumerate() {
            x = b.forward(g, x, (cos, sin), window.as_ref(), c.heads);
            x = g.cut(&format!("qwen25vl_vision.blocks.{i}"), "x", x);
        }
        self.merger.forward(g, x, c.merge_size * c.merge_size)
    }
}

/// Runs the tower on one image's patches (`patches`: [grid_h·grid_w, 3·T·P²] row-major, as
/// `patchify` makes them) after checking their count against the grid. Returns the merged
/// tokens [out_hidden, grid_h·grid_w / merge²] (ggml order).
pub fn encode_image(
    runner: &Runner,
    model: &Qwen25VlVision,
    patches: &[f32],
    grid_h: usize,
    grid_w: usize,
) -> Result<HostTensor, VisionError> {
    model.check_input(patches.len(), grid_h, grid_w)?;
    let patch_dim = model.config().patch_dim();
    let n = grid_h * grid_w;
    let mut out = runner.compute(|g| {
        let p = g.input_f32(
            "qwen25vl_vision.patches",
            [patch_dim, n, 1, 1],
            patches.to_vec(),
        );
        vec![model.forward(g, p, grid_h, grid_w)]
    })?;
    out.pop()
        .ok_or_else(|| RunnerError::Internal("vision graph returned no output".into()).into())
}
