//! `dpm++2m_sde_bt`: DPM-Solver++(2M) SDE with noise from a seeded Brownian tree.
//!
//! Upstream (stable-diffusion.cpp `BrownianTreeNoiseSampler`) does not use torchsde's
//! or k-diffusion's tree; it builds its own deterministic one, reproduced here:
//! - the tree seed is the bit pattern of two normals drawn from the sampler rng
//!   (`randn(2)`, first value in the low 32 bits);
//! - W(t_max) = sqrt(t_max - t_min) * randn(n) from a libstdc++ `std_default` rng
//!   seeded with `mix64(seed, 0xBF58476D1CE4E5B9)`, W(t_min) = 0, where t_min / t_max
//!   are the smallest / largest positive sigma of the schedule;
//! - W(t) bisects [t_min, t_max] at most 24 times: each midpoint is the Brownian-bridge
//!   mean plus `sqrt((c - m)(m - a)/(c - a))` times `randn(n)` from a `std_default` rng
//!   seeded with the node seed (root `mix64(seed, 0x9E3779B97F4A7C15)`, left child
//!   `mix64(s, 1)`, right child `mix64(s, 2)`), and the leaf interpolates linearly;
//! - a step's noise is `(W(b) - W(a)) / sqrt(|b - a|)`.
//!
//! Because the tree depends only on the seed and the sigma range, the noise path is
//! (nearly) the same at any step count. The `std_default` rng is used whatever
//! `--sampler-rng` is, as upstream does.
//!
//! Upstream quirk kept: when the schedule has fewer than two distinct positive sigmas
//! (e.g. one step), upstream returns the input latent without calling the model.

use std::collections::HashMap;

use super::dpmpp_2m_sde;
use crate::rng::{Rng, StdDefaultRng};
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

const MAX_DEPTH: usize = 24;

