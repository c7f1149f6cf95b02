//! What this CPU offers the kernels: one line for `-v` and `--list-devices`, so figures from
//! different machines can be told apart (and a slow run explained), and the run-time cap
//! `SD_CLI_CPU=ggml|avx2|avxvnni|avx512|avx512bf16|native` that makes our kernel selection behave as
//! on a lesser CPU (ggml's own kernels are compiled for this machine and are not capped).

use std::sync::OnceLock;

/// The most the blocked kernels may use (`SD_CLI_CPU`), ordered from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CpuCap {
    /// None of our kernels: ggml's only (what a CPU without AVX2 + FMA runs).
    Ggml,
    /// No AVX-512: the AVX2 + FMA product tiles, ggml's kernels for the rest (desktops and
    /// laptops without AVX-512).
    Avx2,
    /// AVX2 with AVX-VNNI, no AVX-512 (Alder Lake and later Intel desktops and laptops): q8_0
    /// weights through 256-bit VNNI integer products. An AVX-512 VNNI CPU imitates it with
    /// the EVEX encoding of the same instruction.
    AvxVnni,
    /// AVX-512F/BW/VNNI but no BF16 (Ice Lake / Sapphire Rapids without AMX class): bf16
    /// weights widened to f32.
    Avx512,
    /// AVX-512 with BF16 (Zen 4, Cooper Lake), no AMX.
    Avx512Bf16,
    /// Whatever the CPU has (AMX tiles included, Sapphire Rapids and later).
    Native,
}

impl CpuCap {
    /// Parses an `SD_CLI_CPU` value.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ggml" => Some(Self::Ggml),
            "avx2" => Some(Self::Avx2),
            "avxvnni" => Some(Self::AvxVnni),
            "avx512" => Some(Self::Avx512),
            "avx512bf16" => Some(Self::Avx512Bf16),
            "native" | "" => Some(Self::Native),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Ggml => "ggml",
            Self::Avx2 => "avx2",
            Self::AvxVnni => "avxvnni",
            Self::Avx512 => "avx512",
            Self::Avx512Bf16 => "avx512bf16",
            Self::Native => "native",
        }
    }
}

/// The cap of this process (`SD_CLI_CPU`, read once; an unknown value warns and means native).
pub fn cpu_cap() -> CpuCap {
    static CAP: OnceLock<CpuCap> = OnceLock::new();
    *CAP.get_or_init(|| {
        let Ok(v) = std::env::var("SD_CLI_CPU") else {
            return CpuCap::Native;
        };
        CpuCap::parse(&v).unwrap_or_else(|| {
            log::warn!("SD_CLI_CPU={v:?} is not ggml, avx2, avxvnni, avx512, avx512bf16 or native; ignored");
            CpuCap::Native
        })
    })
}

/// Whether the blocked kernels may use x86 feature `feature` ("avx2", "fma", "avxvnni",
/// "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16", "amxbf16"): the CPU has it
/// (AMX: and Linux granted its state) and the cap allows it.
pub fn kernel_may_use(feature: &str) -> bool {
    let need = match feature {
        "amxbf16" => CpuCap::Native,
        "avx512bf16" => CpuCap::Avx512Bf16,
        "avxvnni" => CpuCap::AvxVnni,
        f if f.starts_with("avx512") => CpuCap::Avx512,
        _ => CpuCap::Avx2,
    };
    cpu_cap() >= need && detected(feature)
}

/// Whether bf16 weights multiply as bf16 pairs (AVX-512 BF16 under the cap) rather than
/// widened to f32. On Intel cores `vdpbf16ps` is slower than the f32 FMAs it replaces (a
/// Sapphire Rapids Xeon capped to `avx512bf16`: 229 against 395 GFLOP/s, PixArt's bf16 step
/// 1.38× diffusers against 1.07× widened), so there pairs run only on AMX tiles; AMD's Zen 4
/// runs them at twice its f32 rate.
pub fn bf16_pairs() -> bool {
    kernel_may_use("avx512f")
        && kernel_may_use("avx512bf16")
        && (!vendor_is_intel() || kernel_may_use("amxbf16"))
}

#[cfg(target_arch = "x86_64")]
fn vendor_is_intel() -> bool {
    let v = std::arch::x86_64::__cpuid(0);
    // "GenuineIntel" in EBX, EDX, ECX.
    [v.ebx, v.edx, v.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e]
}

