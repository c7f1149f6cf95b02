//! Random number generators for initial latent noise and stochastic samplers.
//!
//! Three generators mirror stable-diffusion.cpp's `--rng` choices:
//! - [`RngKind::Cuda`] (`cuda`, the default): a CPU re-implementation of torch's CUDA
//!   Philox normal sampler as popularised by the A1111 webui (`PhiloxRng`).
//! - [`RngKind::Cpu`] (`cpu`): torch's CPU generator (mt19937 + torch's Box-Muller
//!   variants), reproducing `torch.manual_seed(s); torch.randn(n)` (`TorchCpuRng`).
//! - [`RngKind::StdDefault`] (`std_default`): what upstream gets from
//!   `std::default_random_engine` + `std::normal_distribution<float>` under
//!   GCC/libstdc++ (`StdDefaultRng`).

mod cpu;
mod philox;
mod std_default;

pub use cpu::TorchCpuRng;
pub use philox::PhiloxRng;
pub use std_default::StdDefaultRng;

use std::fmt;
use std::str::FromStr;

/// Errors of the rng module.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RngError {
    /// `--rng`/`--sampler-rng` value that names no generator.
    #[error("unknown rng type '{0}' (expected one of: std_default, cuda, cpu)")]
    UnknownKind(String),
}

/// A seedable source of standard-normal `f32` samples.
///
/// Successive `randn` calls continue the stream (like repeated `torch.randn` calls
/// on one generator); `manual_seed` restarts it.
pub trait Rng {
    /// Restarts the stream from `seed`.
    fn manual_seed(&mut self, seed: u64);
    /// Draws `n` samples from N(0, 1).
    fn randn(&mut self, n: usize) -> Vec<f32>;
}

/// The generator selected with `--rng` (upstream `rng_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RngKind {
    /// `std_default`: libstdc++ `default_random_engine` (minstd_rand0) + `normal_distribution`.
    StdDefault,
    /// `cuda`: Philox 4x32-10, torch-CUDA compatible (upstream default).
    #[default]
    Cuda,
    /// `cpu`: torch CPU mt19937 generator.
    Cpu,
}

impl RngKind {
    /// All kinds, in upstream enum order.
    pub const ALL: [RngKind; 3] = [RngKind::StdDefault, RngKind::Cuda, RngKind::Cpu];

    /// The upstream CLI name.
    pub fn name(self) -> &'static str {
        match self {
            RngKind::StdDefault => "std_default",
            RngKind::Cuda => "cuda",
            RngKind::Cpu => "cpu",
        }
    }

    /// Creates a generator of this kind seeded with `seed`.
    pub fn create(self, seed: u64) -> Box<dyn Rng> {
        match self {
            RngKind::StdDefault => Box::new(StdDefaultRng::new(seed)),
            RngKind::Cuda => Box::new(PhiloxRng::new(seed)),
            RngKind::Cpu => Box::new(TorchCpuRng::new(seed)),
        }
    }
}

impl fmt::Display for RngKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RngKind {
    type Err = RngError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RngKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| RngError::UnknownKind(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for k in RngKind::ALL {
            assert_eq!(k.name().parse::<RngKind>(), Ok(k));
            assert_eq!(k.to_string(), k.name());
        }
        assert_eq!(RngKind::default(), RngKind::Cuda);
        assert!(matches!(
            "philox".parse::<RngKind>(),
            Err(RngError::UnknownKind(s)) if s == "philox"
        ));
    }

    #[test]
    fn reseeding_restarts_stream() {
        for k in RngKind::ALL {
            let mut r = k.create(42);
            let a = r.randn(20);
            let b = r.randn(20);
            assert_ne!(a, b, "{k}: stream must advance");
            r.manual_seed(42);
            assert_eq!(r.randn(20), a, "{k}: reseed must restart");
        }
    }
}
