//! What this CPU offers the kernels: one line for `-v` and `--list-devices`, so figures from
//! different machines can be told apart (and a slow run explained).

/// The CPU's model name (Linux `/proc/cpuinfo`), or "unknown CPU".
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The SIMD extensions the kernels look for that this CPU has, in ascending order.
pub fn cpu_features() -> Vec<&'static str> {
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt => $name:expr),*) => {$(
                if std::arch::is_x86_feature_detected!($f) {
                    out.push($name);
                }
            )*};
        }
        probe!(
            "avx2" => "AVX2", "fma" => "FMA", "f16c" => "F16C", "avx512f" => "AVX-512F",
            "avx512bw" => "AVX-512BW", "avx512vnni" => "AVX-512 VNNI",
            "avx512bf16" => "AVX-512 BF16"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($f:tt => $name:expr),*) => {$(
                if std::arch::is_aarch64_feature_detected!($f) {
                    out.push($name);
                }
            )*};
        }
        probe!("neon" => "NEON", "dotprod" => "DOTPROD", "i8mm" => "I8MM", "bf16" => "BF16");
    }
    out
}

/// "<model>: AVX2 FMA ... (which kernels run, N threads)".
pub fn cpu_line(threads: usize) -> String {
    let features = cpu_features();
    let kernels = if features.contains(&"AVX-512F") {
        "blocked AVX-512 kernels"
    } else {
        "ggml's kernels"
    };
    format!(
        "{}: {} ({kernels}, {threads} threads)",
        cpu_model(),
        if features.is_empty() {
            "no SIMD extensions detected".to_string()
        } else {
            features.join(" ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_threads_and_kernels() {
        let line = cpu_line(3);
        assert!(line.contains("3 threads"), "{line}");
        assert!(line.contains("kernels"), "{line}");
    }
}
