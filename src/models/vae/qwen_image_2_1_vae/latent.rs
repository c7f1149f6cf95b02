//! Latent normalisation of Qwen Image 2.1: the transformer works on `(z − mean) / std` per
//! latent channel, the VAE on raw `z`.

use crate::ggml::Tensor;
use crate::runner::{GraphCtx, RunnerError};
use crate::tensor::HostTensor;

/// Per-channel latent mean of the released Qwen Image 2.1 VAE (64 channels).
// Measured statistics; -0.5236 only looks like π/6.
#[allow(clippy::approx_constant)]
pub const LATENTS_MEAN: [f32; 64] = [
    0.5126, 0.7721, -0.0631, 1.3506, -0.7855, -2.1025, -0.3458, 1.3722, //
    1.8873, -1.7177, -0.651, 0.2732, 0.7562, -0.6163, -1.0277, 3.8363, //
    2.021, 0.0472, 0.932, 2.0087, 2.4954, -0.1391, -1.4249, 1.8464, //
    -0.5236, 1.2826, 3.7046, -1.3035, 2.7286, -1.4518, -1.9036, -1.9955, //
    -0.0342, -1.0265, -0.7636, 3.0555, 0.0746, -3.0751, -0.1076, 1.7376, //
    -1.0914, -1.9435, -0.2784, -1.368, 0.4809, -0.4433, 0.3764, 0.5729, //
    -2.0595, 1.096, -1.326, -2.0211, -5.0179, 0.5275, 4.0162, 1.8505, //
    0.3026, 1.9373, 1.4937, 0.2632, 0.5547, -1.7121, -0.1562, 0.0304,
];

/// Per-channel latent standard deviation of the released Qwen Image 2.1 VAE (64 channels).
pub const LATENTS_STD: [f32; 64] = [
    3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.791, //
    3.0785, 3.65, 3.9308, 3.0904, 2.8778, 3.7675, 3.732, 5.0756, //
    3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489, //
    3.4896, 3.8513, 3.9323, 3.4719, 3.7498, 4.283, 3.5694, 4.2467, //
    3.9037, 3.2947, 5.077, 3.5075, 3.27, 3.4767, 2.8063, 5.1125, //
    3.5327, 4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875, //
    3.9624, 4.0168, 3.5643, 4.055, 5.5614, 4.2963, 4.408, 3.4959, //
    3.8747, 3.7608, 3.5735, 3.149, 3.7662, 3.6746, 3.4563, 3.8161,
];

/// Per-channel latent statistics: transformer space = `(z − mean) / std`.
#[derive(Clone, Debug, PartialEq)]
pub struct LatentStats {
    mean: Vec<f32>,
    std: Vec<f32>,
}

fn bad_stats(reason: String) -> RunnerError {
    RunnerError::BadData {
        key: "latents_mean/latents_std".into(),
        origin: "Qwen Image 2.1 VAE config".into(),
        reason,
    }
}

impl LatentStats {
    /// Statistics of `mean.len()` channels; every std must be finite and non-zero.
    pub fn new(mean: Vec<f32>, std: Vec<f32>) -> Result<Self, RunnerError> {
        if mean.is_empty() || mean.len() != std.len() {
            return Err(bad_stats(format!(
                "{} means for {} standard deviations",
                mean.len(),
                std.len()
            )));
        }
        if let Some(s) = std.iter().find(|s| !s.is_finite() || **s == 0.0) {
            return Err(bad_stats(format!("standard deviation {s}")));
        }
        if let Some(m) = mean.iter().find(|m| !m.is_finite()) {
            return Err(bad_stats(format!("mean {m}")));
        }
        Ok(Self { mean, std })
    }

    /// The released model's statistics ([`LATENTS_MEAN`], [`LATENTS_STD`]).
    pub fn released() -> Self {
        Self {
            mean: LATENTS_MEAN.to_vec(),
            std: LATENTS_STD.to_vec(),
        }
    }

    /// `latents_mean` / `latents_std` of a diffusers `config.json`; `None` when either is absent.
    pub fn from_diffusers_config(config: &serde_json::Value) -> Option<Result<Self, RunnerError>> {
        let list = |key: &str| -> Option<Result<Vec<f32>, RunnerError>> {
            let values = config.get(key)?.as_array()?;
            Some(
                values
                    .iter()
                    .map(|v| {
                        v.as_f64()
                            .map(|f| f as f32)
                            .ok_or_else(|| bad_stats(format!("{key} holds a non-number {v}")))
                    })
                    .collect(),
            )
        };
        let mean = list("latents_mean")?;
        let std = list("latents_std")?;
        Some(mean.and_then(|m| std.and_then(|s| Self::new(m, s))))
    }

    pub fn channels(&self) -> usize {
        self.mean.len()
    }

    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    pub fn std(&self) -> &[f32] {
        &self.std
    }

    fn check(&self, ne: [usize; 4]) -> Result<(), RunnerError> {
        if ne[2] != self.channels() {
            return Err(RunnerError::InputSize {
                name: format!("latent with {} channels", self.channels()),
                ne,
                got: ne.iter().product(),
            });
        }
        Ok(())
    }

    fn map(&self, x: &mut HostTensor, f: impl Fn(f32, f32, f32) -> f32) -> Result<(), RunnerError> {
        self.check(x.ne)?;
        let [w, h, c, _] = x.ne;
        let plane = w * h;
        for (i, chunk) in x.data.chunks_mut(plane).enumerate() {
            let ch = i % c;
            let (m, s) = (self.mean[ch], self.std[ch]);
            chunk.iter_mut().for_each(|v| *v = f(*v, m, s));
        }
        Ok(())
    }

    /// VAE latent → transformer space, in place: `(z − mean) / std`. `z`: [w, h, C, N].
    pub fn normalize(&self, z: &mut HostTensor) -> Result<(), RunnerError> {
        self.map(z, |v, m, s| (v - m) / s)
    }

    /// Transformer space → VAE latent, in place: `x · std + mean`. `x`: [w, h, C, N].
    pub fn denormalize(&self, x: &mut HostTensor) -> Result<(), RunnerError> {
        self.map(x, |v, m, s| v * s + m)
    }

    fn graph_inputs<'g>(&self, g: &'g GraphCtx<'g>) -> (Tensor<'g>, Tensor<'g>) {
        let ne = [1, 1, self.channels(), 1];
        (
            g.input_f32("qwen_vae.latents_mean", ne, self.mean.clone()),
            g.input_f32("qwen_vae.latents_std", ne, self.std.clone()),
        )
    }

    /// [`normalize`](Self::normalize) inside a graph; `z`: [w, h, C, N] with C = channels.
    pub fn normalize_graph<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        let (m, s) = self.graph_inputs(g);
        g.div(g.sub(z, m), s)
    }

    /// [`denormalize`](Self::denormalize) inside a graph; `x`: [w, h, C, N] with C = channels.
    pub fn denormalize_graph<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let (m, s) = self.graph_inputs(g);
        g.add(g.mul(x, s), m)
    }
}
