//! A cache-blocked GEMM for weight × activation products on x86-64 CPUs with AVX-512 or
//! AVX2 + FMA, run as a ggml custom op in ggml's own thread pool.
//!
//! Why it exists: ggml's CPU `mul_mat` (llamafile's tinyBLAS) forms each small output tile as
//! dot products over whole rows, so both operands stream from L2/L3 for every tile; on
//! PixArt XL's linears it reaches ~70 % of this CPU's FMA peak. Here the weight is packed
//! into k-major panels of [`NR`] outputs (the BLIS layout) and a register tile of [`MR`]
//! tokens × [`NR`] outputs reads a strip of six activation rows from L1 (in place for f32,
//! else as packed rows) while one panel streams from L2.
//!
//! Weights: f32; f16 (widened to f32 while packing, activations stay f32, so the result is
//! at least as exact as ggml's, which rounds the activations to f16); bf16 (activations
//! rounded to bf16 as ggml does, products through `vdpbf16ps` as ggml's own bf16 path, or
//! on AMX tiles, `amx.rs`, where the CPU has them; Intel CPUs without AMX widen instead);
//! q8_0 (`q8.rs`: activations quantized as ggml does, VNNI integer dot products; without
//! AVX-512 VNNI dequantized to f32 while packing, exactly as ggml dequantizes).
//! On CPUs with AVX2 + FMA but no AVX-512 (`avx2.rs`) f32, f16, bf16 and q8_0 weights (all
//! but the first widened while packing) run the same loops with 8-lane tiles, each panel
//! packed as four contiguous 16-output strips (`pack::panel_at`).
//! Any other case (types, layouts, other CPUs and architectures) returns `None` and the caller
//! keeps ggml's `mul_mat`. `attention.rs` runs exact attention on the same
//! tiles; `conv.rs` a convolution whose patches are built a chunk at a time inside the
//! product. Around them, ops that ggml runs as several passes or with poor thread splits:
//! `im2col.rs` (channel-last patches), `transpose.rs`, `geglu.rs`, `gelu.rs` (tanh GELU),
//! `norm.rs` (GroupNorm / LayerNorm with their affine parameters and SiLU). A product may
//! finish its tiles itself (`finish.rs`: GELU, gated residual) and fetches the weight block it
//! packs next while it multiplies the current one (`prefetch.rs`).

// The kernels are x86-64 (AVX-512, AVX2); elsewhere the entry points below answer `None`.
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod approx;
#[cfg(target_arch = "x86_64")]
mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_rows;
mod claims;
#[cfg(target_arch = "x86_64")]
mod conv;
mod dispatch;
#[cfg(target_arch = "x86_64")]
mod driver;
#[cfg(target_arch = "x86_64")]
mod finish;
#[cfg(target_arch = "x86_64")]
mod geglu;
#[cfg(target_arch = "x86_64")]
mod gelu;
mod im2col;
#[cfg(target_arch = "x86_64")]
mod kernels;
#[cfg(target_arch = "x86_64")]
mod norm;
#[cfg(target_arch = "x86_64")]
mod pack;
#[cfg(target_arch = "x86_64")]
mod prefetch;
#[cfg(target_arch = "x86_64")]
mod q8;
#[cfg(target_arch = "x86_64")]
mod q8_avx2;
mod rope;
#[cfg(target_arch = "x86_64")]
mod softmax;
mod transpose;

use std::os::raw::c_int;

use super::backend::Backend;
use super::context::{Context, Tensor};
use super::sys;
use crate::dtype::DType;
pub(in crate::ggml) use dispatch::{avx512_kernels, tiles, Tiles};
pub use im2col::ConvGeometry;

/// What the caller accepts for attention's two products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPrecision {
    /// Everything in f32 (the reference's arithmetic).
    Exact,
    /// Where the CPU multiplies bf16 natively (AVX-512 BF16): Q, K, V and the softmax's
    /// exponentials rounded to bf16 for `vdpbf16ps`, accumulation, softmax and sums in f32
    /// (about twice the f32 rate). What `--fa` asks for: upstream's fused kernel rounds Q, K
    /// and V to f16 there. Elsewhere the same as `Exact`.
    Bf16,
}

