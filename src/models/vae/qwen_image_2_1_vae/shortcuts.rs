//! The parameter-free shortcuts around each resolution change (diffusers `AvgDown3D` /
//! `DupUp3D`), on single frames and on clips.
//!
//! Both are defined on clips `[C, T, H, W]`: the down shortcut folds `factor_t` frames and a
//! 2×2 pixel block into channels and averages groups of them, the up shortcut does the reverse
//! with channel duplication. On a single image the clip is one frame, and the temporal part
//! does not vanish:
//! - down (`factor_t = 2`): one zero frame is padded in front, so the folded channels
//!   `c·8 + t·4 + s` hold zeros for `t = 0` and the pixels for `t = 1`, and the group means mix
//!   those zeros in;
//! - up (`factor_t = 2`): of the two frames produced only the second is kept, i.e. the folded
//!   channels with `t = 1`.
//!
//! [`Shortcut::down`] / [`Shortcut::up`] take a batch of single images `[W, H, C, N]`;
//! [`Shortcut::down_frames`] / [`Shortcut::up_frames`] take one clip's frames in the batch slot
//! (the Wan 2.2 VAE's video chunks).

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, RunnerError};

/// Spatial factor of every shortcut that changes resolution.
const FACTOR_S: usize = 2;

/// Parameters of one shortcut: channel widths and temporal factor (1 or 2).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shortcut {
    pub in_ch: usize,
    pub out_ch: usize,
    pub factor_t: usize,
    /// Spatial factor: 2 when the resolution changes, 1 otherwise (down shortcut only).
    pub factor_s: usize,
}

impl Shortcut {
    fn factor(&self) -> usize {
        self.factor_t * self.factor_s * self.factor_s
    }

    /// Checks the channel arithmetic of a down shortcut (`in·factor` splits into `out` groups);
    /// `origin` names the weights in the error.
    pub fn check_down(&self, key: &str, origin: &str) -> Result<(), RunnerError> {
        let total = self.in_ch * self.factor();
        if self.out_ch == 0 || !total.is_multiple_of(self.out_ch) {
            return Err(bad_widths(key, origin, total, self.out_ch));
        }
        Ok(())
    }

    /// Checks the channel arithmetic of an up shortcut (`out·factor` is a multiple of `in`);
    /// `origin` names the weights in the error.
    pub fn check_up(&self, key: &str, origin: &str) -> Result<(), RunnerError> {
        let total = self.out_ch * self.factor();
        if self.in_ch == 0 || !total.is_multiple_of(self.in_ch) {
            return Err(bad_widths(key, origin, total, self.in_ch));
        }
        Ok(())
    }

