//! The Qwen3-VL vision tower (transformers `Qwen3VLVisionModel`) for one image as a ggml graph.
//!
//! - patch embedding: the Conv3d (kernel = stride = [T, P, P]) is a matmul over the patch vector;
//! - learned positions: the √N×√N table resampled bilinearly (align corners) to the image's grid,
//!   as four weighted row gathers whose indices/weights are built on the host;
//! - blocks: `x += proj(attn(rope(q), rope(k), v))` on `LayerNorm(x)` with full attention over the
//!   image, `x += fc2(gelu_tanh(fc1(LayerNorm(x))))`; 2-D rope (rotate-half layout) whose first
//!   quarter of pairs rotate with the patch row and the second with the column;
//! - merger: LayerNorm per patch, then each merge window's merge² patches concatenated, fc1,
//!   exact GELU, fc2; deepstack mergers concatenate first and normalise the concatenation.
//!
//! Tokens are in spatial-merge-window order throughout (the processor's patch order).

use crate::ggml::Tensor;
use crate::nn::{apply_rope, attention, gelu_tanh, rope_table, LayerNorm, Linear, RopeLayout};
use crate::runner::{GraphCtx, Param, Runner, RunnerError, Storage, WeightBuilder};
use crate::tensor::HostTensor;

use super::config::Qwen3VlVisionConfig;
use super::error::VisionError;
use super::source::PATCH_WEIGHT;

#[derive(Clone, Copy, Debug)]
struct Block {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// transformers `Qwen3VLVisionPatchMerger`.
#[derive(Clone, Copy, Debug)]
struct Merger {
    norm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    /// Normalise after concatenating the window (deepstack) instead of per patch.
    postshuffle: bool,
}

impl Merger {
    fn new(
        wb: &WeightBuilder<'_, '_>,
        c: &Qwen3VlVisionConfig,
        postshuffle: bool,
    ) -> Result<Self, RunnerError> {
        let merged = c.hidden * c.merge_size * c.merge_size;
        let norm_dim = if postshuffle { merged } else { c.hidden };
        Ok(Self {
            norm: LayerNorm::new(&wb.pp("norm"), norm_dim, c.eps, true)?,
            fc1: Linear::new(&wb.pp("linear_fc1"), merged, merged, true)?,
            fc2: Linear::new(&wb.pp("linear_fc2"), merged, c.out_hidden, true)?,
            postshuffle,
        })
    }

    /// x: [hidden, n] in merge-window order → [out_hidden, n / merge²].
    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, window: usize) -> Tensor<'g> {
        let [hidden, n, ..] = x.ne();
        let merged = [hidden * window, n / window, 1, 1];
        let x = if self.postshuffle {
            self.norm.forward(g, g.reshape(g.cont(x), merged))
        } else {
            g.reshape(g.cont(self.norm.forward(g, x)), merged)
        };
        let h = g.gelu_erf(self.fc1.forward(g, x));
        self.fc2.forward(g, h)
    }
}

/// The tower's outputs for one image (graph tensors).
pub struct VisionOutput<'g> {
    /// Merged tokens [out_hidden, n / merge²].
    pub embeds: Tensor<'g>,
    /// One [out_hidden, n / merge²] per deepstack layer, in `deepstack_indexes` order.
    pub deepstack: Vec<Tensor<'g>>,
}

/// Checks that `n_values` patch values of `patch_dim` each form a `grid_h`×`grid_w` grid whose
/// sides are multiples of `merge` (shared by the Qwen2.5-VL and Qwen3-VL towers).
pub fn check_patch_grid(
    n_values: usize,
    grid_h: usize,
    grid_w: usize,
    patch_dim: usize,
    merge: usize,
) -> Result<(), VisionError> {
    let bad = || VisionError::PatchCount {
        got: n_values,
        grid_h,
        grid_w,
        patch_dim,
    };
    if grid_h == 0 || grid_w == 0 || !grid_h.is_multiple_of(merge) || !grid_w.is_multiple_of(merge)
    {
        return Err(bad());
    }
    let want = grid_h
        .checked_mul(grid_w)
        .and_then(|n| n.checked_mul(patch_dim))
        .ok_or_else(bad)?;
    if want != n_values {
        return Err(bad());
    }
    Ok(())
}

/// transformers `Qwen3VLVisionModel` for single images.
pub struct Qwen3VlVision {
    config: Qwen3VlVisionConfig,
    patch: Linear,
    pos_embed: Param,
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
}

