//! Special functions for the `beta` and `logit_normal` schedules (f64, as upstream).

/// Inverse standard normal CDF (Acklam's rational approximation, as upstream).
pub(super) fn ndtri(p: f64) -> f64 {
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 5] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
        1.0,
    ];
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 6] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
        1.0,
    ];
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let horner = |c: &[f64], x: f64| c[1..].iter().fold(c[0], |acc, k| acc * x + k);
    const P_LOW: f64 = 0.02425;
    if p < P_LOW {
        let q = (-2.0 * p.ln()).sqrt();
        horner(&C, q) / horner(&D, q)
    } else if p > 1.0 - P_LOW {
        let q = (-2.0 * (1.0 - p).ln()).sqrt();
        -(horner(&C, q) / horner(&D, q))
    } else {
        let q = p - 0.5;
        let r = q * q;
        horner(&A, r) * q / horner(&B, r)
    }
}

fn ln_beta(a: f64, b: f64) -> f64 {
    ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b)
}

/// ln Gamma(x) for x > 0 (Lanczos, g = 7, n = 9; ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularised incomplete beta by Lentz's continued fraction (upstream `incbeta`).
fn incbeta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    const TINY: f64 = 1e-30;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - qab * x / qap);
    let mut h = d;
    for m in 1..=200 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 / guard(1.0 + aa * d);
        c = guard(1.0 + aa / c);
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 / guard(1.0 + aa * d);
        c = guard(1.0 + aa / c);
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 3.0e-7 {
            break;
        }
    }
    (a * x.ln() + b * (1.0 - x).ln() - ln_beta(a, b)).exp() / a * h
}

fn beta_cdf(x: f64, a: f64, b: f64) -> f64 {
    if x == 0.0 {
        return 0.0;
    }
    if x == 1.0 {
        return 1.0;
    }
    if x < (a + 1.0) / (a + b + 2.0) {
        incbeta(x, a, b)
    } else {
        1.0 - incbeta(1.0 - x, b, a)
    }
}

/// Beta quantile by 30 Newton steps from 0.5 (upstream `beta_ppf`).
pub(super) fn beta_ppf(u: f64, a: f64, b: f64) -> f64 {
    let mut x = 0.5;
    for _ in 0..30 {
        let f = beta_cdf(x, a, b) - u;
        if f.abs() < 1e-10 {
            break;
        }
        let df = ((a - 1.0) * x.ln() + (b - 1.0) * (1.0 - x).ln() - ln_beta(a, b)).exp();
        x -= f / df;
        x = x.clamp(1e-10, 1.0 - 1e-10);
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_values() {
        assert!((ln_gamma(0.6) - 0.398_233_858_069_234_9).abs() < 1e-12);
        assert!((ln_gamma(1.2) - (-0.085_374_090_003_315_48)).abs() < 1e-12);
        assert!(ln_gamma(1.0).abs() < 1e-13);
    }

    #[test]
    fn beta_ppf_inverts_cdf() {
        for u in [0.05, 0.3, 0.5, 0.9] {
            let x = beta_ppf(u, 0.6, 0.6);
            assert!((beta_cdf(x, 0.6, 0.6) - u).abs() < 1e-6);
        }
        assert!((ndtri(0.975) - 1.959_964).abs() < 1e-6);
    }
}
