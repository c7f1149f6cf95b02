//! Video latents ↔ patch tokens, in the graph.
//!
//! A latent [W, H, T, C] (ggml order) with patch (pt, ph, pw) is, fastest first,
//! [iw, w', ih, h', it, t', c]. Tokens run over (t', h', w') with w' fastest (Conv3d's
//! output flattened). Input token features follow the Conv3d kernel [D, C, pt, ph, pw]:
//! (iw, ih, it, c) fastest first; output features follow diffusers' unpatchify: (c, iw,
//! ih, it). Each step below swaps two neighbouring groups with one 4-D permute.

use crate::ggml::Tensor;
use crate::runner::GraphCtx;

/// Swaps dims 1 and 2 of `x` viewed as `ne`, as a contiguous copy.
fn swap12<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>, ne: [usize; 4]) -> Tensor<'g> {
    g.cont(g.permute(g.reshape(x, ne), [0, 2, 1, 3]))
}

/// Patch grid (frames, rows, columns) of a latent [W, H, T, C] already padded to whole
/// patches.
pub(super) fn grid(ne: [usize; 4], patch: [usize; 3]) -> [usize; 3] {
    let [pt, ph, pw] = patch;
    [ne[2] / pt, ne[1] / ph, ne[0] / pw]
}

/// Zero padding (at the end of each axis) up to whole patches, as upstream.
pub(super) fn pad<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>, patch: [usize; 3]) -> Tensor<'g> {
    let [w, h, t, _] = x.ne();
    let [pt, ph, pw] = patch;
    let more = |n: usize, p: usize| n.next_multiple_of(p) - n;
    let (dw, dh, dt) = (more(w, pw), more(h, ph), more(t, pt));
    if dw + dh + dt == 0 {
        return x;
    }
    g.pad(x, [(0, dw), (0, dh), (0, dt), (0, 0)])
}

/// x [W, H, T, C] (whole patches) → tokens [pw·ph·pt·C, N].
pub(super) fn patchify<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>, patch: [usize; 3]) -> Tensor<'g> {
    let [_, h, t, c] = x.ne();
    let [pt, ph, pw] = patch;
    let [ft, fh, fw] = grid(x.ne(), patch);
    let n = ft * fh * fw;
    // → [iw, ih, w', h', it, t', c]
    let x = swap12(g, g.cont(x), [pw, fw, ph, h / ph * t * c]);
    // → [iw, ih, it, w', h', t', c]
    let x = if pt > 1 {
        swap12(g, x, [pw * ph, fw * fh, pt, ft * c])
    } else {
        x
    };
    // → [iw, ih, it, c, w', h', t']
    let x = swap12(g, x, [pw * ph * pt, n, c, 1]);
    g.reshape(x, [pw * ph * pt * c, n, 1, 1])
}

/// tokens [C·pt·ph·pw, N] (channel fastest) → [W, H, T, C] for patch grid `grid`.
pub(super) fn unpatchify<'g>(
    g: &'g GraphCtx<'g>,
    y: Tensor<'g>,
    patch: [usize; 3],
    grid: [usize; 3],
) -> Tensor<'g> {
    let [pt, ph, pw] = patch;
    let [ft, fh, fw] = grid;
    let n = ft * fh * fw;
    let a = pt * ph * pw;
    let c = y.ne()[0] / a;
    // [c, iw·ih·it, N] → [iw, ih, it, w', h', t', c]
    let y = g.cont(g.permute(g.reshape(y, [c, a, n, 1]), [2, 0, 1, 3]));
    // → [iw, w', ih, it, h', t', c]
    let y = swap12(g, y, [pw, ph * pt, fw, fh * ft * c]);
    // → [iw, w', ih, h', it, t', c]
    let y = if pt > 1 {
        swap12(g, y, [pw * fw * ph, pt, fh, ft * c])
    } else {
        y
    };
    g.reshape(y, [pw * fw, ph * fh, pt * ft, c])
}

/// The leading [W, H, T] of `y` [W', H', T', C] (drops patch padding).
pub(super) fn crop<'g>(g: &'g GraphCtx<'g>, y: Tensor<'g>, wht: [usize; 3]) -> Tensor<'g> {
    let [w0, h0, t0, c] = y.ne();
    let [w, h, t] = wht;
    if [w, h, t] == [w0, h0, t0] {
        return y;
    }
    let es = 4;
    let nb = [w0 * es, w0 * h0 * es, w0 * h0 * t0 * es];
    g.cont(g.view(y, [w, h, t, c], nb, 0))
}
