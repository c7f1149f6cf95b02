//! A cache-blocked transpose of the first two dimensions of an f32 tensor, for the blocked
//! conv path's layout changes (image → channel-last pixels, products → channel planes).
//! ggml's `cont` of a permuted tensor walks the destination element by element with a
//! strided read; on SD's UNet those copies took a tenth of a step.

use std::os::raw::{c_int, c_void};

use super::claims::Claims;
use super::{Context, CpuKernels, Tensor};
use crate::dtype::DType;
use crate::ggml::sys;

/// Side of the square tiles copied at a time (two 32 × 32 f32 tiles fit in L1 with room).
const TILE: usize = 32;

impl CpuKernels {
    /// `x` ([a, b, c, d] f32, contiguous) as [b, a, c, d], contiguous.
    pub fn transpose<'c>(self, ctx: &'c Context, x: Tensor<'c>) -> Option<Tensor<'c>> {
        if x.ty() != DType::F32 || !x.is_contiguous() {
            return None;
        }
        let [a, b, c, d] = x.ne();
        Some(super::custom_node(ctx, [b, a, c, d], &[x], compute, &[]))
    }
}

/// Whether a custom op's function is this transpose.
pub(super) fn is_node(fun: *const ()) -> bool {
    fun == compute as *const ()
}

/// # Safety
/// `dst` is a node built by [`CpuKernels::transpose`], its source and itself allocated in
/// host memory.
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _: c_int, nth: c_int, _: *mut c_void) {
    // SAFETY: every one of ggml's threads makes one for this node and drops it on return.
    let claims = unsafe { Claims::of(dst, nth.max(1) as usize) };
    // SAFETY: the contract above: contiguous f32 tensors of the same element count.
    let (x, out, [a, b, c, d]) = unsafe {
        let node = &*dst;
        let s = &*node.src[0];
        let ne = s.ne.map(|v| v as usize);
        let len = ne.iter().product();
        (
            std::slice::from_raw_parts(s.data.cast::<f32>(), len),
            node.data.cast::<f32>(),
            ne,
        )
    };
    let slab = a * b;
    let row_blocks = a.div_ceil(TILE);
    // The register transposes this CPU may run (under the cap), asked once per evaluation.
    let tiles = super::tiles();
    claims.each_run(c * d * row_blocks, |jobs| {
        for job in jobs {
            let (s, i0) = (job / row_blocks, (job % row_blocks) * TILE);
            let i1 = (i0 + TILE).min(a);
            let src = &x[s * slab..(s + 1) * slab];
            // SAFETY: output rows i0..i1 of slab s (each b floats) belong to this job alone.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.add(s * slab + i0 * b), (i1 - i0) * b)
            };
            for j0 in (0..b).step_by(TILE) {
                let j1 = (j0 + TILE).min(b);
                let whole = i1 - i0 == TILE && j1 - j0 == TILE;
                // SAFETY: `tiles()` named what this CPU has (under the cap).
                let fast = whole && unsafe { fast_blocks(tiles, src, a, dst, b, (i0, j0)) };
                if fast {
                    continue;
                }
                for i in i0..i1 {
                    let row = &mut dst[(i - i0) * b..(i - i0 + 1) * b];
                    for j in j0..j1 {
                        row[j] = src[i + a * j];
                    }
                }
            }
        }
    });
}

/// A full TILE × TILE block through register transposes of `tiles`' width (the class
/// `SD_CLI_CPU` allows): 16 × 16 with AVX-512, 8 × 8 with AVX2. Output rows i0.. (of `dst`,
/// which starts at row i0), columns j0..; false for `None`.
///
/// # Safety
/// The CPU has the instructions of `tiles`.
#[cfg(target_arch = "x86_64")]
unsafe fn fast_blocks(
    tiles: Option<super::Tiles>,
    src: &[f32],
    a: usize,
    dst: &mut [f32],
    b: usize,
    (i0, j0): (usize, usize),
) -> bool {
    use super::Tiles;
    let Some(tiles) = tiles else {
        return false;
    };
    let side = match tiles {
        Tiles::Avx512 => 16,
        Tiles::Avx2 => 8,
    };
    for di in (0..TILE).step_by(side) {
        for dj in (0..TILE).step_by(side) {
            let row = |r: usize| src[i0 + di + a * (j0 + dj + r)..][..side].as_ptr().cast();
            let out = dst[di * b + j0 + dj..][..(side - 1) * b + side]
                .as_mut_ptr()
                .cast::<u32>();
            // SAFETY: `tiles` are this CPU's (the contract); each source row has `side` words at i0 + di
            // (sliced above), and the `side` output rows `b` apart have `side` words at j0 + dj.
            unsafe {
                match tiles {
                    Tiles::Avx512 => {
                        super::kernels::transpose_16x16(&std::array::from_fn(row), out, b)
                    }
                    Tiles::Avx2 => super::avx2::transpose_8x8(&std::array::from_fn(row), out, b),
                }
            }
        }
    }
    true
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn fast_blocks(
    _: Option<super::Tiles>,
    _: &[f32],
    _: usize,
    _: &mut [f32],
    _: usize,
    _: (usize, usize),
) -> bool {
    false
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{fast_blocks, TILE};
    use crate::ggml::gemm::tests::runnable_tiles;

    /// Both register widths this CPU can run (whatever `SD_CLI_CPU` says) transpose a block
    /// inside a larger matrix exactly, leaving the rest of the output alone.
    #[test]
    fn register_blocks_transpose_exactly() {
        let (a, b) = (3 * TILE + 5, 2 * TILE + 3);
        let src: Vec<f32> = (0..a * b).map(|v| v as f32).collect();
        for tiles in runnable_tiles() {
            let (i0, j0) = (TILE + 2, TILE - 1);
            // The output from row i0 on, as `compute` hands it over.
            let mut dst = vec![-1.0f32; (a - i0) * b];
            // SAFETY: `runnable_tiles` lists only what this CPU has.
            assert!(unsafe { fast_blocks(Some(tiles), &src, a, &mut dst, b, (i0, j0)) });
            for i in i0..a {
                for j in 0..b {
                    let inside = (i0..i0 + TILE).contains(&i) && (j0..j0 + TILE).contains(&j);
                    let want = if inside { src[i + a * j] } else { -1.0 };
                    assert_eq!(dst[(i - i0) * b + j], want, "{tiles:?}: ({i}, {j})");
                }
            }
        }
        let mut dst = vec![0.0f32; a * b];
        // SAFETY: no instructions are asked for.
        assert!(!unsafe { fast_blocks(None, &src, a, &mut dst, b, (0, 0)) });
    }
}