    /// Down shortcut: x [W, H, in, N] → [W/fs, H/fs, out, N] (W, H multiples of fs).
    pub fn down<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [w, h, c, n] = x.ne();
        let fs = self.factor_s;
        let (w2, h2) = (w / fs, h / fs);
        let x = if fs == FACTOR_S {
            space_to_depth(g, x)
        } else {
            x
        };
        let spatial = fs * fs;
        // Zero frames in front: folded channel c·factor + t·spatial + s.
        let pad = (self.factor_t - 1) * spatial;
        let x = if pad > 0 {
            let x = g.reshape(x, [w2 * h2, spatial, c, n]);
            g.pad(x, [(0, 0), (pad, 0), (0, 0), (0, 0)])
        } else {
            x
        };
        self.group_mean(g, x, [w2, h2], c, n)
    }

    /// Down shortcut over the frames of one clip: x [W, H, in, T] (frames in the batch slot) →
    /// [W/fs, H/fs, out, ⌈T/ft⌉]. Zero frames are padded in front up to a multiple of `factor_t`
    /// (diffusers' `AvgDown3D`); one frame gives [`down`](Self::down)'s result.
    pub fn down_frames<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [w, h, c, t] = x.ne();
        let (fs, ft) = (self.factor_s, self.factor_t);
        let (w2, h2) = (w / fs, h / fs);
        let x = if fs == FACTOR_S {
            space_to_depth(g, x)
        } else {
            x
        };
        let pad = (ft - t % ft) % ft;
        let x = if pad > 0 {
            g.pad(x, [(0, 0), (0, 0), (0, 0), (pad, 0)])
        } else {
            x
        };
        let n = (t + pad) / ft;
        // Frame τ·ft + k: [P·s, C, k, τ] -> [P·s, k, C, τ], folded channel c·factor + k·fs² + s.
        let x = if ft > 1 {
            let x = g.reshape(x, [w2 * h2 * fs * fs, c, ft, n]);
            g.cont(g.permute(x, [0, 2, 1, 3]))
        } else {
            x
        };
        self.group_mean(g, x, [w2, h2], c, n)
    }

    /// The channel-group means of folded pixels x (per output pixel, `in·factor` folded
    /// channels in order) → [w2, h2, out, n].
    fn group_mean<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        [w2, h2]: [usize; 2],
        c: usize,
        n: usize,
    ) -> Tensor<'g> {
        let group = c * self.factor() / self.out_ch;
        if group == 1 {
            return g.reshape(x, [w2, h2, self.out_ch, n]);
        }
        // [P, group, out, N] -> [group, P, out, N], mean over ne[0].
        let x = g.reshape(x, [w2 * h2, group, self.out_ch, n]);
        let x = g.mean(g.cont(g.permute(x, [1, 0, 2, 3])));
        g.reshape(x, [w2, h2, self.out_ch, n])
    }

    /// Up shortcut: x [w, h, in, N] → [2w, 2h, out, N]. `name` labels the index input.
    pub fn up<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>, name: &str) -> Tensor<'g> {
        self.up_frames(g, x, name, true)
    }

    /// Up shortcut over frames: x [w, h, in, T] → [2w, 2h, out, T·factor_t], each input frame
    /// giving `factor_t` consecutive frames; with `first`, only the last of them (diffusers'
    /// `DupUp3D` on the first chunk, whose single frame drops `factor_t − 1` leading frames;
    /// likewise each image of a batch). `name` labels the index input.
    pub fn up_frames<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        name: &str,
        first: bool,
    ) -> Tensor<'g> {
        let [w, h, c, n] = x.ne();
        let spatial = FACTOR_S * FACTOR_S;
        let factor = self.factor();
        let repeats = self.out_ch * factor / c;
        let out_ch = self.out_ch;
        let from = if first { self.factor_t - 1 } else { 0 };
        let kept = self.factor_t - from;
        // Output frame t, channel o, sub-pixel s of an input frame reads the duplicated channel
        // o·factor + t·4 + s, i.e. input channel (o·factor + t·4 + s) / repeats.
        let ids: Vec<i32> = (from..self.factor_t)
            .flat_map(|t| {
                (0..out_ch).flat_map(move |o| {
                    (0..spatial).map(move |s| ((o * factor + t * spatial + s) / repeats) as i32)
                })
            })
            .collect();
        let per_frame = ids.len();
        let ids = g.input_i32(name, [per_frame, n, 1, 1], ids.repeat(n));
        // [w·h, per_frame, n]: per input frame, `kept` frames of [w, h, 4·out].
        let rows = g.get_rows(g.reshape(x, [w * h, c, n, 1]), ids);
        depth_to_space(g, g.reshape(rows, [w, h, spatial * out_ch, kept * n]))
    }
}

fn bad_widths(key: &str, origin: &str, total: usize, by: usize) -> RunnerError {
    RunnerError::BadData {
        key: key.to_string(),
        origin: origin.into(),
        reason: format!(
            "the resampling shortcut cannot split {total} folded channels by {by}; \
             the channel widths do not fit this architecture"
        ),
    }
}

/// [2w, 2h, C, N] → [w, h, 4C, N] with channel `c·4 + sh·2 + sw`.
fn space_to_depth<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
    let [w, h, c, n] = x.ne();
    let (w2, h2) = (w / 2, h / 2);
    // rows y = 2·y' + sh: [W, sh, y', CN] -> [W, y', sh, CN]
    let x = g.reshape(x, [w, 2, h2, c * n]);
    let x = g.cont(g.permute(x, [0, 2, 1, 3]));
    // columns x = 2·x' + sw: [sw, x', y', sh·CN] -> [x', y', sw, sh·CN]
    let x = g.reshape(x, [2, w2, h2, 2 * c * n]);
    let x = g.cont(g.permute(x, [2, 0, 1, 3]));
    g.reshape(x, [w2, h2, 4 * c, n])
}

/// [w, h, 4C, N] with channel `c·4 + sh·2 + sw` → [2w, 2h, C, N].
fn depth_to_space<'g>(g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
    let [w, h, c4, n] = x.ne();
    let c = c4 / 4;
    // [x, y, sw, sh·CN] -> [sw, x, y, sh·CN]
    let x = g.reshape(x, [w, h, 2, 2 * c * n]);
    let x = g.cont(g.permute(x, [1, 2, 0, 3]));
    // [X, y, sh, CN] -> [X, sh, y, CN]
    let x = g.reshape(x, [2 * w, h, 2, c * n]);
    let x = g.cont(g.permute(x, [0, 2, 1, 3]));
    g.reshape(x, [2 * w, 2 * h, c, n])
}
