//! torch's CPU generator: `torch.manual_seed(s); torch.randn(n)` reproduced bit for bit.
//!
//! torch draws from a 32-bit mt19937 and turns the stream into normals in two ways:
//! - `n >= 16`: fill `n` float uniforms `(u32 & 0xffffff) / 2^24`, then Box-Muller on
//!   blocks of 16 (`[0..8]` radius source, `[8..16]` angle source); when `n % 16 != 0`
//!   the last 16 outputs are recomputed from 16 fresh uniforms.
//! - `n < 16`: one double Box-Muller per pair from 53-bit uniforms, caching the sine
//!   half for the next call.
//!
//! On x86 torch runs the 16-block transform with its AVX2 kernel (Cephes-style
//! polynomial `log`/`sincos` in f32, from `avx_mathfun.h`), compiled with FMA
//! contraction. We evaluate the same polynomials in scalar f32 with `mul_add` exactly
//! where the compiled kernel fuses (found by matching 65536 torch outputs bit for bit);
//! libm `ln`/`sin`/`cos` would be off by an ulp about 1-2% of the time.
//! stable-diffusion.cpp's `MT19937RNG` uses libm and so agrees with this to within
//! about an ulp (its output is not torch's bit for bit either).

use super::Rng;

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// torch-compatible CPU generator (`--rng cpu`).
#[derive(Clone)]
pub struct TorchCpuRng {
    state: Box<[u32; N]>,
    /// Index of the next state word to temper; `N` means "twist first".
    next: usize,
    /// torch keeps the second half of a double Box-Muller pair for the next scalar draw.
    cached_normal: Option<f64>,
}

impl TorchCpuRng {
    /// Seeds like `torch.manual_seed(seed)` (only the low 32 bits reach mt19937).
    pub fn new(seed: u64) -> Self {
        let mut rng = TorchCpuRng {
            state: Box::new([0; N]),
            next: N,
            cached_normal: None,
        };
        rng.manual_seed(seed);
        rng
    }

