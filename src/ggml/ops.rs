//! Safe wrappers for the ggml ops the models use, one method per op on [`Context`].
//!
//! Every op builds a node in the context's graph metadata; nothing is computed here. ggml
//! asserts on incompatible shapes, which are programming errors in a model's `forward`.

use super::context::{Context, Ne, Tensor};
use super::gemm::ConvGeometry;

/// Above this many bytes of patches, a convolution builds them a chunk at a time inside the
/// blocked product instead of as one im2col tensor.
const FUSED_CONV_BYTES: usize = 16 << 20;
use super::sys;
use crate::dtype::DType;

/// Rotary embedding layouts (`GGML_ROPE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs (x0,x1),(x2,x3)... rotate together.
    Normal,
    /// The first and second halves rotate together (GPT-NeoX / HF `rotate_half`).
    Neox,
    /// Multi-section rope over several position axes (Qwen-VL), NeoX ordering.
    MRope,
    /// Interleaved multi-section rope.
    IMRope,
    /// Vision rope: each section has its own frequency index.
    Vision,
}

impl RopeMode {
    fn raw(self) -> i32 {
        (match self {
            RopeMode::Normal => sys::GGML_ROPE_TYPE_NORMAL,
            RopeMode::Neox => sys::GGML_ROPE_TYPE_NEOX,
            RopeMode::MRope => sys::GGML_ROPE_TYPE_MROPE,
            RopeMode::IMRope => sys::GGML_ROPE_TYPE_IMROPE,
            RopeMode::Vision => sys::GGML_ROPE_TYPE_VISION,
        }) as i32
    }
}

/// Resampling filters for [`Context::interpolate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleMode {
    Nearest,
    Bilinear,
    Bicubic,
}

macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident => $f:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name<'c>(&'c self, a: Tensor<'c>) -> Tensor<'c> {
            // SAFETY: `a` belongs to a live context that outlives 'c; ggml validates shapes.
            self.wrap(unsafe { sys::$f(self.raw(), a.raw()) })
        }
    )*};
}

macro_rules! binary {
    ($($(#[$doc:meta])* $name:ident => $f:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name<'c>(&'c self, a: Tensor<'c>, b: Tensor<'c>) -> Tensor<'c> {
            // SAFETY: both tensors live at least as long as 'c; ggml validates shapes.
            self.wrap(unsafe { sys::$f(self.raw(), a.raw(), b.raw()) })
        }
    )*};
}

impl Context {
    binary! {
        /// Element-wise sum; `b` broadcasts over `a` when its dims divide `a`'s.
        add => ggml_add;
        /// Element-wise difference (`b` broadcasts).
        sub => ggml_sub;
        /// Element-wise product (`b` broadcasts).
        mul => ggml_mul;
        /// Element-wise quotient (`b` broadcasts).
        div => ggml_div;
        /// `b @ a^T` in PyTorch terms: contracts `ne[0]` of both; result ne = [a.ne1, b.ne1, ..].
        mul_mat => ggml_mul_mat;
        /// Repeats `a` to the shape of `b`.
        repeat => ggml_repeat;
        /// Copies `a` into `b` (with type conversion); returns a view of `b`.
        cpy => ggml_cpy;
    }

    unary! {
        /// A contiguous copy.
        cont => ggml_cont;
        /// Swaps `ne[0]` and `ne[1]` (a view).
        transpose => ggml_transpose;
        /// GELU, tanh approximation.
        gelu => ggml_gelu;
        /// GELU with the exact erf.
        gelu_erf => ggml_gelu_erf;
        /// x * sigmoid(1.702 x).
        gelu_quick => ggml_gelu_quick;
        silu => ggml_silu;
        relu => ggml_relu;
        tanh => ggml_tanh;
        sigmoid => ggml_sigmoid;
        exp => ggml_exp;
        /// Element-wise sine.
        sin => ggml_sin;
        sqr => ggml_sqr;
        sqrt => ggml_sqrt;
        neg => ggml_neg;
        /// Sum over `ne[0]`, keeping it as size 1.
        sum_rows => ggml_sum_rows;
        /// Mean over `ne[0]`, keeping it as size 1.
        mean => ggml_mean;
        /// SwiGLU over the two halves of `ne[0]`: silu(first) * second.
        swiglu => ggml_swiglu;
        /// GeGLU (tanh GELU) over the two halves of `ne[0]`: gelu(first) * second.
        geglu => ggml_geglu;
        /// GeGLU with the exact erf GELU.
        geglu_erf => ggml_geglu_erf;
    }