/// Tokens per register tile (rows of the output).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(in crate::ggml) const MR: usize = 6;
/// Outputs per register tile and weight panel (four 16-lane vectors).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(in crate::ggml) const NR: usize = 64;

/// Below this many tokens ggml's matrix-vector path is as good and packing is not repaid.
const MIN_TOKENS: usize = 16;

/// How the weight's elements are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::ggml) enum WeightKind {
    F32,
    F16,
    Bf16,
    Q8_0,
}

impl WeightKind {
    fn of(ty: DType) -> Option<Self> {
        match ty {
            DType::F32 => Some(Self::F32),
            DType::F16 => Some(Self::F16),
            DType::BF16 => Some(Self::Bf16),
            DType::Q8_0 => Some(Self::Q8_0),
            _ => None,
        }
    }

    /// Whether this CPU (under `SD_CLI_CPU`'s cap) has the instructions a kernel for this
    /// weight type needs. Every type runs wherever f32 does: bf16 through `vdpbf16ps` or AMX
    /// tiles where the CPU has AVX-512 BF16 (on Intel: AMX) ([`bf16_native`]), q8_0 through VNNI integer products where
    /// it has AVX-512 VNNI ([`q8_native`]), and otherwise widened to f32 while packing.
    fn supported(self) -> bool {
        tiles().is_some()
    }
}

/// Whether q8_0 weights multiply as integers against activations quantized to q8_0 (VNNI, as
/// ggml's own product does) rather than widened to f32 while packing (exact dequantized
/// weights against f32 activations, at the f32 rate: on AVX2 without VNNI this beats ggml's
/// integer path, whose byte products need two instructions and a widening per 32 products).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn q8_native() -> bool {
    q8_kernel().is_some()
}

/// The integer kernel q8_0 weights run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Q8Kernel {
    /// 16-lane `vpdpbusd` (AVX-512 VNNI), `q8.rs`.
    Avx512,
    /// 8-lane `vpdpbusd` beside the AVX2 tiles (AVX-VNNI), `q8_avx2.rs`.
    Vnni256(crate::cpu_info::Vnni256),
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn q8_kernel() -> Option<Q8Kernel> {
    use crate::cpu_info::kernel_may_use;
    match tiles()? {
        Tiles::Avx512 => {
            (kernel_may_use("avx512bw") && kernel_may_use("avx512vnni")).then_some(Q8Kernel::Avx512)
        }
        Tiles::Avx2 => crate::cpu_info::vnni256().map(Q8Kernel::Vnni256),
    }
}

/// Whether bf16 weights multiply as bf16 pairs (`vdpbf16ps` or AMX tiles, activations rounded
/// to bf16) rather than widened to f32 (exact, at the f32 rate): `cpu_info::bf16_pairs`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn bf16_native() -> bool {
    crate::cpu_info::bf16_pairs()
}

/// Whether bf16 pair products run on AMX tiles (`amx.rs`; Sapphire Rapids and later, not
/// under a `SD_CLI_CPU` cap): the same roundings as `vdpbf16ps`, 256 times the work per
/// instruction.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn amx_bf16() -> bool {
    bf16_native() && crate::cpu_info::kernel_may_use("amxbf16")
}

/// Whether this process may run AMX-BF16 tiles: the CPU has them and the OS granted their
/// state (asked once).
pub fn amx_bf16_granted() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::amx_bf16_granted()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The blocked custom ops, as a graph node can be one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockedOp {
    /// [`CpuKernels::linear`] (sources: activations, weight, bias).
    Linear,
    /// [`CpuKernels::attention`] (sources: q, k, v, mask).
    Attention,
    /// [`CpuKernels::im2col`] (source: the image).
    Im2col,
    /// [`CpuKernels::transpose`] (source: the tensor).
    Transpose,
    /// [`CpuKernels::geglu`] (source: the projection).
    Geglu,
    /// [`CpuKernels::gelu_tanh`] (source: x).
    Gelu,
    /// [`CpuKernels::group_norm`] or [`CpuKernels::layer_norm`] (sources: x, weight, bias).
    Norm,
    /// [`CpuKernels::conv`] (sources: channel-last pixels, kernel matrix, bias).
    Conv,
    /// [`CpuKernels::rope`] (sources: x, cos, sin).
    Rope,
}

