//! Helpers of the kernel micro-benchmarks (matmul, attention): integer flags, the `--only`
//! filter and reproducible pseudo-random inputs.

/// The integer after flag `name` on the command line, else `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether the kernel called `name` runs: all do unless `--only PREFIX` names the ones whose
/// name starts with it (one kernel alone, for a profiler).
#[allow(dead_code)] // not every user of this module filters
pub fn wanted(name: &str) -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .is_none_or(|prefix| name.starts_with(prefix.as_str()))
}

/// `n` values in [−0.5, 0.5) from an xorshift stream seeded with `seed`.
pub fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}
