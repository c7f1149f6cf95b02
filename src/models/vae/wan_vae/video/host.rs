//! Moving frames between a whole clip on the host, `[W, H, F, C]` (ggml order, PyTorch
//! `[C, F, H, W]`), and the chunks the graphs work on, `[W, H, C, n]` (frames in the batch slot).

use crate::tensor::HostTensor;

/// Frames `start .. start + len` of `clip` as a chunk [W, H, C, len].
pub(crate) fn take_frames(clip: &HostTensor, start: usize, len: usize) -> Vec<f32> {
    let [w, h, f, c] = clip.ne;
    let plane = w * h;
    let mut out = Vec::with_capacity(plane * c * len);
    for k in start..start + len {
        for ch in 0..c {
            let at = (ch * f + k) * plane;
            out.extend_from_slice(&clip.data[at..at + plane]);
        }
    }
    out
}

/// Writes `chunk` [W, H, C, n] into frames `start .. start + n` of `clip` [W, H, F, C].
pub(crate) fn put_frames(clip: &mut HostTensor, start: usize, chunk: &HostTensor) {
    let [w, h, f, _] = clip.ne;
    let [_, _, c, n] = chunk.ne;
    let plane = w * h;
    for k in 0..n {
        for ch in 0..c {
            let from = (k * c + ch) * plane;
            let to = (ch * f + start + k) * plane;
            clip.data[to..to + plane].copy_from_slice(&chunk.data[from..from + plane]);
        }
    }
}
