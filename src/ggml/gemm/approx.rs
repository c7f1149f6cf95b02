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
/// 2^f for f in [−½, ½], degree 6, highest first (Horner order), fitted here for relative
/// error (weighted least squares on Chebyshev nodes, reweighted towards equal ripple). Evaluated in f32 with FMAs its largest relative error is 7.9e−8, about
/// f32's rounding; degree 5 would give 1.6e−7.
pub(super) const EXP2_POLY: [f32; 7] = [
    1.535_333_7e-4,
    1.339_887_5e-3,
    9.618_438e-3,
    5.550_332_4e-2,
    0.240_226_48,
    // The fit's linear coefficient rounds to ln 2 in f32.
    std::f32::consts::LN_2,
    1.0,
];
/// Below this 2^x (< 3e−38) is taken as exactly 0, so every result is a normal float (a
/// denormal in the next product would cost a microcode assist per FMA on Intel cores).
pub(super) const EXP2_MIN: f32 = -125.0;
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
