//! The constants of the vector approximations (e^x, erf), shared by every lane width so the
//! AVX-512 and AVX2 rows compute the same function.

/// Below this e^x (< 2e−38) is taken as exactly 0.
pub(super) const EXP_MIN: f32 = -87.0;
/// ln 2 split in two so that n·ln2 is exact to f32 precision (Cody–Waite).
pub(super) const LN2_HI: f32 = 0.693_145_75;
pub(super) const LN2_LO: f32 = 1.428_606_8e-6;
/// e^r's degree-7 Taylor coefficients, highest first (Horner order): 1/7!, 1/6!, …, 1, 1.
pub(super) const EXP_TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];
/// erfc(z) ≈ t·(a1 + t·(a2 + t·(a3 + t·(a4 + t·a5))))·e^(−z²), t = 1/(1 + p·z): Abramowitz &
/// Stegun 7.1.26 (absolute error < 1.5e−7). `ERF_A` is a1..a5.
pub(super) const ERF_P: f32 = 0.327_591_1;
pub(super) const ERF_A: [f32; 5] = [
    0.254_829_6,
    -0.284_496_74,
    1.421_413_7,
    -1.453_152,
    1.061_405_4,
];