/// (row, column) of each patch of a `gh`×`gw` grid, in merge-window order.
pub fn merge_order_coords(gh: usize, gw: usize, merge: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(gh * gw);
    for br in 0..gh / merge {
        for bc in 0..gw / merge {
            for ir in 0..merge {
                for ic in 0..merge {
                    out.push((br * merge + ir, bc * merge + ic));
                }
            }
        }
    }
    out
}

/// The two bilinear taps (align corners, clamped) and weights of target index `i` on an axis of
/// `size` samples over a table side of `side`, computed in f32 as transformers does.
fn axis_taps(i: usize, size: usize, side: usize) -> [(usize, f32); 2] {
    let src = i as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32;
    let floor = src.floor();
    let base = floor as usize;
    [0usize, 1].map(|o| {
        let tap = (base + o).min(side - 1);
        let w = (1.0 - (src - floor - o as f32).abs()).max(0.0);
        (tap, w)
    })
}

/// Gather indices and weights of the four bilinear taps for every patch (merge-window order):
/// `(indices[k][p], weights[k][p])`, taps k = (row tap, column tap) row-major.
pub fn position_taps(
    gh: usize,
    gw: usize,
    merge: usize,
    side: usize,
) -> ([Vec<i32>; 4], [Vec<f32>; 4]) {
    let coords = merge_order_coords(gh, gw, merge);
    let mut idx: [Vec<i32>; 4] = Default::default();
    let mut wts: [Vec<f32>; 4] = Default::default();
    for (r, c) in coords {
        let rt = axis_taps(r, gh, side);
        let ct = axis_taps(c, gw, side);
        for (a, &(rtap, rw)) in rt.iter().enumerate() {
            for (b, &(ctap, cw)) in ct.iter().enumerate() {
                idx[a * 2 + b].push((rtap * side + ctap) as i32);
                wts[a * 2 + b].push(rw * cw);
            }
        }
    }
    (idx, wts)
}