    /// `a * s`.
    pub fn scale<'c>(&'c self, a: Tensor<'c>, s: f32) -> Tensor<'c> {
        // SAFETY: live tensor; scalar op.
        self.wrap(unsafe { sys::ggml_scale(self.raw(), a.raw(), s) })
    }

    /// `a * s + b` element-wise with scalars.
    pub fn scale_bias<'c>(&'c self, a: Tensor<'c>, s: f32, b: f32) -> Tensor<'c> {
        // SAFETY: live tensor; scalar op.
        self.wrap(unsafe { sys::ggml_scale_bias(self.raw(), a.raw(), s, b) })
    }

    /// `max(x, 0) + slope · min(x, 0)`.
    pub fn leaky_relu<'c>(&'c self, a: Tensor<'c>, slope: f32) -> Tensor<'c> {
        // SAFETY: live tensor; scalar op, not in place.
        self.wrap(unsafe { sys::ggml_leaky_relu(self.raw(), a.raw(), slope, false) })
    }

    pub fn clamp<'c>(&'c self, a: Tensor<'c>, min: f32, max: f32) -> Tensor<'c> {
        // SAFETY: live tensor; scalar op.
        self.wrap(unsafe { sys::ggml_clamp(self.raw(), a.raw(), min, max) })
    }

    /// Converts to another type.
    pub fn cast<'c>(&'c self, a: Tensor<'c>, ty: DType) -> Tensor<'c> {
        // SAFETY: live tensor; ggml checks the conversion is supported.
        self.wrap(unsafe { sys::ggml_cast(self.raw(), a.raw(), ty.raw()) })
    }

    /// A view with a new shape (ggml order); `a` must be contiguous.
    pub fn reshape<'c>(&'c self, a: Tensor<'c>, ne: Ne) -> Tensor<'c> {
        let n = ne.map(|d| d as i64);
        // SAFETY: live tensor; ggml asserts the element count matches.
        self.wrap(unsafe { sys::ggml_reshape_4d(self.raw(), a.raw(), n[0], n[1], n[2], n[3]) })
    }

    /// A contiguous copy with a new shape (works on non-contiguous inputs).
    pub fn cont_reshape<'c>(&'c self, a: Tensor<'c>, ne: Ne) -> Tensor<'c> {
        let n = ne.map(|d| d as i64);
        // SAFETY: live tensor; ggml asserts the element count matches.
        self.wrap(unsafe { sys::ggml_cont_4d(self.raw(), a.raw(), n[0], n[1], n[2], n[3]) })
    }

    /// A strided view: shape `ne`, byte strides `nb` (nb[0] is the element size, implied),
    /// starting `offset` bytes into `a`.
    pub fn view<'c>(&'c self, a: Tensor<'c>, ne: Ne, nb: [usize; 3], offset: usize) -> Tensor<'c> {
        let n = ne.map(|d| d as i64);
        // SAFETY: live tensor; ggml asserts the view stays inside `a`.
        self.wrap(unsafe {
            sys::ggml_view_4d(
                self.raw(),
                a.raw(),
                n[0],
                n[1],
                n[2],
                n[3],
                nb[0],
                nb[1],
                nb[2],
                offset,
            )
        })
    }

    /// Moves dimension i of `a` to position `axes[i]` (ggml's permute convention).
    pub fn permute<'c>(&'c self, a: Tensor<'c>, axes: [usize; 4]) -> Tensor<'c> {
        let [x, y, z, w] = axes.map(|v| v as i32);
        // SAFETY: live tensor; ggml asserts the axes form a permutation.
        self.wrap(unsafe { sys::ggml_permute(self.raw(), a.raw(), x, y, z, w) })
    }

