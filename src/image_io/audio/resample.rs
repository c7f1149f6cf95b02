//! Linear-interpolation resampling, as stable-diffusion.cpp prepares MiniMax-H3 reference
//! audio: `round(n · to / from)` output samples (at least one), output i read at source
//! position `i · from / to` between its two neighbours (the last sample repeated past the
//! end), clamped to [-1, 1].

/// `x` at `from` Hz resampled to `to` Hz; empty input (or a zero rate) gives no samples.
pub(super) fn linear(x: &[f32], from: u32, to: u32) -> Vec<f32> {
    if x.is_empty() || from == 0 || to == 0 {
        return Vec::new();
    }
    let n = x.len();
    let ratio = f64::from(from) / f64::from(to);
    let out_len = ((n as f64 * f64::from(to) / f64::from(from)).round() as usize).max(1);
    (0..out_len)
        .map(|i| {
            let pos = i as f64 * ratio;
            let s0 = (pos.floor() as usize).min(n - 1);
            let s1 = (s0 + 1).min(n - 1);
            let frac = (pos - s0 as f64) as f32;
            let (a, b) = (x[s0], x[s1]);
            (a + (b - a) * frac).clamp(-1.0, 1.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::linear;

    #[test]
    fn same_rate_is_identity_up_to_the_clamp() {
        let x = [0.5, -0.25, 1.5, -2.0];
        assert_eq!(linear(&x, 16_000, 16_000), vec![0.5, -0.25, 1.0, -1.0]);
    }

    #[test]
    fn upsampling_interpolates_and_repeats_the_end() {
        let y = linear(&[0.0, 0.5, 1.0], 16_000, 32_000);
        assert_eq!(y, vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.0]);
    }

    #[test]
    fn downsampling_picks_positions() {
        let x: Vec<f32> = (0..9).map(|i| i as f32 / 10.0).collect();
        let y = linear(&x, 48_000, 32_000);
        assert_eq!(y.len(), 6);
        for (i, v) in y.iter().enumerate() {
            assert!((v - i as f32 * 1.5 / 10.0).abs() < 1e-6, "{i}: {v}");
        }
    }

    #[test]
    fn degenerate_inputs() {
        assert!(linear(&[], 8000, 32_000).is_empty());
        assert!(linear(&[0.1], 0, 32_000).is_empty());
        assert_eq!(linear(&[0.3], 96_000, 8000), vec![0.3]);
    }
}
