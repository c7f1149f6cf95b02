//! `--rng std_default`: stable-diffusion.cpp's `STDDefaultRNG`.
//!
//! Upstream seeds a `std::default_random_engine` with `(unsigned int)seed` and draws
//! from `std::normal_distribution<float>(0, 1)`. Both are implementation-defined; we
//! reproduce GCC's libstdc++ (the usual Linux build):
//! - `default_random_engine` = `minstd_rand0`: `x <- 16807 * x mod (2^31 - 1)`, seed
//!   `s mod (2^31 - 1)` with 0 replaced by 1.
//! - `generate_canonical<float, 24>` takes one engine draw: `float(x - 1) / 2^31`
//!   (the divisor is `float(2^31 - 2)`, which rounds to `2^31`), clamped below 1.
//! - `normal_distribution<float>` uses the Marsaglia polar method on `2u - 1` pairs and
//!   returns the `y` half first, caching `x * mult` for the next draw (within one
//!   `randn` call: upstream makes a new distribution object per call).
//!
//! MSVC builds (mt19937 + a different normal transform) give other numbers; that
//! difference exists upstream too.

use super::Rng;

const MODULUS: u64 = 2_147_483_647;
const MULTIPLIER: u64 = 16_807;

/// libstdc++ `default_random_engine` + `normal_distribution<float>`.
#[derive(Debug, Clone)]
pub struct StdDefaultRng {
    state: u64,
    saved: Option<f32>,
}

impl StdDefaultRng {
    /// Seeds like `generator.seed((unsigned int)seed)`.
    pub fn new(seed: u64) -> Self {
        let mut r = StdDefaultRng {
            state: 1,
            saved: None,
        };
        r.manual_seed(seed);
        r
    }

    /// Next raw engine output in `[1, 2^31 - 2]`.
    pub fn next_raw(&mut self) -> u32 {
        self.state = (self.state * MULTIPLIER) % MODULUS;
        self.state as u32
    }

    fn canonical(&mut self) -> f32 {
        let sum = (self.next_raw() - 1) as f32;
        let denom = 2_147_483_646.0f64 as f32;
        let v = sum / denom;
        if v >= 1.0 {
            // libstdc++ clamps to the largest float below 1.
            f32::from_bits(0x3f7f_ffff)
        } else {
            v
        }
    }

    fn normal(&mut self) -> f32 {
        if let Some(v) = self.saved.take() {
            return v;
        }
        loop {
            // `2.0f * u - 1.0` is evaluated in double and narrowed on assignment.
            let x = (f64::from(2.0f32 * self.canonical()) - 1.0) as f32;
            let y = (f64::from(2.0f32 * self.canonical()) - 1.0) as f32;
            let r2 = x * x + y * y;
            if r2 > 1.0 || r2 == 0.0 {
                continue;
            }
            let mult = (-2.0f32 * r2.ln() / r2).sqrt();
            self.saved = Some(x * mult);
            return y * mult;
        }
    }
}

impl Rng for StdDefaultRng {
    fn manual_seed(&mut self, seed: u64) {
        let s = u64::from(seed as u32) % MODULUS;
        self.state = if s == 0 { 1 } else { s };
        self.saved = None;
    }

    fn randn(&mut self, n: usize) -> Vec<f32> {
        // Upstream builds a fresh normal_distribution per call, dropping the cached half.
        self.saved = None;
        (0..n).map(|_| self.normal()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minstd_rand0_reference() {
        // C++11 [rand.predef]: the 10000th consecutive minstd_rand0 draw from the
        // default seed 1 is 1043618065.
        let mut r = StdDefaultRng::new(1);
        let mut last = 0;
        for _ in 0..10000 {
            last = r.next_raw();
        }
        assert_eq!(last, 1_043_618_065);
    }

    #[test]
    fn zero_seed_maps_to_one() {
        let mut a = StdDefaultRng::new(0);
        let mut b = StdDefaultRng::new(1);
        assert_eq!(a.next_raw(), b.next_raw());
    }
}