/// splitmix64-style finaliser of `v + salt` (upstream `mix64`).
pub fn mix64(v: u64, salt: u64) -> u64 {
    let mut z = v.wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded Brownian motion on `[t_min, t_max]` over `len` independent channels.
#[derive(Debug, Clone)]
pub struct BrownianTree {
    t_min: f64,
    t_max: f64,
    len: usize,
    root_seed: u64,
    w_max: Vec<f32>,
    // W(t) by the bits of t: steps reuse the previous step's endpoint.
    cache: HashMap<u64, Vec<f32>>,
}

impl BrownianTree {
    /// Builds the tree for `len` values; `t_min < t_max` expected (else W is 0).
    pub fn new(len: usize, t_min: f64, t_max: f64, seed: u64) -> Self {
        let mut rng = StdDefaultRng::new(mix64(seed, 0xBF58_476D_1CE4_E5B9));
        let scale = ((t_max - t_min) as f32).sqrt();
        let w_max = rng.randn(len).into_iter().map(|z| z * scale).collect();
        BrownianTree {
            t_min,
            t_max,
            len,
            root_seed: mix64(seed, 0x9E37_79B9_7F4A_7C15),
            w_max,
            cache: HashMap::new(),
        }
    }

    /// Unit-variance noise for the interval between `sigma_a` and `sigma_b`.
    pub fn noise(&mut self, sigma_a: f64, sigma_b: f64) -> Vec<f32> {
        let clamp = |t: f64| t.max(self.t_min).min(self.t_max);
        let a = clamp(sigma_a.min(sigma_b));
        let b = clamp(sigma_a.max(sigma_b));
        let wa = self.w(a);
        let wb = self.w(b);
        let span = (sigma_b - sigma_a).abs().max(1e-12) as f32;
        let inv = 1.0 / span.sqrt();
        wb.iter().zip(&wa).map(|(p, q)| (p - q) * inv).collect()
    }

    /// W(t), bisecting from the root (an iterative form of upstream's recursion).
    pub fn w(&mut self, t: f64) -> Vec<f32> {
        if let Some(v) = self.cache.get(&t.to_bits()) {
            return v.clone();
        }
        let (mut a, mut c) = (self.t_min, self.t_max);
        let mut wa = vec![0.0f32; self.len];
        let mut wc = self.w_max.clone();
        let mut seed = self.root_seed;
        let mut hit = None;
        for _ in 0..MAX_DEPTH {
            if c - a < 1e-9 {
                break;
            }
            let m = 0.5 * (a + c);
            let sd = ((c - m) * (m - a) / (c - a)).sqrt() as f32;
            let z = StdDefaultRng::new(seed).randn(self.len);
            let wm: Vec<f32> = wa
                .iter()
                .zip(&wc)
                .zip(&z)
                .map(|((p, q), z)| 0.5 * (p + q) + sd * z)
                .collect();
            if t == m {
                hit = Some(wm);
                break;
            }
            if t < m {
                (c, wc, seed) = (m, wm, mix64(seed, 1));
            } else {
                (a, wa, seed) = (m, wm, mix64(seed, 2));
            }
        }
        let out = hit.unwrap_or_else(|| {
            let alpha = if c > a {
                ((t - a) / (c - a)) as f32
            } else {
                0.5
            };
            wa.iter()
                .zip(&wc)
                .map(|(p, q)| (1.0 - alpha) * p + alpha * q)
                .collect()
        });
        self.cache.insert(t.to_bits(), out.clone());
        out
    }
}

/// Runs the sampler.
pub fn sample(
    denoiser: &mut dyn Denoiser,
    x: Vec<f32>,
    sigmas: &[f32],
    rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    let positive = sigmas.iter().filter(|s| **s > 0.0).map(|&s| f64::from(s));
    let (t_min, t_max) = positive.fold((f64::INFINITY, 0.0f64), |(lo, hi), s| {
        (lo.min(s), hi.max(s))
    });
    if t_max <= t_min {
        return Ok(x);
    }
    let draw = rng.randn(2);
    let [lo, hi] = draw[..] else {
        return Err(SamplingError::Internal(
            "rng returned too few values".into(),
        ));
    };
    let seed = u64::from(lo.to_bits()) | (u64::from(hi.to_bits()) << 32);
    let mut tree = BrownianTree::new(x.len(), t_min, t_max, seed);
    dpmpp_2m_sde::run(denoiser, x, sigmas, opts.eta, |a, b, _| {
        Ok(tree.noise(f64::from(a), f64::from(b)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_is_splitmix_finaliser() {
        // splitmix64 from state 0: first output is 0xE220A8397B1DCDAF.
        assert_eq!(mix64(0, 0x9E37_79B9_7F4A_7C15), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn increments_add_up_and_are_unit_variance() {
        let mut tree = BrownianTree::new(4000, 0.03, 14.6, 1234);
        // W(b) - W(a) over [0.5, 3] equals the sum over [0.5, 1.2] and [1.2, 3].
        let whole = tree.noise(3.0, 0.5);
        let p1 = tree.noise(3.0, 1.2);
        let p2 = tree.noise(1.2, 0.5);
        for i in 0..whole.len() {
            let sum = p1[i] * 1.8f32.sqrt() + p2[i] * 0.7f32.sqrt();
            assert!((whole[i] * 2.5f32.sqrt() - sum).abs() < 1e-4, "{i}");
        }
        for (a, b) in [(14.6, 7.0), (1.2, 0.5), (0.15, 0.03)] {
            let n = tree.noise(a, b);
            let var = n.iter().map(|v| v * v).sum::<f32>() / n.len() as f32;
            assert!((var - 1.0).abs() < 0.1, "({a}, {b}): var {var}");
        }
        // Same query twice: same noise (cache and determinism).
        assert_eq!(
            tree.noise(7.0, 3.1),
            BrownianTree::new(4000, 0.03, 14.6, 1234).noise(7.0, 3.1)
        );
    }
}