    /// Concatenates along `dim` (ggml order).
    pub fn concat<'c>(&'c self, a: Tensor<'c>, b: Tensor<'c>, dim: usize) -> Tensor<'c> {
        // SAFETY: live tensors; ggml asserts the other dims agree.
        self.wrap(unsafe { sys::ggml_concat(self.raw(), a.raw(), b.raw(), dim as i32) })
    }

    /// Normalises over `ne[0]` to zero mean and unit variance.
    pub fn norm<'c>(&'c self, a: Tensor<'c>, eps: f32) -> Tensor<'c> {
        // SAFETY: live tensor.
        self.wrap(unsafe { sys::ggml_norm(self.raw(), a.raw(), eps) })
    }

    /// Divides by the root mean square over `ne[0]`.
    pub fn rms_norm<'c>(&'c self, a: Tensor<'c>, eps: f32) -> Tensor<'c> {
        // SAFETY: live tensor.
        self.wrap(unsafe { sys::ggml_rms_norm(self.raw(), a.raw(), eps) })
    }

    /// Group norm over `ne[0] * ne[1] * (ne[2] / groups)` (i.e. a [W, H, C, N] image).
    pub fn group_norm<'c>(&'c self, a: Tensor<'c>, groups: usize, eps: f32) -> Tensor<'c> {
        // SAFETY: live tensor.
        self.wrap(unsafe { sys::ggml_group_norm(self.raw(), a.raw(), groups as i32, eps) })
    }

    /// softmax(a * scale + mask) over `ne[0]`.
    pub fn soft_max_ext<'c>(
        &'c self,
        a: Tensor<'c>,
        mask: Option<Tensor<'c>>,
        scale: f32,
    ) -> Tensor<'c> {
        let m = mask.map_or(std::ptr::null_mut(), |m| m.raw());
        // SAFETY: live tensors (mask optional, null allowed by ggml).
        self.wrap(unsafe { sys::ggml_soft_max_ext(self.raw(), a.raw(), m, scale, 0.0) })
    }

    /// Fused attention. q: [d, n_q, heads, B], k/v: [d, n_kv, heads_kv, B], mask: [n_kv, n_q]
    /// (f16, padded as ggml requires). Result: [d_v, heads, n_q, B] (note the permutation).
    pub fn flash_attn_ext<'c>(
        &'c self,
        q: Tensor<'c>,
        k: Tensor<'c>,
        v: Tensor<'c>,
        mask: Option<Tensor<'c>>,
        scale: f32,
    ) -> Tensor<'c> {
        let m = mask.map_or(std::ptr::null_mut(), |m| m.raw());
        // SAFETY: live tensors; ggml validates the shapes.
        let out = unsafe {
            sys::ggml_flash_attn_ext(self.raw(), q.raw(), k.raw(), v.raw(), m, scale, 0.0, 0.0)
        };
        // Accumulate in f32: f16 accumulation overflows on diffusion activations.
        // SAFETY: `out` was just created by ggml.
        unsafe { sys::ggml_flash_attn_ext_set_prec(out, sys::GGML_PREC_F32) };
        self.wrap(out)
    }

    /// Rotary position embedding over the first `n_dims` of `ne[0]`, positions `pos` (i32,
    /// one per `ne[2]` row).
    pub fn rope<'c>(
        &'c self,
        a: Tensor<'c>,
        pos: Tensor<'c>,
        n_dims: usize,
        mode: RopeMode,
        freq_base: f32,
    ) -> Tensor<'c> {
        // SAFETY: live tensors; no frequency factors; YaRN disabled (ext_factor 0).
        self.wrap(unsafe {
            sys::ggml_rope_ext(
                self.raw(),
                a.raw(),
                pos.raw(),
                std::ptr::null_mut(),
                n_dims as i32,
                mode.raw(),
                0,
                freq_base,
                1.0,
                0.0,
                1.0,
                0.0,
                0.0,
            )
        })
    }

    /// Multi-axis rope: `sections` are cos/sin pair counts per axis; `pos` holds 4 positions
    /// per token (axis-major).
    pub fn rope_multi<'c>(
        &'c self,
        a: Tensor<'c>,
        pos: Tensor<'c>,
        n_dims: usize,
        sections: [usize; 4],
        mode: RopeMode,
        freq_base: f32,
    ) -> Tensor<'c> {
        let mut s = sections.map(|v| v as i32);
        // SAFETY: live tensors; `s` is a 4-entry array as ggml expects.
        self.wrap(unsafe {
            sys::ggml_rope_multi(
                self.raw(),
                a.raw(),
                pos.raw(),
                std::ptr::null_mut(),
                n_dims as i32,
                s.as_mut_ptr(),
                mode.raw(),
                0,
                freq_base,
                1.0,
                0.0,
                1.0,
                0.0,
                0.0,
            )
        })
    }

    /// 2D convolution. kernel: [KW, KH, IC, OC], x: [W, H, C, N]. `direct` uses ggml's direct
    /// kernel instead of im2col + matmul (less memory, usually slower on CPU).
    #[allow(clippy::too_many_arguments)]
    pub fn conv_2d<'c>(
        &'c self,
        kernel: Tensor<'c>,
        x: Tensor<'c>,
        stride: (usize, usize),
        pad: (usize, usize),
        dilation: (usize, usize),
        direct: bool,
    ) -> Tensor<'c> {
        self.conv_2d_on(kernel, x, (stride, pad, dilation), direct, None)
    }

    /// [`Context::conv_2d`]; with the CPU kernels (graphs computed on the CPU), an f32
    /// kernel's patch product runs through them (`ggml::gemm`) when they take it.
    pub fn conv_2d_on<'c>(
        &'c self,
        kernel: Tensor<'c>,
        x: Tensor<'c>,
        (stride, pad, dilation): ((usize, usize), (usize, usize), (usize, usize)),
        direct: bool,
        cpu_kernels: Option<super::CpuKernels>,
    ) -> Tensor<'c> {
        let (s0, s1) = (stride.0 as i32, stride.1 as i32);
        let (p0, p1) = (pad.0 as i32, pad.1 as i32);
        let (d0, d1) = (dilation.0 as i32, dilation.1 as i32);
        if direct {
            // SAFETY: live tensors; ggml validates the shapes.
            return self.wrap(unsafe {
                sys::ggml_conv_2d_direct(self.raw(), kernel.raw(), x.raw(), s0, s1, p0, p1, d0, d1)
            });
        }
        // im2col + matmul, with im2col in the kernel's precision (ggml's own conv_2d always
        // rounds patches to f16, which costs ~1e-3 relative accuracy with f32 kernels).
        let col_ty = if kernel.ty() == DType::F16 {
            DType::F16
        } else {
            DType::F32
        };
        let [kw, kh, ic, oc] = kernel.ne();
        // SAFETY: live tensors; ggml validates the shapes. im2col: [IC*KH*KW, OW, OH, N].
        let col = self.wrap(unsafe {
            sys::ggml_im2col(
                self.raw(),
                kernel.raw(),
                x.raw(),
                s0,
                s1,
                p0,
                p1,
                d0,
                d1,
                true,
                col_ty.raw(),
            )
        });
        let [k, ow, oh, n] = col.ne();
        let col2 = self.reshape(col, [k, ow * oh * n, 1, 1]);
        let ker2 = self.reshape(kernel, [kw * kh * ic, oc, 1, 1]);
        if let Some(kernels) = cpu_kernels.filter(|_| col_ty == DType::F32) {
            // The kernel as the weight, patches as the tokens: [OC, OW, OH, N] out.
            if let Some(y) = kernels.linear(self, ker2, col2, None) {
                let y = self.reshape(y, [oc, ow, oh, n]);
                return self.cont(self.permute(y, [2, 0, 1, 3]));
            }
        }
        let kernel_f = if kernel.ty() == col_ty {
            ker2
        } else {
            self.cast(ker2, col_ty)
        };
        // [OW*OH*N, OC] -> [OW, OH, N, OC] -> [OW, OH, OC, N]
        let y = self.reshape(self.mul_mat(col2, kernel_f), [ow, oh, n, oc]);
        self.cont(self.permute(y, [0, 1, 3, 2]))
    }

    /// 2D convolution by a kernel stored as the matrix [IC·KW·KH, OC], its rows ordered
    /// channel fastest, then column, then row (so that `--type` can quantize it — a
    /// [KW, KH, IC, OC] tensor's rows are not whole blocks — and so that each patch is
    /// KW·KH contiguous copies of a pixel's channels), plus an optional [OC] f32 bias.
    /// x: [W, H, IC, N] → [OW, OH, OC, N].
    pub fn conv_2d_matrix<'c>(
        &'c self,
        kernel: Tensor<'c>,
        x: Tensor<'c>,
        geometry: ConvGeometry,
        bias: Option<Tensor<'c>>,
        cpu_kernels: Option<super::CpuKernels>,
    ) -> Tensor<'c> {
        if let Some(kernels) = cpu_kernels {
            if let Some(y) = self.conv_blocked(kernels, kernel, x, geometry, bias) {
                return y;
            }
        }
        let [k, oc, _, _] = kernel.ne();
        let (kw, kh) = geometry.kernel;
        // Elsewhere ggml's conv wants [KW, KH, IC, OC]: quantized rows cannot be split into
        // channel-long ones, so such a kernel is widened to f32 first.
        let kernel = if kernel.ty().is_quantized() {
            self.cast(kernel, DType::F32)
        } else {
            kernel
        };
        let kernel = self.reshape(kernel, [k / (kw * kh), kw, kh, oc]);
        let kernel = self.cont(self.permute(kernel, [2, 0, 1, 3]));
        let params = (geometry.stride, geometry.pad, geometry.dilation);
        let y = self.conv_2d_on(kernel, x, params, false, None);
        match bias {
            Some(b) => self.add(y, self.reshape(b, [1, 1, oc, 1])),
            None => y,
        }
    }

    /// The patch product of [`Context::conv_2d_matrix`] through the blocked CPU kernels, on
    /// the image turned channel-last, when they take it.
    fn conv_blocked<'c>(
        &'c self,
        kernels: super::CpuKernels,
        matrix: Tensor<'c>,
        x: Tensor<'c>,
        geometry: ConvGeometry,
        bias: Option<Tensor<'c>>,
    ) -> Option<Tensor<'c>> {
        if !super::blocked_gemm_available(matrix.ty()) || x.ty() != DType::F32 {
            return None;
        }
        // [W, H, C, N] -> [C, W, H, N]: a pixel's channels become one contiguous row.
        let [w, h, c, n] = x.ne();
        let x = if x.is_contiguous() { x } else { self.cont(x) };
        let pixels = kernels.transpose(self, self.reshape(x, [w * h, c, n, 1]))?;
        let pixels = self.reshape(pixels, [c, w, h, n]);
        let [k, oc, _, _] = matrix.ne();
        let (out_w, out_h) = geometry.out_size(w, h)?;
        if k * out_w * out_h * n * 4 > FUSED_CONV_BYTES && !geometry.is_pointwise() {
            // Patches built a chunk at a time inside the product.
            let y = kernels.conv(self, pixels, matrix, bias, geometry)?;
            let y = kernels.transpose(self, self.reshape(y, [oc, out_w * out_h, n, 1]))?;
            return Some(self.reshape(y, [out_w, out_h, oc, n]));
        }
        let col = if geometry.is_pointwise() {
            pixels
        } else {
            kernels.im2col(self, pixels, geometry)?
        };
        let [_, ow, oh, _] = col.ne();
        let col2 = self.reshape(col, [k, ow * oh * n, 1, 1]);
        // The kernel as the weight, patches as the tokens: [OC, OW, OH, N] out.
        let y = kernels.linear(self, matrix, col2, bias)?;
        let y = kernels.transpose(self, self.reshape(y, [oc, ow * oh, n, 1]))?;
        Some(self.reshape(y, [ow, oh, oc, n]))
    }

    /// Resamples to the shape `ne` (2D filters act on ne[0], ne[1]).
    pub fn interpolate<'c>(&'c self, a: Tensor<'c>, ne: Ne, mode: ScaleMode) -> Tensor<'c> {
        let n = ne.map(|d| d as i64);
        let m = match mode {
            ScaleMode::Nearest => sys::GGML_SCALE_MODE_NEAREST,
            ScaleMode::Bilinear => sys::GGML_SCALE_MODE_BILINEAR,
            ScaleMode::Bicubic => sys::GGML_SCALE_MODE_BICUBIC,
        };
        // SAFETY: live tensor.
        self.wrap(unsafe { sys::ggml_interpolate(self.raw(), a.raw(), n[0], n[1], n[2], n[3], m) })
    }

    /// Zero padding: `pads[i] = (before, after)` for dim i (ggml order).
    pub fn pad<'c>(&'c self, a: Tensor<'c>, pads: [(usize, usize); 4]) -> Tensor<'c> {
        let p = pads.map(|(l, r)| (l as i32, r as i32));
        // SAFETY: live tensor.
        self.wrap(unsafe {
            sys::ggml_pad_ext(
                self.raw(),
                a.raw(),
                p[0].0,
                p[0].1,
                p[1].0,
                p[1].1,
                p[2].0,
                p[2].1,
                p[3].0,
                p[3].1,
            )
        })
    }

    /// Depthwise 2D convolution computed directly (no im2col). kernel: [KW, KH, 1, C], x:
    /// [W, H, C, N] (contiguous) → [W', H', C, N]; zero padding.
    pub fn conv_2d_dw_direct<'c>(
        &'c self,
        kernel: Tensor<'c>,
        x: Tensor<'c>,
        stride: (usize, usize),
        pad: (usize, usize),
    ) -> Tensor<'c> {
        let (s0, s1) = (stride.0 as i32, stride.1 as i32);
        let (p0, p1) = (pad.0 as i32, pad.1 as i32);
        // SAFETY: live tensors; ggml validates the shapes.
        self.wrap(unsafe {
            sys::ggml_conv_2d_dw_direct(self.raw(), kernel.raw(), x.raw(), s0, s1, p0, p1, 1, 1)
        })
    }

    /// Repeats `a` (tiled) to the shape `ne`; each of `ne` must be a multiple of `a`'s.
    pub fn repeat_4d<'c>(&'c self, a: Tensor<'c>, ne: Ne) -> Tensor<'c> {
        let n = ne.map(|d| d as i64);
        // SAFETY: live tensor; ggml checks that the shape tiles `a`.
        self.wrap(unsafe { sys::ggml_repeat_4d(self.raw(), a.raw(), n[0], n[1], n[2], n[3]) })
    }

    /// 1-D transposed convolution without padding (PyTorch `conv_transpose1d(padding=0)`).
    /// kernel: [K, OC, IC] (PyTorch's [IC, OC, K]), x: the matrix [T, IC] →
    /// [(T − 1)·stride + K, OC]. The CPU kernel takes f32 kernels only.
    pub fn conv_transpose_1d<'c>(
        &'c self,
        kernel: Tensor<'c>,
        x: Tensor<'c>,
        stride: usize,
    ) -> Tensor<'c> {
        // SAFETY: live tensors; ggml asserts x is a matrix whose width matches the kernel.
        self.wrap(unsafe {
            sys::ggml_conv_transpose_1d(self.raw(), kernel.raw(), x.raw(), stride as i32, 0, 1)
        })
    }

    /// Sinusoidal embedding of f32 timesteps [N] -> [dim, N] as [cos | sin] halves.
    pub fn timestep_embedding<'c>(
        &'c self,
        t: Tensor<'c>,
        dim: usize,
        max_period: i32,
    ) -> Tensor<'c> {
        // SAFETY: live tensor.
        self.wrap(unsafe {
            sys::ggml_timestep_embedding(self.raw(), t.raw(), dim as i32, max_period)
        })
    }

    /// Rows of `a` picked by the i32 indices in `ids`.
    pub fn get_rows<'c>(&'c self, a: Tensor<'c>, ids: Tensor<'c>) -> Tensor<'c> {
        // SAFETY: live tensors.
        self.wrap(unsafe { sys::ggml_get_rows(self.raw(), a.raw(), ids.raw()) })
    }

    /// [start, stop) in steps of `step`, f32.
    pub fn arange(&self, start: f32, stop: f32, step: f32) -> Tensor<'_> {
        // SAFETY: creates a new node in the live context.
        self.wrap(unsafe { sys::ggml_arange(self.raw(), start, stop, step) })
    }
}
