//! What a model's `forward` sees while a graph is being built.

use std::cell::RefCell;
use std::ops::Deref;

use super::cache::{CacheStores, NamedCache};
use super::weights::{AdapterTensors, ModelWeights, Param};
use crate::dtype::DType;
use crate::ggml::{AttentionPrecision, Backend, Context, CpuKernels, Graph, Tensor, Then};
use crate::tensor::Ne;

pub(crate) enum InputData {
    F32(Vec<f32>),
    I32(Vec<i32>),
    F16(Vec<f32>),
}

/// A cut mark: the model's suggestion of where the graph may be split (block boundaries).
#[derive(Clone, Debug)]
pub struct CutMark {
    /// The block the cut closes, e.g. "pixart.blocks.7".
    pub group: String,
    /// Which of the block's outputs this is, e.g. "x".
    pub output: String,
}

/// Graph-building context: ggml ops (through `Deref<Target = Context>`), the model's
/// weights, host inputs bound lazily, cut marks and the named cache.
///
/// Models take it as `g: &'g GraphCtx<'g>` so that every tensor they make lives for `'g`.
pub struct GraphCtx<'g> {
    ctx: &'g Context,
    weights: Option<&'g ModelWeights>,
    cache: &'g NamedCache,
    pub(crate) inputs: RefCell<Vec<(Tensor<'g>, String, InputData)>>,
    pub(crate) cuts: RefCell<Vec<(Tensor<'g>, CutMark)>>,
    /// Destinations of this graph's cache stores.
    stores: &'g CacheStores,
    flash_attn: bool,
    /// `--fa` with weights whose products already round (see [`Self::attention_precision`]).
    bf16_attention: bool,
    /// The device the graph runs on, asked whether it has a kernel for an op.
    backend: Option<&'g Backend>,
    /// The blocked CPU kernels, when the graph runs on the CPU backend and may use them.
    cpu_kernels: Option<CpuKernels>,
    /// The graph being built, when the runner made it first: cache stores are scheduled
    /// into it as they are registered, so they run (and free their sources) in their own
    /// block's segment instead of at the graph's end.
    graph: Option<&'g Graph<'g>>,
}

impl<'g> Deref for GraphCtx<'g> {
    type Target = Context;
    fn deref(&self) -> &Context {
        self.ctx
    }
}

impl<'g> GraphCtx<'g> {
    pub(crate) fn new(
        ctx: &'g Context,
        weights: Option<&'g ModelWeights>,
        cache: &'g NamedCache,
        stores: &'g CacheStores,
        flash_attn: bool,
    ) -> Self {
        Self {
            ctx,
            weights,
            cache,
            inputs: RefCell::new(Vec::new()),
            cuts: RefCell::new(Vec::new()),
            stores,
            flash_attn,
            bf16_attention: flash_attn && weights.is_some_and(ModelWeights::rounds_products),
            backend: None,
            cpu_kernels: None,
            graph: None,
        }
    }

    /// The device the graph will run on (ops it lacks are built another way where one exists).
    pub(crate) fn with_backend(mut self, backend: &'g Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Whether the graph's device has a kernel for the op that made `t` (true without a device).
    pub fn device_supports(&self, t: Tensor<'g>) -> bool {
        self.backend.is_none_or(|b| b.supports(t))
    }

    /// Lets weight products, f32 convolutions and attention run through the blocked CPU
    /// kernels (`ggml::gemm`) where they take them; only a CPU backend gives the token.
    pub(crate) fn with_cpu_kernels(mut self, kernels: Option<CpuKernels>) -> Self {
        self.cpu_kernels = kernels;
        self
    }

    /// The blocked CPU kernels, when this graph may use them.
    pub fn cpu_kernels(&self) -> Option<CpuKernels> {
        self.cpu_kernels
    }

    /// `x W^T (+ bias)` for a weight `w` [in, out]: the blocked CPU kernels when they are on
    /// and take this product, else ggml's `mul_mat` (and `add`).
    pub fn linear(&self, w: Tensor<'g>, x: Tensor<'g>, bias: Option<Tensor<'g>>) -> Tensor<'g> {
        if let Some(kernels) = self.cpu_kernels {
            if let Some(y) = kernels.linear(self.ctx, w, x, bias) {
                return y;
            }
        }
        let y = self.ctx.mul_mat(w, x);
        match bias {
            Some(b) => self.ctx.add(y, b),
            None => y,
        }
    }

    /// [`Context::conv_2d`], with the blocked CPU kernels for the patch product when they
    /// are on (f32 kernels; others keep ggml's path and its f16 patches).
    pub fn conv_2d(
        &self,
        kernel: Tensor<'g>,
        x: Tensor<'g>,
        stride: (usize, usize),
        pad: (usize, usize),
        dilation: (usize, usize),
        direct: bool,
    ) -> Tensor<'g> {
        // A device binds each operand at an offset aligned to its storage-buffer alignment
        // (≤ 256 bytes); ggml-vulkan's im2col cannot read from inside one and aborts, so a
        // view starting elsewhere (a frame of a causal video convolution) gets its own copy.
        let misaligned = x.is_view() && !x.view_offset().is_multiple_of(256);
        let x = if misaligned && self.backend.is_some_and(|b| !b.is_cpu()) {
            self.ctx.cont(x)
        } else {
            x
        };
        self.ctx
            .conv_2d_on(kernel, x, (stride, pad, dilation), direct, self.cpu_kernels)
    }

    /// [`Context::conv_2d_matrix`], through the blocked CPU kernels when they are on.
    pub fn conv_2d_matrix(
        &self,
        kernel: Tensor<'g>,
        x: Tensor<'g>,
        geometry: crate::ggml::ConvGeometry,
        bias: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        self.ctx
            .conv_2d_matrix(kernel, x, geometry, bias, self.cpu_kernels)
    }

    /// Schedules cache stores into `graph` as they are registered.
    pub(crate) fn with_graph(mut self, graph: &'g Graph<'g>) -> Self {
        self.graph = Some(graph);
        self
    }

    /// The graph context with its full lifetime (for ops whose result must outlive a reborrow).
    pub fn ctx(&self) -> &'g Context {
        self.ctx
    }

    /// A model weight.
    pub fn param(&self, p: Param) -> Tensor<'g> {
        let w = self
            .weights
            .expect("graph built without weights used a weight");
        w.tensor(p)
    }

    /// `x W^T (+ bias)` of `Linear` weight `p`, finished by `then` inside the product (the
    /// blocked CPU kernels), when they take it and the weight has no run-time adapter (which
    /// must be added before the finish); `None` otherwise: the caller builds the ops.
    pub fn linear_then(
        &self,
        p: Param,
        x: Tensor<'g>,
        bias: Option<Param>,
        then: Then<'g>,
    ) -> Option<Tensor<'g>> {
        if self.weights.is_some_and(|w| w.adapter(p).is_some()) {
            return None;
        }
        let bias = bias.map(|b| self.param(b));
        self.cpu_kernels?
            .linear_then(self.ctx, self.param(p), x, bias, then)
    }

    /// `y` (the product of `Linear` weight `p` with `x`) plus the product of its run-time
    /// adapter (LoRA) with `x`, if it has one.
    pub fn adapt_linear(&self, p: Param, x: Tensor<'g>, y: Tensor<'g>) -> Tensor<'g> {
        let Some(adapter) = self.weights.and_then(|w| w.adapter(p)) else {
            return y;
        };
        let (w, x) = match adapter {
            AdapterTensors::LowRank { down, up } => (up, self.linear(down, x, None)),
            AdapterTensors::Full(delta) => (delta, x),
        };
        // The blocked kernels add the product onto `y` as they write it (one pass over the
        // layer's output instead of a product and an `add`).
        if let Some(kernels) = self.cpu_kernels {
            if let Some(sum) = kernels.linear_add(self.ctx, w, x, None, Some(y)) {
                return sum;
            }
        }
        self.ctx.add(y, self.linear(w, x, None))
    }

    /// `y` (the convolution of `x` by `Conv2d` kernel `p`) plus its run-time adapter's: the
    /// down kernel with the layer's stride and padding, then the 1×1 up kernel.
    pub fn adapt_conv(
        &self,
        p: Param,
        x: Tensor<'g>,
        y: Tensor<'g>,
        stride: usize,
        pad: usize,
    ) -> Tensor<'g> {
        let Some(adapter) = self.weights.and_then(|w| w.adapter(p)) else {
            return y;
        };
        let (s, p) = ((stride, stride), (pad, pad));
        let d = match adapter {
            AdapterTensors::LowRank { down, up } => {
                let h = self.conv_2d(down, x, s, p, (1, 1), false);
                self.conv_2d(up, h, (1, 1), (0, 0), (1, 1), false)
            }
            AdapterTensors::Full(delta) => self.conv_2d(delta, x, s, p, (1, 1), false),
        };
        self.ctx.add(y, d)
    }

    /// An f32 input of shape `ne` (ggml order), filled from `data` at compute time.
    pub fn input_f32(&self, name: &str, ne: Ne, data: Vec<f32>) -> Tensor<'g> {
        let t = self
            .ctx
            .new_tensor(DType::F32, ne)
            .set_name(name)
            .mark_input();
        self.inputs
            .borrow_mut()
            .push((t, name.to_string(), InputData::F32(data)));
        t
    }

    /// An f16 input (e.g. flash-attention masks), given as f32 values.
    pub fn input_f16(&self, name: &str, ne: Ne, data: Vec<f32>) -> Tensor<'g> {
        let t = self
            .ctx
            .new_tensor(DType::F16, ne)
            .set_name(name)
            .mark_input();
        self.inputs
            .borrow_mut()
            .push((t, name.to_string(), InputData::F16(data)));
        t
    }

    /// An i32 input (positions, token ids).
    pub fn input_i32(&self, name: &str, ne: Ne, data: Vec<i32>) -> Tensor<'g> {
        let t = self
            .ctx
            .new_tensor(DType::I32, ne)
            .set_name(name)
            .mark_input();
        self.inputs
            .borrow_mut()
            .push((t, name.to_string(), InputData::I32(data)));
        t
    }

    /// Whether attention should use ggml's fused flash-attention kernel (`--fa`).
    pub fn flash_attn(&self) -> bool {
        self.flash_attn
    }

    /// What the blocked CPU attention may round: bf16 operands under `--fa` when this
    /// model's products already round their activations to bf16 or 8 bits (bf16 or quantized
    /// weights), so the attention's rounding is of the same order; exact f32 otherwise (f32
    /// and f16 weights, whose products are exact in f32).
    pub fn attention_precision(&self) -> AttentionPrecision {
        if self.bf16_attention {
            AttentionPrecision::Bf16
        } else {
            AttentionPrecision::Exact
        }
    }

    /// Whether exact (non-`--fa`) attention may use ggml's fused kernel with f32 K/V (online
    /// softmax in f32: no score matrix in memory, same results to f32 rounding). Only the CPU
    /// backend's fused kernel takes f32 K/V.
    pub fn fused_f32_attention(&self) -> bool {
        self.backend.is_some_and(|b| b.is_cpu())
    }

    /// Marks `t` as a possible split point closing block `group` (see the graph-cut planner).
    pub fn cut(&self, group: &str, output: &str, t: Tensor<'g>) -> Tensor<'g> {
        self.cuts.borrow_mut().push((
            t,
            CutMark {
                group: group.to_string(),
                output: output.to_string(),
            },
        ));
        t
    }

    /// A tensor saved in the runner's named cache by an earlier call, usable as a graph leaf.
    pub fn cache_get(&self, name: &str) -> Option<Tensor<'g>> {
        self.cache.get(name)
    }

    /// Saves `t`'s value in the runner's named cache under `name` (the graph copies it into a
    /// cache tensor on the device). Returns the stored copy, which later ops may read.
    pub fn cache_store(&self, name: &str, t: Tensor<'g>) -> Tensor<'g> {
        self.cache_store_as(name, t, t.ty())
    }

    /// Like [`GraphCtx::cache_store`], converting `t` to storage type `ty` on the way (a
    /// float type, or a quantized type whose block size divides `t`'s rows).
    pub fn cache_store_as(&self, name: &str, t: Tensor<'g>, ty: DType) -> Tensor<'g> {
        let stored = self.stores.store(self.ctx, name, t, ty);
        if let Some(graph) = self.graph {
            // Scheduled here, so the copy runs (and frees its source) in its own block's
            // segment instead of at the graph's end.
            graph.expand(stored);
        }
        stored
    }

    /// Whether the runner's named cache holds `name` (entries stored by earlier calls).
    pub fn cache_contains(&self, name: &str) -> bool {
        self.cache.contains(name)
    }
}