impl BlockedOp {
    /// Which blocked op `t` is, told by the function its custom-op parameters hold.
    pub fn of(t: Tensor<'_>) -> Option<Self> {
        if t.op_name() != "CUSTOM" {
            return None;
        }
        // SAFETY: a live tensor; a custom op's parameters start with its function pointer.
        let fun = unsafe {
            std::ptr::read_unaligned(
                (*t.raw())
                    .op_params
                    .as_ptr()
                    .cast::<sys::ggml_custom_op_t>(),
            )
        }?;
        let fun = fun as *const ();
        if im2col::is_node(fun) {
            return Some(Self::Im2col);
        }
        if transpose::is_node(fun) {
            return Some(Self::Transpose);
        }
        if rope::is_node(fun) {
            return Some(Self::Rope);
        }
        #[cfg(target_arch = "x86_64")]
        {
            if fun == driver::compute as *const () {
                return Some(Self::Linear);
            }
            if fun == attention::compute as *const () {
                return Some(Self::Attention);
            }
            if geglu::is_node(fun) {
                return Some(Self::Geglu);
            }
            if gelu::is_node(fun) {
                return Some(Self::Gelu);
            }
            if norm::is_node(fun) {
                return Some(Self::Norm);
            }
            if conv::is_node(fun) {
                return Some(Self::Conv);
            }
        }
        let _ = fun;
        None
    }
}

/// Whether [`CpuKernels::linear`] can take a weight of type `ty` on this CPU.
pub fn blocked_gemm_available(ty: DType) -> bool {
    WeightKind::of(ty).is_some_and(WeightKind::supported)
}

/// The right to put the blocked CPU kernels into a graph. They are ggml custom ops that read
/// and write host memory, so only a CPU backend hands one out ([`Backend::cpu_kernels`]), and a
/// graph for any other device cannot contain them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuKernels(());

impl Backend {
    /// The blocked CPU kernels, on the CPU backend of a CPU that has AVX-512F or AVX2 + FMA
    /// (each kernel checks the further instructions it needs).
    pub fn cpu_kernels(&self) -> Option<CpuKernels> {
        (self.is_cpu() && WeightKind::F32.supported()).then_some(CpuKernels(()))
    }
}

