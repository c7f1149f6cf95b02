//! Which register tiles run on this CPU, and the tile entry points that pick them: the
//! blocked loops (`driver.rs`, `attention.rs`) are the same for every class.

/// Which register tiles the products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::ggml) enum Tiles {
    /// 16-lane tiles (`kernels.rs`) and rows (`norm.rs`, `geglu.rs`).
    Avx512,
    /// 8-lane tiles (`avx2.rs`) and rows (`avx2_rows.rs`).
    Avx2,
}

/// The tiles this CPU runs under `SD_CLI_CPU`'s cap, if any.
pub(in crate::ggml) fn tiles() -> Option<Tiles> {
    use crate::cpu_info::kernel_may_use;
    if kernel_may_use("avx512f") {
        Some(Tiles::Avx512)
    } else if kernel_may_use("avx2") && kernel_may_use("fma") {
        Some(Tiles::Avx2)
    } else {
        None
    }
}

/// Outputs per strip of the f32 panels these tiles read (see `pack::panel_at`): the AVX-512
/// tiles read a whole panel's row per k-step, the AVX2 ones one 16-output strip at a time.
#[cfg(target_arch = "x86_64")]
pub(in crate::ggml) fn panel_strip(tiles: Tiles) -> usize {
    match tiles {
        Tiles::Avx512 => super::NR,
        Tiles::Avx2 => super::avx2::STRIP,
    }
}

/// Whether the AVX-512-only kernels (the 16 × 16 transposes that pack panels) run.
pub(in crate::ggml) fn avx512_kernels() -> bool {
    tiles() == Some(Tiles::Avx512)
}

#[cfg(target_arch = "x86_64")]
pub(super) use entry::*;

#[cfg(target_arch = "x86_64")]
mod entry {
    use super::super::kernels::{self, Tile};
    use super::super::{avx2, NR};
    use super::Tiles;

    /// f32 products of one tile from a panel `NR` wide (see `kernels::tile_f32`).
    ///
    /// # Safety
    /// The CPU has the instructions of `tiles`; the rest as for `kernels::tile_f32`.
    pub(in crate::ggml::gemm) unsafe fn tile_f32(
        tiles: Tiles,
        kc: usize,
        xs: *const f32,
        ldx: usize,
        ws: *const f32,
        t: &Tile,
    ) {
        // SAFETY: the caller's contract, passed on.
        unsafe { tile_f32_width(tiles, (NR, kc), kc, xs, ldx, ws, t) }
    }

    /// f32 products of one tile from a panel `width` wide and `depth` deep, laid out in strips
    /// of [`super::panel_strip`] (see `kernels::tile_f32_width`); `ws` is the panel's first
    /// k-step to read (`kk0 * strip` floats into it, for a panel's strips of `strip`
    /// outputs).
    ///
    /// # Safety
    /// The CPU has the instructions of `tiles`; the rest as for `kernels::tile_f32_width`.
    pub(in crate::ggml::gemm) unsafe fn tile_f32_width(
        tiles: Tiles,
        (width, depth): (usize, usize),
        kc: usize,
        xs: *const f32,
        ldx: usize,
        ws: *const f32,
        t: &Tile,
    ) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match (tiles, width) {
                (Tiles::Avx512, NR) => kernels::tile_f32(kc, xs, ldx, ws, t),
                (Tiles::Avx512, _) => kernels::tile_f32_width(width, kc, xs, ldx, ws, t),
                (Tiles::Avx2, _) => avx2::tile_f32_strips(kc, xs, ldx, ws, depth * avx2::STRIP, t),
            }
        }
    }
}