    fn twist(&mut self) {
        let s = &mut self.state;
        for i in 0..N {
            let y = (s[i] & UPPER_MASK) | (s[(i + 1) % N] & LOWER_MASK);
            let mag = if y & 1 != 0 { MATRIX_A } else { 0 };
            s[i] = s[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.next = 0;
    }

    /// Next raw tempered 32-bit output of mt19937.
    pub fn next_u32(&mut self) -> u32 {
        if self.next >= N {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    fn next_u64(&mut self) -> u64 {
        // torch combines two draws as (first << 32) | second.
        let hi = u64::from(self.next_u32());
        let lo = u64::from(self.next_u32());
        (hi << 32) | lo
    }

    /// Float uniform in [0, 1) with 24 random bits (torch `uniform_real_distribution<float>`).
    fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0)
    }

    /// Double uniform in [0, 1) with 53 random bits.
    fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() & ((1u64 << 53) - 1)) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// torch `normal_distribution<double>` for one sample (mean 0, std 1).
    fn normal_f64(&mut self) -> f64 {
        if let Some(v) = self.cached_normal.take() {
            return v;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let r = (-2.0 * (-u2).ln_1p()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u1;
        self.cached_normal = Some(r * theta.sin());
        r * theta.cos()
    }
}

/// Box-Muller over one block of 16 uniforms, in place.
fn normal_block16(d: &mut [f32]) {
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    for j in 0..8 {
        let u1 = 1.0 - d[j];
        let u2 = d[j + 8];
        let radius = (-2.0 * cephes_logf(u1)).sqrt();
        let (s, c) = cephes_sincosf(two_pi * u2);
        d[j] = radius * c;
        d[j + 8] = radius * s;
    }
}

// Cephes single-precision constants, as used by avx_mathfun (Pommier/Garberoglio).
const SQRTHF: f32 = 0.707_106_77;
#[allow(clippy::excessive_precision)]
const LOG_P: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_4e-1,
    -2.499_999_4e-1,
    3.333_333_1e-1,
];
const LOG_Q1: f32 = -2.121_944_4e-4;
const LOG_Q2: f32 = 0.693_359_4;

/// Natural log for positive normal `x`, same operation order (and fusing) as torch's
/// compiled `log256_ps`.
fn cephes_logf(x: f32) -> f32 {
    let x = x.max(f32::MIN_POSITIVE);
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 0x7f) as f32 + 1.0;
    // Mantissa rescaled into [0.5, 1).
    let mut m = f32::from_bits((bits & !0x7f80_0000) | 0.5f32.to_bits());
    if m < SQRTHF {
        e -= 1.0;
        m = (m - 1.0) + m;
    } else {
        m -= 1.0;
    }
    let z = m * m;
    let mut y = LOG_P[0];
    for p in &LOG_P[1..] {
        y = y.mul_add(m, *p);
    }
    y = (y * m).mul_add(z, e * LOG_Q1);
    y = (-z).mul_add(0.5, y);
    e.mul_add(LOG_Q2, m + y)
}

const FOPI: f32 = 1.273_239_5; // 4 / pi
const DP1: f32 = -0.785_156_25;
const DP2: f32 = -2.418_756_5e-4;
const DP3: f32 = -3.774_895e-8;
const SIN_P: [f32; 3] = [-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1];
const COS_P: [f32; 3] = [2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2];

/// (sin x, cos x), same operation order (and fusing) as torch's compiled `sincos256_ps`.
fn cephes_sincosf(x: f32) -> (f32, f32) {
    let neg = x.is_sign_negative();
    let ax = x.abs();
    let mut j = (ax * FOPI) as i32;
    j = (j + 1) & !1;
    let yj = j as f32;
    let sin_flip = (j & 4 != 0) != neg;
    let cos_flip = (j.wrapping_sub(2) & 4) == 0;
    let use_sin_poly_for_sin = j & 2 == 0;
    let r = yj.mul_add(DP3, yj.mul_add(DP2, yj.mul_add(DP1, ax)));
    let z = r * r;
    let cp = COS_P[0].mul_add(z, COS_P[1]).mul_add(z, COS_P[2]) * z;
    let cos_poly = cp.mul_add(z, -(z * 0.5)) + 1.0;
    let sin_poly = (SIN_P[0].mul_add(z, SIN_P[1]).mul_add(z, SIN_P[2]) * z).mul_add(r, r);
    let (s, c) = if use_sin_poly_for_sin {
        (sin_poly, cos_poly)
    } else {
        (cos_poly, sin_poly)
    };
    let s = if sin_flip { -s } else { s };
    let c = if cos_flip { -c } else { c };
    (s, c)
}

impl Rng for TorchCpuRng {
    fn manual_seed(&mut self, seed: u64) {
        let s = &mut self.state;
        s[0] = (seed & 0xffff_ffff) as u32;
        for i in 1..N {
            let prev = s[i - 1];
            s[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.next = N;
        self.cached_normal = None;
    }

    fn randn(&mut self, n: usize) -> Vec<f32> {
        if n < 16 {
            return (0..n).map(|_| self.normal_f64() as f32).collect();
        }
        let mut out: Vec<f32> = (0..n).map(|_| self.uniform_f32()).collect();
        for block in out.chunks_exact_mut(16) {
            normal_block16(block);
        }
        if !n.is_multiple_of(16) {
            let tail = &mut out[n - 16..];
            for v in tail.iter_mut() {
                *v = self.uniform_f32();
            }
            normal_block16(tail);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_output() {
        // Reference mt19937 (init_genrand(5489)): first output 3499211612, 10000th 4123659995.
        let mut r = TorchCpuRng::new(5489);
        assert_eq!(r.next_u32(), 3_499_211_612);
        for _ in 1..9999 {
            r.next_u32();
        }
        assert_eq!(r.next_u32(), 4_123_659_995);
    }

    #[test]
    fn cephes_helpers_close_to_libm() {
        for i in 1..2000 {
            let u = i as f32 / 2000.0;
            assert!((cephes_logf(u) - u.ln()).abs() <= 2e-7 * u.ln().abs().max(1.0));
            let t = u * 6.283_185_5;
            let (s, c) = cephes_sincosf(t);
            assert!((s - t.sin()).abs() < 3e-7, "sin {t}");
            assert!((c - t.cos()).abs() < 3e-7, "cos {t}");
        }
    }
}