impl CpuKernels {
    /// `x W^T (+ bias)` like `mul_mat(w, x)` followed by `add(_, bias)`, through the blocked
    /// kernels; `None` when this product is not one they take (the caller then uses
    /// `mul_mat`).
    ///
    /// `w`: [k, m] (2-D, contiguous); `x`: [k, n, b2, b3] f32, contiguous; `bias`: [m] f32.
    pub fn linear<'c>(
        self,
        ctx: &'c Context,
        w: Tensor<'c>,
        x: Tensor<'c>,
        bias: Option<Tensor<'c>>,
    ) -> Option<Tensor<'c>> {
        self.linear_add(ctx, w, x, bias, None)
    }

    /// [`CpuKernels::linear`] plus `addend` (f32, contiguous, the output's shape), added as the
    /// tiles are first written: `y + x Wᵀ` in one pass over the output instead of a product
    /// and an `add` (a run-time LoRA's up-projection onto the layer's output).
    pub fn linear_add<'c>(
        self,
        ctx: &'c Context,
        w: Tensor<'c>,
        x: Tensor<'c>,
        bias: Option<Tensor<'c>>,
        addend: Option<Tensor<'c>>,
    ) -> Option<Tensor<'c>> {
        self.product(ctx, [w, x], bias, addend.map(Then::Add))
    }

    /// [`CpuKernels::linear`] followed by `then`, applied to each output tile as its sums
    /// complete (see [`Then`]); the same results as the separate ops.
    pub fn linear_then<'c>(
        self,
        ctx: &'c Context,
        w: Tensor<'c>,
        x: Tensor<'c>,
        bias: Option<Tensor<'c>>,
        then: Then<'c>,
    ) -> Option<Tensor<'c>> {
        self.product(ctx, [w, x], bias, Some(then))
    }

    /// The product node, with `then` (if any) in its sources and op parameters.
    fn product<'c>(
        self,
        ctx: &'c Context,
        [w, x]: [Tensor<'c>; 2],
        bias: Option<Tensor<'c>>,
        then: Option<Then<'c>>,
    ) -> Option<Tensor<'c>> {
        let (addend, gate) = match then {
            Some(Then::Add(a)) | Some(Then::Residual(a, None)) => (Some(a), None),
            Some(Then::Residual(a, Some(g))) => (Some(a), Some(g)),
            Some(Then::GeluTanh) | None => (None, None),
        };
        let kind = WeightKind::of(w.ty()).filter(|k| k.supported())?;
        let [k, m, w2, w3] = w.ne();
        let xn = x.ne();
        let tokens = xn[1] * xn[2] * xn[3];
        let shapes_ok = k > 0
            && m > 0
            && (kind != WeightKind::Q8_0 || k.is_multiple_of(q8_block()))
            && w2 == 1
            && w3 == 1
            && w.is_contiguous()
            && x.ty() == DType::F32
            && x.is_contiguous()
            && xn[0] == k
            && tokens >= MIN_TOKENS
            && bias.is_none_or(|b| {
                b.ty() == DType::F32 && b.is_contiguous() && b.ne() == [m, 1, 1, 1]
            })
            && addend.is_none_or(|a| {
                a.ty() == DType::F32 && a.is_contiguous() && a.ne() == [m, xn[1], xn[2], xn[3]]
            })
            && gate.is_none_or(|g| {
                g.ty() == DType::F32 && g.is_contiguous() && g.ne() == [m, 1, xn[2], xn[3]]
            });
        if !shapes_ok {
            return None;
        }
        // Activations first: ggml orders a graph by visiting sources in order, so a weight
        // view (a reshaped conv kernel, a slice of a fused weight) listed first would be
        // scheduled before everything the activations depend on, into an early graph-cut
        // segment, which would then hold that weight.
        let raw = |t: Option<Tensor<'c>>| t.map_or(std::ptr::null_mut(), |t| t.raw());
        let mut args = [x.raw(), w.raw(), raw(bias), raw(addend), raw(gate)];
        let n_args = match (bias, addend, gate) {
            (_, _, Some(_)) => 5,
            (_, Some(_), None) => 4,
            (Some(_), None, None) => 3,
            (None, None, None) => 2,
        };
        let finish = match then {
            Some(Then::GeluTanh) => FINISH_GELU,
            Some(Then::Residual(..)) => FINISH_RESIDUAL,
            Some(Then::Add(_)) | None => FINISH_ADD,
        };
        // SAFETY: live tensors of this context; `driver::compute` reads exactly the sources
        // set here and writes the f32 [m, n, b2, b3] result ggml allocates for the node.
        let out = unsafe {
            sys::ggml_custom_4d(
                ctx.raw(),
                DType::F32.raw(),
                m as i64,
                xn[1] as i64,
                xn[2] as i64,
                xn[3] as i64,
                args.as_mut_ptr(),
                n_args as c_int,
                op_fn(),
                sys::GGML_N_TASKS_MAX,
                std::ptr::null_mut(),
            )
        };
        // SAFETY: `out` was just made; the slot lies past ggml's custom-op parameters.
        unsafe { (*out).op_params[PARAM_FINISH] = finish };
        Some(ctx.wrap(out))
    }
}

/// What a product node does with each output tile once its sums are complete
/// ([`CpuKernels::linear_then`]).
#[derive(Clone, Copy)]
pub enum Then<'c> {
    /// `addend + y`, the addend (laid out like the output) added as the tiles are first
    /// written.
    Add(Tensor<'c>),
    /// `gelu(y, approximate = "tanh")`.
    GeluTanh,
    /// `residual + gate ⊙ y` (or `residual + y`): the residual laid out like the output, the
    /// gate [m, 1, b2, b3] (one row per batch item, as adaLN's gates).
    Residual(Tensor<'c>, Option<Tensor<'c>>),
}

/// Where a product node keeps its finish, and its values.
const PARAM_FINISH: usize = PARAM_BASE;
const FINISH_ADD: i32 = 0;
const FINISH_GELU: i32 = 1;
const FINISH_RESIDUAL: i32 = 2;

