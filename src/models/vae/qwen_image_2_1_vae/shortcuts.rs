//! The parameter-free shortcuts around each resolution change, specialised to one frame.
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

    /// Checks the channel arithmetic of a down shortcut (`in·factor` splits into `out` groups).
    pub fn check_down(&self, key: &str) -> Result<(), RunnerError> {
        let total = self.in_ch * self.factor();
        if self.out_ch == 0 || !total.is_multiple_of(self.out_ch) {
            return Err(bad_widths(key, total, self.out_ch));
        }
        Ok(())
    }

    /// Checks the channel arithmetic of an up shortcut (`out·factor` is a multiple of `in`).
    pub fn check_up(&self, key: &str) -> Result<(), RunnerError> {
        let total = self.out_ch * self.factor();
        if self.in_ch == 0 || !total.is_multiple_of(self.in_ch) {
            return Err(bad_widths(key, total, self.in_ch));
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
        let [w, h, c, n] = x.ne();
        let spatial = FACTOR_S * FACTOR_S;
        let factor = self.factor();
        let repeats = self.out_ch * factor / c;
        // Output channel o, sub-pixel s reads the kept frame (t = factor_t − 1) of the
        // duplicated channels: input channel (o·factor + t·4 + s) / repeats.
        let t = self.factor_t - 1;
        let mut ids: Vec<i32> = (0..self.out_ch)
            .flat_map(|o| {
                (0..spatial).map(move |s| ((o * factor + t * spatial + s) / repeats) as i32)
            })
            .collect();
        let per_batch = ids.len();
        ids = ids.repeat(n);
        let ids = g.input_i32(name, [per_batch, n, 1, 1], ids);
        let rows = g.get_rows(g.reshape(x, [w * h, c, n, 1]), ids);
        depth_to_space(g, g.reshape(rows, [w, h, spatial * self.out_ch, n]))
    }
}

fn bad_widths(key: &str, total: usize, by: usize) -> RunnerError {
    RunnerError::BadData {
        key: key.to_string(),
        origin: "Qwen Image 2.1 VAE weights".into(),
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
