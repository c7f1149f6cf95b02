//! Rotary position embedding in one pass: each pair (x0, x1) of every head becomes
//! (x0·cos − x1·sin, x0·sin + x1·cos) with the token's table entries. Built from ggml's ops the
//! same rotation takes two strided copies, four products, a difference, a sum and a concat over
//! rows one element wide (ggml's slowest case: a per-element loop); on the Wan 1.3B DiT at
//! 480×832 × 33 frames that was ~7 % of a call. The arithmetic is the ops' own (a product, a
//! product, then the difference or sum, each rounded to f32), so results are bit-identical.

use std::os::raw::{c_int, c_void};

use super::claims::Claims;
use super::{Context, CpuKernels, Tensor};
use crate::dtype::DType;
use crate::ggml::sys;

/// The op-param slot (after [`super::PARAM_BASE`]) saying where a pair's second element is:
/// 1 for adjacent pairs, else the half of the head (`rotate_half` layout).
const PARAM_INTERLEAVED: usize = 0;

impl CpuKernels {
    /// `x` ([d, heads, n, batch] f32, contiguous) rotated by `cos`/`sin` (f32, contiguous,
    /// d/2 · n entries: pair index fastest, one row per token, shared by the batch). Pairs
    /// are adjacent elements when `interleaved`, else (x_i, x_{i + d/2}).
    pub fn rope<'c>(
        self,
        ctx: &'c Context,
        x: Tensor<'c>,
        cos: Tensor<'c>,
        sin: Tensor<'c>,
        interleaved: bool,
    ) -> Option<Tensor<'c>> {
        let [d, _, n, _] = x.ne();
        let table_ok = |t: Tensor<'_>| {
            t.ty() == DType::F32
                && t.is_contiguous()
                && t.ne().iter().product::<usize>() == d / 2 * n
        };
        if x.ty() != DType::F32
            || !x.is_contiguous()
            || d == 0
            || d % 2 != 0
            || !table_ok(cos)
            || !table_ok(sin)
        {
            return None;
        }
        Some(super::custom_node(
            ctx,
            x.ne(),
            &[x, cos, sin],
            compute,
            &[interleaved as i32],
        ))
    }
}

/// Whether a custom op's function is this rotation.
pub(super) fn is_node(fun: *const ()) -> bool {
    fun == compute as *const ()
}

/// # Safety
/// `dst` is a node built by [`CpuKernels::rope`], its sources and itself in host memory.
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _: c_int, nth: c_int, _: *mut c_void) {
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth.max(1) as usize) };
    // SAFETY: the contract above: contiguous f32 tensors of the checked element counts.
    let (x, cos, sin, out, [d, heads, n, batch], interleaved) = unsafe {
        let node = &*dst;
        let ne = node.ne.map(|v| v as usize);
        let table = |t: *mut sys::ggml_tensor| {
            std::slice::from_raw_parts((*t).data.cast::<f32>(), ne[0] / 2 * ne[2])
        };
        (
            std::slice::from_raw_parts((*node.src[0]).data.cast::<f32>(), ne.iter().product()),
            table(node.src[1]),
            table(node.src[2]),
            node.data.cast::<f32>(),
            ne,
            node.op_params[super::PARAM_BASE + PARAM_INTERLEAVED] != 0,
        )
    };
    let (half, row) = (d / 2, d * heads);
    claims.each_run(n * batch, |tokens| {
        for t in tokens {
            let p = t % n;
            let (c, s) = (&cos[p * half..][..half], &sin[p * half..][..half]);
            let src = &x[t * row..][..row];
            // SAFETY: token t's row of the output belongs to the run this thread claimed.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.add(t * row), row) };
            for (head, y) in src.chunks_exact(d).zip(dst.chunks_exact_mut(d)) {
                if interleaved {
                    rotate_adjacent(head, y, c, s);
                } else {
                    rotate_halves(head, y, c, s);
                }
            }
        }
    });
}

/// Pairs (x[2i], x[2i + 1]).
fn rotate_adjacent(x: &[f32], y: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (((y, x), &c), &s) in y
        .chunks_exact_mut(2)
        .zip(x.chunks_exact(2))
        .zip(cos)
        .zip(sin)
    {
        y[0] = x[0] * c - x[1] * s;
        y[1] = x[0] * s + x[1] * c;
    }
}

/// Pairs (x[i], x[i + d/2]).
fn rotate_halves(x: &[f32], y: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (x0, x1) = x.split_at(half);
    let (y0, y1) = y.split_at_mut(half);
    for i in 0..half {
        y0[i] = x0[i] * cos[i] - x1[i] * sin[i];
        y1[i] = x0[i] * sin[i] + x1[i] * cos[i];
    }
}
