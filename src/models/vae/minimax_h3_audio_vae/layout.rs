//! The two spellings of a MiniMax-H3 audio VAE checkpoint, and a weight source that serves
//! both under one set of names.
//!
//! The module paths are the same in both (diffusers keeps the original names); they differ
//! in how weight-normalised convolutions are stored and where the latent statistics live:
//!
//! * diffusers (`audio_vae/diffusion_pytorch_model.safetensors` + `config.json`): each
//!   weight-normalised convolution as `weight_g` (magnitude, `[D0, 1, 1]`) and `weight_v`
//!   (direction, the kernel's shape), or as PyTorch's newer parametrization
//!   `parametrizations.weight.original0` / `original1`; statistics in `config.json`;
//! * original (Comfy-Org `minimax_h3_audio_vae_fp32.safetensors`, what stable-diffusion.cpp
//!   reads): the folded `weight`, and `latents_mean` / `latents_std` tensors.
//!
//! [`AudioVaeSource`] folds `w = g · v / ‖v‖` (the norm over every dimension but PyTorch's
//! first, as `torch.nn.utils.weight_norm(dim=0)`) when a `weight` is asked for that the file
//! keeps as a pair, so the model declares plain `weight`s whatever the layout.

use std::borrow::Cow;

use crate::dtype::DType;
use crate::runner::{SourceTensor, WeightSource};

/// Weight naming of a MiniMax-H3 audio VAE checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AudioVaeLayout {
    /// diffusers `AutoencoderKLMiniMaxH3Audio`: weight-norm pairs, statistics in `config.json`.
    Diffusers,
    /// The original single file: folded kernels, `latents_mean` / `latents_std` tensors.
    Original,
}

/// (magnitude, direction) suffixes of a weight-normalised `weight`, in the spellings PyTorch
/// has used.
const WEIGHT_NORM_PAIRS: [(&str, &str); 2] = [
    ("weight_g", "weight_v"),
    (
        "parametrizations.weight.original0",
        "parametrizations.weight.original1",
    ),
];

/// A weight source that serves a weight-norm pair as its folded `weight`.
pub struct AudioVaeSource<'s> {
    inner: &'s dyn WeightSource,
}

impl<'s> AudioVaeSource<'s> {
    pub fn new(inner: &'s dyn WeightSource) -> Self {
        Self { inner }
    }

    /// The layout of the weights: diffusers when the encoder's or decoder's input convolution
    /// is a weight-norm pair, original when it is a plain `weight`; `None` when neither is
    /// there (not a MiniMax-H3 audio VAE).
    pub fn layout(&self) -> Option<AudioVaeLayout> {
        let mut plain = false;
        for conv in ["encoder.block.0", "decoder.conv_pre"] {
            if self.pair(&format!("{conv}.weight")).is_some() {
                return Some(AudioVaeLayout::Diffusers);
            }
            plain |= self.inner.contains(&format!("{conv}.weight"));
        }
        plain.then_some(AudioVaeLayout::Original)
    }

    /// All values of tensor `name` as f32 (statistics tensors), or why not.
    pub fn read_f32(&self, name: &str) -> Option<Result<Vec<f32>, String>> {
        let t = self.tensor(name)?;
        Some((t.to_f32)(&t.bytes))
    }

    /// The (magnitude, direction) names `name` is stored as, when it is a `….weight` kept as
    /// a weight-norm pair.
    fn pair(&self, name: &str) -> Option<(String, String)> {
        let base = name.strip_suffix("weight")?;
        WEIGHT_NORM_PAIRS.iter().find_map(|(g, v)| {
            let (g, v) = (format!("{base}{g}"), format!("{base}{v}"));
            (self.inner.contains(&g) && self.inner.contains(&v)).then_some((g, v))
        })
    }

    fn folded(&self, g_name: &str, v_name: &str) -> Option<SourceTensor<'_>> {
        let g = self.inner.tensor(g_name)?;
        let v = self.inner.tensor(v_name)?;
        let origin = v.origin.clone();
        let (ne, n_dims) = (v.ne, v.n_dims);
        let values = (|| -> Result<Vec<f32>, String> {
            let g_vals = (g.to_f32)(&g.bytes)?;
            let v_vals = (v.to_f32)(&v.bytes)?;
            fold_weight_norm(&g_vals, &v_vals, ne, n_dims)
        })();
        let bytes = match values {
            Ok(vals) => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
            // An unreadable pair: hand the loader an empty tensor whose conversion reports why,
            // so the error names the weight instead of a panic or a silent zero.
            Err(reason) => {
                let why = format!("weight norm of '{g_name}' and '{v_name}': {reason}");
                return Some(SourceTensor {
                    ne,
                    n_dims,
                    ggml_type: None,
                    bytes: Cow::Owned(Vec::new()),
                    to_f32: Box::new(move |_| Err(why.clone())),
                    origin,
                });
            }
        };
        Some(SourceTensor {
            ne,
            n_dims,
            ggml_type: Some(DType::F32),
            bytes: Cow::Owned(bytes),
            to_f32: Box::new(|b: &[u8]| {
                Ok(b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect())
            }),
            origin,
        })
    }
}