#[cfg(not(target_arch = "x86_64"))]
fn vendor_is_intel() -> bool {
    false
}

/// An encoding of the 256-bit VNNI byte product (`vpdpbusd` on ymm registers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vnni256 {
    /// AVX-VNNI's (Alder Lake and later, Zen 5).
    Vex,
    /// AVX-512 VNNI with VL's: the same operation, so an AVX-512 VNNI CPU capped to the
    /// `avxvnni` class runs what an AVX-VNNI one would.
    Evex,
}

/// Which 256-bit VNNI encoding the AVX2 kernels may use (none below the `avxvnni` cap).
pub fn vnni256() -> Option<Vnni256> {
    if cpu_cap() < CpuCap::AvxVnni {
        None
    } else if detected("avxvnni") {
        Some(Vnni256::Vex)
    } else if detected("avx512vl") && detected("avx512vnni") {
        Some(Vnni256::Evex)
    } else {
        None
    }
}

#[cfg(target_arch = "x86_64")]
fn detected(feature: &str) -> bool {
    match feature {
        "avx2" => std::arch::is_x86_feature_detected!("avx2"),
        "fma" => std::arch::is_x86_feature_detected!("fma"),
        "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
        "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
        "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
        "avxvnni" => std::arch::is_x86_feature_detected!("avxvnni"),
        "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
        "avx512bf16" => std::arch::is_x86_feature_detected!("avx512bf16"),
        "amxbf16" => crate::ggml::amx_bf16_granted(),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detected(_feature: &str) -> bool {
    false
}

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
            "avx2" => "AVX2", "fma" => "FMA", "f16c" => "F16C", "avxvnni" => "AVX-VNNI",
            "avx512f" => "AVX-512F",
            "avx512bw" => "AVX-512BW", "avx512vnni" => "AVX-512 VNNI",
            "avx512bf16" => "AVX-512 BF16"
        );
        if crate::ggml::amx_bf16_granted() {
            out.push("AMX-BF16");
        }
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
    let kernels = if !kernel_may_use("avx512f") {
        if kernel_may_use("avx2") && kernel_may_use("fma") {
            if vnni256().is_some() {
                "blocked AVX2 products, q8_0 weights through 256-bit VNNI, bf16 weights widened to f32; ggml's kernels for the rest"
            } else {
                "blocked AVX2 products, bf16 and q8_0 weights widened to f32; ggml's kernels for the rest"
            }
        } else {
            "ggml's kernels"
        }
    } else {
        match (bf16_pairs(), kernel_may_use("avx512vnni")) {
            (true, true) if kernel_may_use("amxbf16") => {
                "blocked AVX-512 kernels, bf16 products on AMX tiles"
            }
            (true, true) => "blocked AVX-512 kernels",
            (false, true) => "blocked AVX-512 kernels, bf16 weights widened to f32",
            (true, false) => "blocked AVX-512 kernels, q8_0 weights widened to f32",
            (false, false) => "blocked AVX-512 kernels, bf16 and q8_0 weights widened to f32",
        }
    };
    let cap = match cpu_cap() {
        CpuCap::Native => String::new(),
        c => format!(", capped by SD_CLI_CPU={}", c.name()),
    };
    format!(
        "{}: {} ({kernels}{cap}, {threads} threads)",
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
    fn caps_parse_and_order() {
        assert_eq!(CpuCap::parse("AVX512"), Some(CpuCap::Avx512));
        assert_eq!(CpuCap::parse("avx512bf16"), Some(CpuCap::Avx512Bf16));
        assert_eq!(CpuCap::parse("native"), Some(CpuCap::Native));
        assert_eq!(CpuCap::parse("sse2"), None);
        assert_eq!(CpuCap::parse("ggml"), Some(CpuCap::Ggml));
        assert!(CpuCap::Ggml < CpuCap::Avx2);
        assert!(CpuCap::Avx2 < CpuCap::Avx512 && CpuCap::Avx512 < CpuCap::Native);
        assert_eq!(CpuCap::parse("AvxVnni"), Some(CpuCap::AvxVnni));
        assert!(CpuCap::Avx2 < CpuCap::AvxVnni && CpuCap::AvxVnni < CpuCap::Avx512);
    }

    #[test]
    fn the_line_names_the_threads_and_kernels() {
        let line = cpu_line(3);
        assert!(line.contains("3 threads"), "{line}");
        assert!(line.contains("kernels"), "{line}");
    }
}
