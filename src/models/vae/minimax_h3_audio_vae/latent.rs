//! Audio latent normalisation as the MiniMax-H3 pipeline applies it: the transformer works
//! on `(z − mean) / std` per latent channel (diffusers `MiniMaxH3AudioDecodeStep` and the
//! reference-audio encode step), the VAE on raw `z`. Latents are `[T, C, S]` (ggml order;
//! PyTorch's `[S, C, T]`, one batch item per stereo channel).

use crate::models::vae::qwen_image_2_1_vae::LatentStats;
use crate::runner::RunnerError;
use crate::tensor::HostTensor;

fn apply(
    stats: &LatentStats,
    x: &mut HostTensor,
    f: impl Fn(f32, f32, f32) -> f32,
) -> Result<(), RunnerError> {
    let [t, c, _, n3] = x.ne;
    if c != stats.channels() || n3 != 1 || !x.is_consistent() {
        return Err(RunnerError::InputSize {
            name: format!("audio latent [T, {}, S]", stats.channels()),
            ne: x.ne,
            got: x.data.len(),
        });
    }
    if t == 0 {
        return Ok(());
    }
    for (row, values) in x.data.chunks_mut(t).enumerate() {
        let ch = row % c;
        let (m, s) = (stats.mean()[ch], stats.std()[ch]);
        values.iter_mut().for_each(|v| *v = f(*v, m, s));
    }
    Ok(())
}

/// VAE latent → transformer space, in place: `(z − mean) / std`; `z`: `[T, C, S]`.
pub fn normalize(stats: &LatentStats, z: &mut HostTensor) -> Result<(), RunnerError> {
    apply(stats, z, |v, m, s| (v - m) / s)
}

/// Transformer space → VAE latent, in place: `x · std + mean`; `x`: `[T, C, S]`.
pub fn denormalize(stats: &LatentStats, x: &mut HostTensor) -> Result<(), RunnerError> {
    apply(stats, x, |v, m, s| v * s + m)
}

/// Swaps the two innermost axes of `x` `[A, B, N]`: the VAE's latent `[T, C, S]` ↔ the
/// transformer's audio tokens `[C, T, S]` (one row of C channels per latent frame, the stereo
/// channels as consecutive blocks of T rows, as diffusers packs them channel-major).
pub fn swap_time_and_channels(x: &HostTensor) -> Result<HostTensor, RunnerError> {
    if !x.is_consistent() {
        return Err(RunnerError::InputSize {
            name: "audio latent".into(),
            ne: x.ne,
            got: x.data.len(),
        });
    }
    let [a, b, n, m] = x.ne;
    let mut out = vec![0.0; x.data.len()];
    for k in 0..n * m {
        let (src, dst) = (
            &x.data[k * a * b..(k + 1) * a * b],
            &mut out[k * a * b..(k + 1) * a * b],
        );
        for j in 0..b {
            for i in 0..a {
                dst[i * b + j] = src[j * a + i];
            }
        }
    }
    Ok(HostTensor {
        ne: [b, a, n, m],
        data: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_is_a_transpose_per_stream() {
        // [T 3, C 2, S 2] → [C 2, T 3, S 2].
        let x = HostTensor::new([3, 2, 2, 1], (0..12).map(|v| v as f32).collect()).unwrap();
        let y = swap_time_and_channels(&x).unwrap();
        assert_eq!(y.ne, [2, 3, 2, 1]);
        assert_eq!(&y.data[..6], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(swap_time_and_channels(&y).unwrap().data, x.data);
        let ragged = HostTensor {
            ne: [3, 2, 1, 1],
            data: vec![0.0; 5],
        };
        assert!(swap_time_and_channels(&ragged).is_err());
    }

    #[test]
    fn round_trip_per_channel() {
        let stats = LatentStats::new(vec![1.0, -2.0], vec![2.0, 0.5]).unwrap();
        // T = 2, C = 2, S = 2.
        let mut z =
            HostTensor::new([2, 2, 2, 1], vec![3.0, 5.0, -2.0, -1.0, 1.0, 1.0, 0.0, 0.0]).unwrap();
        let orig = z.clone();
        normalize(&stats, &mut z).unwrap();
        assert_eq!(z.data, vec![1.0, 2.0, 0.0, 2.0, 0.0, 0.0, 4.0, 4.0]);
        denormalize(&stats, &mut z).unwrap();
        assert_eq!(z.data, orig.data);
        let mut wrong = HostTensor::zeros([2, 3, 1, 1]);
        assert!(normalize(&stats, &mut wrong).is_err());
    }
}
