//! The Wan 2.2 VAE's pixel patching: each `p × p` block of pixels becomes `p²` channels before
//! the encoder, and back after the decoder.
//!
//! Channel order follows diffusers' `patchify` / `unpatchify` (and the original Wan code's
//! `b c f (h q) (w r) -> b (c r q) f h w`): channel `c·p² + sw·p + sh`, the column offset `sw`
//! outer, the row offset `sh` inner.

use crate::ggml::Tensor;
use crate::runner::GraphCtx;

/// x [W, H, C, N] → [W/p, H/p, C·p², N] (W, H multiples of p).
pub(super) fn patchify<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>, p: usize) -> Tensor<'g> {
    if p == 1 {
        return x;
    }
    let [w, h, c, n] = x.ne();
    let (wp, hp) = (w / p, h / p);
    // [sw, x', sh, rest] -> [x', sh, sw, rest]
    let x = g.reshape(x, [p, wp, p, hp * c * n]);
    let x = g.cont(g.permute(x, [2, 0, 1, 3]));
    // [x', (sh sw), y', CN] -> [x', y', (sh sw), CN]
    let x = g.reshape(x, [wp, p * p, hp, c * n]);
    let x = g.cont(g.permute(x, [0, 2, 1, 3]));
    g.reshape(x, [wp, hp, p * p * c, n])
}

/// x [w, h, C·p², N] → [w·p, h·p, C, N]; the inverse of [`patchify`].
pub(super) fn unpatchify<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>, p: usize) -> Tensor<'g> {
    if p == 1 {
        return x;
    }
    let [w, h, cp, n] = x.ne();
    let c = cp / (p * p);
    // [x', y', (sh sw), CN] -> [x', (sh sw), y', CN]
    let x = g.reshape(x, [w, h, p * p, c * n]);
    let x = g.cont(g.permute(x, [0, 2, 1, 3]));
    // [x', sh, sw, rest] -> [sw, x', sh, rest]
    let x = g.reshape(x, [w, p, p, h * c * n]);
    let x = g.cont(g.permute(x, [1, 2, 0, 3]));
    g.reshape(x, [w * p, h * p, c, n])
}
