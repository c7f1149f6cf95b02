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

#[cfg(test)]
mod tests {
    use super::*;

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