/// The body of a custom op: ggml calls it on each of its threads with the node.
type OpBody = unsafe extern "C" fn(*mut sys::ggml_tensor, c_int, c_int, *mut std::ffi::c_void);

/// First op-param slot free after ggml's own custom-op parameters (function, tasks, data).
const PARAM_BASE: usize = 8;

/// A custom node: f32 of shape `ne` over the sources `args`, computed by `body` on every
/// thread, with `params` in the op-param slots from [`PARAM_BASE`] (at most eight).
fn custom_node<'c>(
    ctx: &'c Context,
    ne: [usize; 4],
    args: &[Tensor<'c>],
    body: OpBody,
    params: &[i32],
) -> Tensor<'c> {
    assert!(args.len() <= 8 && params.len() <= 8, "custom op arguments");
    let mut raw: Vec<_> = args.iter().map(|t| t.raw()).collect();
    let ne = ne.map(|v| v as i64);
    // SAFETY: live tensors of this context; `body` reads exactly these sources and writes
    // the f32 result of shape `ne` that ggml allocates for the node.
    let out = unsafe {
        sys::ggml_custom_4d(
            ctx.raw(),
            DType::F32.raw(),
            ne[0],
            ne[1],
            ne[2],
            ne[3],
            raw.as_mut_ptr(),
            raw.len() as c_int,
            Some(body),
            sys::GGML_N_TASKS_MAX,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `out` was just made; these slots lie past ggml's custom-op parameters and
    // within its 16 op-param words.
    unsafe {
        for (i, &v) in params.iter().enumerate() {
            (*out).op_params[PARAM_BASE + i] = v;
        }
    }
    ctx.wrap(out)
}

/// Elements per q8_0 block (ggml's QK8_0).
fn q8_block() -> usize {
    DType::Q8_0.block_size()
}

/// The custom op's body (no body where the kernels do not exist: never built there).
#[cfg(target_arch = "x86_64")]
fn op_fn() -> sys::ggml_custom_op_t {
    Some(driver::compute)
}

#[cfg(not(target_arch = "x86_64"))]
fn op_fn() -> sys::ggml_custom_op_t {
    None
}

#[cfg(not(target_arch = "x86_64"))]
impl CpuKernels {
    /// The fused GEGLU exists on x86-64 only.
    pub fn geglu<'c>(self, _ctx: &'c Context, _x: Tensor<'c>) -> Option<Tensor<'c>> {
        None
    }

    /// The fused convolution exists on x86-64 only.
    pub fn conv<'c>(
        self,
        _ctx: &'c Context,
        _pixels: Tensor<'c>,
        _matrix: Tensor<'c>,
        _bias: Option<Tensor<'c>>,
        _geometry: ConvGeometry,
    ) -> Option<Tensor<'c>> {
        None
    }

    /// The fused norms exist on x86-64 only.
    #[allow(clippy::too_many_arguments)]
    pub fn group_norm<'c>(
        self,
        _ctx: &'c Context,
        _x: Tensor<'c>,
        _groups: usize,
        _eps: f32,
        _weight: Tensor<'c>,
        _bias: Tensor<'c>,
        _silu: bool,
    ) -> Option<Tensor<'c>> {
        None
    }

    /// The fused norms exist on x86-64 only.
    pub fn layer_norm<'c>(
        self,
        _ctx: &'c Context,
        _x: Tensor<'c>,
        _eps: f32,
        _weight: Option<Tensor<'c>>,
        _bias: Option<Tensor<'c>>,
    ) -> Option<Tensor<'c>> {
        None
    }

    /// The blocked attention exists on x86-64 only.
    #[allow(clippy::too_many_arguments)]
    pub fn attention<'c>(
        self,
        _ctx: &'c Context,
        _q: Tensor<'c>,
        _k: Tensor<'c>,
        _v: Tensor<'c>,
        _heads: usize,
        _mask: Option<Tensor<'c>>,
        _scale: f32,
        _precision: AttentionPrecision,
    ) -> Option<Tensor<'c>> {
        None
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod avx2_tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod finish_tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod fused_tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod q8_avx2_tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
