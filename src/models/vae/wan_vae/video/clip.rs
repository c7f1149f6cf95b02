//! The host loops that run a whole clip chunk by chunk, shared by the Wan 2.1 and 2.2 VAEs:
//! they differ only in what one chunk's graph does, which the caller passes in.

use crate::ggml::Tensor;
use crate::progress::Progress;
use crate::runner::{GraphCtx, Runner, RunnerError};
use crate::tensor::HostTensor;

use super::host::{put_frames, take_frames};
use super::ENCODE_CHUNK_FRAMES;

/// Runs `f` with the cache entries under `prefix` cleared before and after (also when it
/// fails), so no history leaks from one clip into the next.
fn with_clean_cache<T>(
    runner: &Runner,
    prefix: &str,
    f: impl FnOnce() -> Result<T, RunnerError>,
) -> Result<T, RunnerError> {
    runner.clear_cache(prefix);
    let result = f();
    runner.clear_cache(prefix);
    result
}

/// A bar for clips of more than one chunk.
fn progress(label: &str, chunks: usize) -> Option<Progress> {
    (chunks > 1).then(|| Progress::new(label, chunks))
}

/// The one output of a chunk's graph, checked against the shape the host loop expects.
fn single(mut out: Vec<HostTensor>, want: [usize; 4]) -> Result<HostTensor, RunnerError> {
    match out.pop() {
        Some(t) if out.is_empty() && t.ne == want => Ok(t),
        got => Err(RunnerError::Internal(format!(
            "Wan VAE video chunk: expected one {want:?} output, got {:?}",
            got.map(|t| t.ne)
        ))),
    }
}

/// Where a clip runs: the runner holding the VAE's weights, the cache prefix of its causal
/// history and its spatial scale factor.
pub(crate) struct ChunkLoop<'a> {
    pub runner: &'a Runner,
    pub cache: &'a str,
    pub scale: usize,
}

impl ChunkLoop<'_> {
    /// Decodes latent z [w, h, T, c] one latent frame per graph into frames
    /// [f·w, f·h, 1 + per·(T − 1), out_ch]. `chunk` maps one input latent frame [w, h, c, 1]
    /// to its frames [f·w, f·h, out_ch, n] (n = 1 on the `first` chunk, else `per`).
    pub(crate) fn decode<F>(
        &self,
        z: &HostTensor,
        per: usize,
        out_ch: usize,
        chunk: F,
    ) -> Result<HostTensor, RunnerError>
    where
        F: for<'g> Fn(&'g GraphCtx<'g>, Tensor<'g>, bool) -> Tensor<'g>,
    {
        let [w, h, t, c] = z.ne;
        let f = self.scale;
        let video_frames = |latent: usize| 1 + latent.saturating_sub(1) * per;
        let mut out = HostTensor::zeros([f * w, f * h, video_frames(t), out_ch]);
        let mut bar = progress("VAE decode (video)", t);
        with_clean_cache(self.runner, self.cache, || {
            for i in 0..t {
                let first = i == 0;
                let data = take_frames(z, i, 1);
                let got = self
                    .runner
                    .compute(|g| vec![chunk(g, g.input_f32("z", [w, h, c, 1], data), first)])?;
                let n = if first { 1 } else { per };
                let frames = single(got, [f * w, f * h, out_ch, n])?;
                put_frames(&mut out, video_frames(i + 1) - n, &frames);
                if let Some(bar) = &mut bar {
                    bar.tick();
                }
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Encodes frames x [W, H, F, c] (F = 1 + 4k, checked by the caller) into the mean
    /// [W/f, H/f, latent, z]: the first frame alone, then four frames per graph. `chunk` maps
    /// one input chunk [W, H, c, len] to its mean [W/f, H/f, z, n] (n = 1 on the first chunk,
    /// else `per`).
    pub(crate) fn encode<F>(
        &self,
        x: &HostTensor,
        per: usize,
        [latent, z]: [usize; 2],
        chunk: F,
    ) -> Result<HostTensor, RunnerError>
    where
        F: for<'g> Fn(&'g GraphCtx<'g>, Tensor<'g>) -> Tensor<'g>,
    {
        let [w, h, frames, c] = x.ne;
        let f = self.scale;
        let mut out = HostTensor::zeros([w / f, h / f, latent, z]);
        let chunks = 1 + (frames - 1) / ENCODE_CHUNK_FRAMES;
        let mut bar = progress("VAE encode (video)", chunks);
        with_clean_cache(self.runner, self.cache, || {
            for i in 0..chunks {
                // Frames [0, 1), then [1 + 4(i − 1), 1 + 4i).
                let (start, len, n) = match i {
                    0 => (0, 1, 1),
                    _ => (1 + ENCODE_CHUNK_FRAMES * (i - 1), ENCODE_CHUNK_FRAMES, per),
                };
                let data = take_frames(x, start, len);
                let got = self
                    .runner
                    .compute(|g| vec![chunk(g, g.input_f32("x", [w, h, c, len], data))])?;
                let mean = single(got, [w / f, h / f, z, n])?;
                put_frames(&mut out, if i == 0 { 0 } else { 1 + (i - 1) * per }, &mean);
                if let Some(bar) = &mut bar {
                    bar.tick();
                }
            }
            Ok(())
        })?;
        Ok(out)
    }
}