/// `w = g · v / ‖v‖`, the norm taken over each slice of PyTorch's first dimension (ggml's
/// outermost, `ne[n_dims − 1]`); `g` holds one magnitude per slice (a single one when that
/// dimension is 1, which a file's rank may not show).
pub(crate) fn fold_weight_norm(
    g: &[f32],
    v: &[f32],
    ne: crate::tensor::Ne,
    n_dims: usize,
) -> Result<Vec<f32>, String> {
    let total: usize = ne.iter().product();
    if v.len() != total || total == 0 {
        return Err(format!("{} direction values for shape {ne:?}", v.len()));
    }
    let outer = g.len();
    if outer == 0 || (outer != 1 && ne[n_dims.clamp(1, 4) - 1] != outer) {
        return Err(format!(
            "{outer} magnitudes for a direction of shape {ne:?} (one per slice of its \
             outermost dimension)"
        ));
    }
    let inner = total / outer;
    let mut w = Vec::with_capacity(total);
    for (slice, &gi) in v.chunks_exact(inner).zip(g) {
        let norm = slice
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        let scale = (f64::from(gi) / norm) as f32;
        w.extend(slice.iter().map(|&x| x * scale));
    }
    Ok(w)
}

impl WeightSource for AudioVaeSource<'_> {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        if let Some(t) = self.inner.tensor(name) {
            return Some(t);
        }
        let (g, v) = self.pair(name)?;
        self.folded(&g, &v)
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name) || self.pair(name).is_some()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::MemorySource;

    #[test]
    fn folds_per_outer_slice_and_serves_both_spellings() {
        // v: PyTorch [2, 1, 2] → ggml [2, 1, 2]; rows (3, 4) and (0, 2).
        let mut m = MemorySource::new();
        m.insert("a.weight_g", [1, 1, 2, 1], vec![10.0, -1.0]);
        m.insert("a.weight_v", [2, 1, 2, 1], vec![3.0, 4.0, 0.0, 2.0]);
        m.insert(
            "b.parametrizations.weight.original0",
            [1, 1, 1, 1],
            vec![2.0],
        );
        m.insert(
            "b.parametrizations.weight.original1",
            [2, 1, 1, 1],
            vec![0.0, 5.0],
        );
        m.insert("c.weight", [1, 1, 1, 1], vec![7.0]);
        let s = AudioVaeSource::new(&m);
        let a = s.read_f32("a.weight").unwrap().unwrap();
        assert_eq!(a, vec![6.0, 8.0, 0.0, -1.0]);
        assert_eq!(s.tensor("a.weight").unwrap().ne, [2, 1, 2, 1]);
        assert_eq!(s.read_f32("b.weight").unwrap().unwrap(), vec![0.0, 2.0]);
        assert_eq!(s.read_f32("c.weight").unwrap().unwrap(), vec![7.0]);
        assert!(s.contains("a.weight") && !s.contains("d.weight"));
    }

    #[test]
    fn mismatched_pair_is_an_error_not_a_panic() {
        let mut m = MemorySource::new();
        m.insert("a.weight_g", [1, 1, 3, 1], vec![1.0, 1.0, 1.0]);
        m.insert("a.weight_v", [2, 1, 2, 1], vec![3.0, 4.0, 0.0, 2.0]);
        let s = AudioVaeSource::new(&m);
        let err = s.read_f32("a.weight").unwrap().unwrap_err();
        assert!(err.contains("a.weight_g"), "{err}");
    }

    #[test]
    fn layout_detection() {
        let mut m = MemorySource::new();
        m.insert("decoder.conv_pre.weight", [7, 4, 2, 1], vec![0.0; 56]);
        assert_eq!(
            AudioVaeSource::new(&m).layout(),
            Some(AudioVaeLayout::Original)
        );
        let mut d = MemorySource::new();
        d.insert("encoder.block.0.weight_g", [1, 1, 2, 1], vec![1.0; 2]);
        d.insert("encoder.block.0.weight_v", [7, 1, 2, 1], vec![1.0; 14]);
        assert_eq!(
            AudioVaeSource::new(&d).layout(),
            Some(AudioVaeLayout::Diffusers)
        );
        assert_eq!(AudioVaeSource::new(&MemorySource::new()).layout(), None);
    }
}