impl Qwen3VlVision {
    /// Declares the weights under transformers names relative to `visual.` (see
    /// `Qwen3VlVisionSource`).
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        config: Qwen3VlVisionConfig,
    ) -> Result<Self, RunnerError> {
        let c = &config;
        let d = c.hidden;
        let patch_wb = wb.pp("patch_embed").pp("proj");
        debug_assert_eq!(patch_wb.key("weight"), wb.key(PATCH_WEIGHT));
        let patch = Linear::new(&patch_wb, c.patch_dim(), d, true)?;
        let pos_embed =
            wb.pp("pos_embed")
                .get("weight", [d, c.num_position_embeddings, 1, 1], Storage::F32)?;
        let blocks = (0..c.depth)
            .map(|i| {
                let b = wb.pp("blocks").pp(i);
                Ok(Block {
                    norm1: LayerNorm::new(&b.pp("norm1"), d, c.eps, true)?,
                    qkv: Linear::new(&b.pp("attn").pp("qkv"), d, 3 * d, true)?,
                    proj: Linear::new(&b.pp("attn").pp("proj"), d, d, true)?,
                    norm2: LayerNorm::new(&b.pp("norm2"), d, c.eps, true)?,
                    fc1: Linear::new(&b.pp("mlp").pp("linear_fc1"), d, c.intermediate, true)?,
                    fc2: Linear::new(&b.pp("mlp").pp("linear_fc2"), c.intermediate, d, true)?,
                })
            })
            .collect::<Result<Vec<_>, RunnerError>>()?;
        let merger = Merger::new(&wb.pp("merger"), c, false)?;
        let deepstack = (0..c.deepstack_indexes.len())
            .map(|j| Merger::new(&wb.pp("deepstack_merger_list").pp(j), c, true))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            config,
            patch,
            pos_embed,
            blocks,
            merger,
            deepstack,
        })
    }

    pub fn config(&self) -> &Qwen3VlVisionConfig {
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
        check_patch_grid(n_values, grid_h, grid_w, c.patch_dim(), c.merge_size)
    }

    /// patches: [3·T·P², grid_h·grid_w] in merge-window order (the processor's `pixel_values`
    /// of one image, grid_t = 1). `grid_h`, `grid_w` must be multiples of the merge size (see
    /// [`Qwen3VlVision::check_input`]).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        patches: Tensor<'g>,
        grid_h: usize,
        grid_w: usize,
    ) -> VisionOutput<'g> {
        let c = &self.config;
        let n = grid_h * grid_w;
        let (d, heads, hd) = (c.hidden, c.heads, c.head_dim());
        let window = c.merge_size * c.merge_size;

        let mut x = self.patch.forward(g, patches);
        // Learned positions, bilinearly resampled.
        let (idx, wts) = position_taps(grid_h, grid_w, c.merge_size, c.grid_side());
        let table = g.param(self.pos_embed);
        for (k, (i, w)) in idx.into_iter().zip(wts).enumerate() {
            let i = g.input_i32(&format!("qwen3vl_vision.pos_idx{k}"), [n, 1, 1, 1], i);
            let w = g.input_f32(&format!("qwen3vl_vision.pos_w{k}"), [1, n, 1, 1], w);
            x = g.add(x, g.mul(g.get_rows(table, i), w));
        }

        // 2-D rope: (row, column) per token, each axis over half of the rotated pairs.
        let positions: Vec<Vec<f32>> = merge_order_coords(grid_h, grid_w, c.merge_size)
            .into_iter()
            .map(|(r, col)| vec![r as f32, col as f32])
            .collect();
        let (cos, sin) = rope_table(&positions, &[hd / 2, hd / 2], c.rope_theta);
        let cos = g.input_f32("qwen3vl_vision.rope_cos", [hd / 2, 1, n, 1], cos);
        let sin = g.input_f32("qwen3vl_vision.rope_sin", [hd / 2, 1, n, 1], sin);

        let mut deepstack = Vec::with_capacity(self.deepstack.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let h = b.norm1.forward(g, x);
            let qkv = b.qkv.forward(g, h); // [3·d, n]: (q | k | v) × heads × head_dim
            let es = 4;
            let part = |j: usize| {
                g.view(
                    qkv,
                    [hd, heads, n, 1],
                    [hd * es, 3 * d * es, 3 * d * n * es],
                    j * d * es,
                )
            };
            let q = apply_rope(g, part(0), cos, sin, RopeLayout::Halves);
            let k = apply_rope(g, part(1), cos, sin, RopeLayout::Halves);
            let v = g.cont(part(2));
            let flat = |t: Tensor<'g>| g.reshape(t, [d, n, 1, 1]);
            let a = attention(g, flat(q), flat(k), flat(v), heads, None);
            x = g.add(x, b.proj.forward(g, g.reshape(a, [d, n, 1, 1])));
            let h = b.norm2.forward(g, x);
            x = g.add(x, b.fc2.forward(g, gelu_tanh(g, b.fc1.forward(g, h))));
            x = g.cut(&format!("qwen3vl_vision.blocks.{i}"), "x", x);
            if let Some(j) = c.deepstack_indexes.iter().position(|&l| l == i) {
                deepstack.push(self.deepstack[j].forward(g, x, window));
            }
        }
        let embeds = self.merger.forward(g, x, window);
        VisionOutput { embeds, deepstack }
    }
}

/// Host-side results of [`encode_image`].
#[derive(Clone, Debug)]
pub struct VisionHostOutput {
    /// [out_hidden, n / merge²].
    pub embeds: HostTensor,
    /// One per deepstack layer, same shape.
    pub deepstack: Vec<HostTensor>,
}

/// Runs the tower on one image's patches (`patches`: [grid_h·grid_w, 3·T·P²] row-major, as
/// `patchify` makes them) after checking their count against the grid.
pub fn encode_image(
    runner: &Runner,
    model: &Qwen3VlVision,
    patches: &[f32],
    grid_h: usize,
    grid_w: usize,
) -> Result<VisionHostOutput, VisionError> {
    model.check_input(patches.len(), grid_h, grid_w)?;
    let patch_dim = model.config().patch_dim();
    let n = grid_h * grid_w;
    let mut out = runner.compute(|g| {
        let p = g.input_f32(
            "qwen3vl_vision.patches",
            [patch_dim, n, 1, 1],
            patches.to_vec(),
        );
        let o = model.forward(g, p, grid_h, grid_w);
        let mut v = vec![o.embeds];
        v.extend(o.deepstack);
        v
    })?;
    if out.is_empty() {
        return Err(RunnerError::Internal("vision graph returned no output".into()).into());
    }
    let embeds = out.remove(0);
    Ok(VisionHostOutput {
        embeds,
        deepstack: out,
    })
}
