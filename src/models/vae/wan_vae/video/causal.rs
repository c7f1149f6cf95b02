//! Convolutions along time on a chunk of frames `[W, H, C, T]` (ggml order: the frames ride in
//! the batch slot, so the image path's per-frame ops apply unchanged).
//!
//! A causal 3-tap conv reads frames t − 2 ..= t. Frames before the chunk come from the runner's
//! named cache, where the previous chunk left its last input frames; on the first chunk there
//! are none and they count as zeros (diffusers' causal padding). Taps that would only meet those
//! zeros are skipped, so a lone first frame costs one 2D conv and gives exactly the image path's
//! result.

use crate::ggml::Tensor;
use crate::models::vae::qwen_image_2_1_vae::blocks::{conv_plain, Conv};
use crate::runner::GraphCtx;

/// Temporal taps of the causal kernels (all 3 in the Wan 2.1 VAE).
pub(crate) const DEPTH: usize = 3;

/// Frames of history a causal conv carries between chunks.
const HISTORY: usize = DEPTH - 1;

/// Frames `start .. start + len` of x [W, H, C, T] (a view).
pub(crate) fn frames<'g>(
    g: &'g GraphCtx<'g>,
    x: Tensor<'g>,
    start: usize,
    len: usize,
) -> Tensor<'g> {
    let [w, h, c, _] = x.ne();
    let nb = x.nb();
    g.view(x, [w, h, c, len], [nb[1], nb[2], nb[3]], start * nb[3])
}

/// Temporal tap `dt` of a folded kernel [K, K, DEPTH, I·O] as a 2D kernel [K, K, I, O] (the
/// image path's kernel is the last tap, built the same way).
pub(crate) fn tap<'g>(g: &'g GraphCtx<'g>, conv: &Conv, dt: usize) -> Tensor<'g> {
    let w = g.param(conv.weight);
    let (k, i, o) = (conv.kernel, conv.in_ch, conv.out_ch);
    let nb = w.nb();
    let slice = g.view(w, [k, k, 1, i * o], [nb[1], nb[2], nb[3]], dt * nb[2]);
    g.reshape(g.cont(slice), [k, k, i, o])
}

/// Adds `tap`'s 2D convs over `windows` (frames of the input each tap reads, with the count of
/// leading output frames whose input is a causal zero), then the bias; each conv as the image
/// path runs its own ([`conv_plain`]).
pub(crate) fn sum_taps<'g>(
    g: &'g GraphCtx<'g>,
    conv: &Conv,
    windows: &[(usize, Tensor<'g>, usize)],
) -> Tensor<'g> {
    let mut sum: Option<Tensor<'g>> = None;
    for &(dt, x, zeros) in windows {
        let mut y = conv_plain(g, tap(g, conv, dt), x, conv.stride, conv.padding);
        if zeros > 0 {
            y = g.pad(y, [(0, 0), (0, 0), (0, 0), (zeros, 0)]);
        }
        sum = Some(match sum {
            Some(acc) => g.add(acc, y),
            None => y,
        });
    }
    let y = sum.expect("a causal conv has at least its current-frame tap");
    g.add(y, g.reshape(g.param(conv.bias), [1, 1, conv.out_ch, 1]))
}

/// `conv` (a folded [K, K, 3, I·O] kernel) as a causal conv over frames: x [W, H, I, T] →
/// [W', H', O, T]. History comes from cache entry `key`; the last two input frames (fewer
/// while the video is shorter) are stored back under it.
pub(crate) fn causal<'g>(g: &'g GraphCtx<'g>, conv: &Conv, x: Tensor<'g>, key: &str) -> Tensor<'g> {
    let t = x.ne()[3];
    let (xp, cached) = match g.cache_get(key) {
        Some(prev) => (g.concat(prev, x, 3), prev.ne()[3]),
        None => (x, 0),
    };
    let keep = (cached + t).min(HISTORY);
    g.cache_store(key, frames(g, xp, cached + t - keep, keep));
    // Output frame j reads frame j + dt of the input padded with `missing` zero frames.
    let missing = HISTORY - cached.min(HISTORY);
    let windows: Vec<_> = (0..DEPTH)
        .filter_map(|dt| {
            let zeros = missing.saturating_sub(dt);
            (zeros < t).then(|| (dt, frames(g, xp, dt + zeros - missing, t - zeros), zeros))
        })
        .collect();
    sum_taps(g, conv, &windows)
}

/// diffusers' `upsample3d` time step on every chunk but the first: a causal conv to twice the
/// width whose two halves become consecutive frames, [W, H, C, T] → [W, H, C, 2T].
pub(crate) fn double_frames<'g>(
    g: &'g GraphCtx<'g>,
    conv: &Conv,
    x: Tensor<'g>,
    key: &str,
) -> Tensor<'g> {
    let [w, h, c, t] = x.ne();
    // [W, H, 2C, T] holds, per frame, half 0 then half 1: already frame 2t, then 2t + 1.
    g.reshape(causal(g, conv, x, key), [w, h, c, 2 * t])
}

/// diffusers' `downsample3d` time step: the first chunk passes through; a later one is
/// prefixed with the previous chunk's last frame and convolved with stride 2 and no padding,
/// [W, H, C, T] → [W, H, C, T / 2] (T even, at least 2). Which case applies is whether cache
/// entry `key` exists, as in diffusers.
pub(crate) fn halve_frames<'g>(
    g: &'g GraphCtx<'g>,
    conv: &Conv,
    x: Tensor<'g>,
    key: &str,
) -> Tensor<'g> {
    let [w, h, c, t] = x.ne();
    let prev = g.cache_get(key);
    g.cache_store(key, frames(g, x, t - 1, 1));
    let Some(prev) = prev else {
        return x;
    };
    let xp = g.concat(prev, x, 3);
    let nb = xp.nb();
    let n = (t + 1 - DEPTH) / 2 + 1;
    let windows: Vec<_> = (0..DEPTH)
        .map(|dt| {
            // Frames dt, dt + 2, …: a strided view, copied so the conv reads it densely.
            let v = g.view(xp, [w, h, c, n], [nb[1], nb[2], 2 * nb[3]], dt * nb[3]);
            (dt, g.cont(v), 0)
        })
        .collect();
    sum_taps(g, conv, &windows)
}
