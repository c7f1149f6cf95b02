//! `--rng cuda` (upstream default): Philox 4x32-10 counter RNG + Box-Muller, the CPU
//! re-implementation of torch's CUDA `randn` published by the A1111 webui
//! (`modules/rng_philox.py`) and ported by stable-diffusion.cpp as `PhiloxRNG`.
//!
//! Each `randn(n)` call uses counter `(offset, 0, i, 0)` for element `i` and key =
//! the 64-bit seed split into (low, high) words, then bumps `offset`. Only the first
//! two output words feed Box-Muller, and only the sine half is returned.
//!
//! The final transform follows stable-diffusion.cpp, which works in f32 (the words
//! are first rounded to f32); the webui computes it in f64 and rounds at the end, so
//! the two differ by a few f32 ulps.

use super::Rng;

const PHILOX_M: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
const PHILOX_W: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];
const TWO_POW32_INV: f32 = 2.328_306_4e-10;
const TWO_PI: f32 = 6.283_185_5;

/// torch-CUDA-compatible Philox generator.
#[derive(Debug, Clone)]
pub struct PhiloxRng {
    seed: u64,
    offset: u32,
}

impl PhiloxRng {
    /// A generator at offset 0 for `seed`.
    pub fn new(seed: u64) -> Self {
        PhiloxRng { seed, offset: 0 }
    }
}

/// Philox 4x32 with `rounds` rounds; returns the four output words.
pub fn philox4x32(mut counter: [u32; 4], key: [u32; 2], rounds: u32) -> [u32; 4] {
    let mut key = key;
    for r in 0..rounds {
        if r > 0 {
            key[0] = key[0].wrapping_add(PHILOX_W[0]);
            key[1] = key[1].wrapping_add(PHILOX_W[1]);
        }
        let p0 = u64::from(counter[0]) * u64::from(PHILOX_M[0]);
        let p1 = u64::from(counter[2]) * u64::from(PHILOX_M[1]);
        counter = [
            (p1 >> 32) as u32 ^ counter[1] ^ key[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ counter[3] ^ key[1],
            p0 as u32,
        ];
    }
    counter
}

fn box_muller(a: u32, b: u32) -> f32 {
    let two_pow32_inv_2pi = TWO_POW32_INV * TWO_PI;
    let u = a as f32 * TWO_POW32_INV + TWO_POW32_INV / 2.0;
    let v = b as f32 * two_pow32_inv_2pi + two_pow32_inv_2pi / 2.0;
    (-2.0f32 * u.ln()).sqrt() * v.sin()
}

impl Rng for PhiloxRng {
    fn manual_seed(&mut self, seed: u64) {
        self.seed = seed;
        self.offset = 0;
    }

    fn randn(&mut self, n: usize) -> Vec<f32> {
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        let offset = self.offset;
        self.offset = self.offset.wrapping_add(1);
        (0..n)
            .map(|i| {
                // Element index lives in a 32-bit counter word, as upstream.
                let g = philox4x32([offset, 0, i as u32, 0], key, 10);
                box_muller(g[0], g[1])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Random123 known-answer vectors for philox4x32_10.
        assert_eq!(
            philox4x32([0, 0, 0, 0], [0, 0], 10),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                10
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }
}
