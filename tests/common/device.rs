//! The device the in-process tests run on. The CPU by default; `SD_CLI_TEST_BACKEND` picks
//! another: `rpc` serves this process's CPU over ggml RPC on loopback (a server thread, so it
//! ends with the test binary) and runs on its device `RPC0`, which exercises every non-CPU
//! path (device buffers, uploads, f16 K/V attention, segment hand-over) without a GPU; any
//! other value is a device name from `sd-cli --list-devices` (`Vulkan0`, `CUDA0`, ...).

use std::rc::Rc;
use std::sync::OnceLock;

use sd_cli::ggml::{rpc, Backend, BackendChoice};

/// The `SD_CLI_TEST_BACKEND` device, `None` for the CPU.
pub fn test_device() -> Option<String> {
    static DEVICE: OnceLock<Option<String>> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let name = std::env::var("SD_CLI_TEST_BACKEND").ok()?;
            let name = name.trim();
            if name.is_empty() || name.eq_ignore_ascii_case("cpu") {
                return None;
            }
            if name.eq_ignore_ascii_case("rpc") {
                return Some(rpc::serve_loopback(2).expect("the test RPC server"));
            }
            Some(name.to_string())
        })
        .clone()
}

/// Whether the tests run on a device other than the CPU (tolerances that depend on the
/// device's kernels widen then).
pub fn on_device() -> bool {
    test_device().is_some()
}

/// Whether the test device has its own kernels (a GPU, or Vulkan on lavapipe) rather than
/// being this machine's CPU served over RPC, which computes exactly as the CPU does.
pub fn gpu_class() -> bool {
    static GPU: OnceLock<bool> = OnceLock::new();
    *GPU.get_or_init(|| {
        let chosen = std::env::var("SD_CLI_TEST_BACKEND").unwrap_or_default();
        test_device().is_some() && !chosen.trim().eq_ignore_ascii_case("rpc")
    })
}

/// Whether the device stages matrix-product operands in f16. ggml's Vulkan backend (like
/// CUDA's) does when the device has f16 arithmetic, unless `GGML_VK_DISABLE_F16` is set
/// (what CI's lavapipe run does, so its comparisons stay tight).
pub fn f16_staging() -> bool {
    gpu_class() && std::env::var_os("GGML_VK_DISABLE_F16").is_none()
}

/// Relative error floor with f16 staging: f16 rounding (2^-11 ≈ 4.9e-4 per operand) grows
/// over layers; on lavapipe the tiny models show 3e-4 (one linear) to 2.9e-2 (the Wan VAE's
/// 9-frame decode, scale 1).
pub const F16_REL_TOL: f32 = 3e-2;

/// Relative error floor on GPU-class devices computing products in f32: pipelines still keep
/// attention's K/V in f16 off the CPU, and reductions run in another order (tree sums in
/// workgroups); on lavapipe PixArt's T5 conditioning shows 1.25e-3.
pub const GPU_REL_TOL: f32 = 5e-3;

/// A CPU tolerance, widened to the device's floor.
pub fn tolerance(cpu_tol: f32) -> f32 {
    if f16_staging() {
        cpu_tol.max(F16_REL_TOL)
    } else if gpu_class() {
        cpu_tol.max(GPU_REL_TOL)
    } else {
        cpu_tol
    }
}

/// Image PSNR floor with f16 staging: the rounding above moves 8-bit pixels by a step or two
/// here and there (SD3's tiny MMDiT: 46.5 dB on lavapipe).
pub const F16_PSNR_FLOOR: f64 = 45.0;

/// A CPU PSNR floor (dB), lowered to [`F16_PSNR_FLOOR`] with f16 staging.
pub fn psnr_floor(cpu_floor: f64) -> f64 {
    if f16_staging() {
        cpu_floor.min(F16_PSNR_FLOOR)
    } else {
        cpu_floor
    }
}

/// The test device, or the CPU with `threads` threads.
pub fn test_backend(threads: usize) -> Rc<Backend> {
    let backend = match test_device() {
        Some(name) => Backend::new(&BackendChoice::Named(name.clone()), threads)
            .unwrap_or_else(|e| panic!("SD_CLI_TEST_BACKEND device {name}: {e}")),
        None => Backend::cpu(threads).expect("CPU backend"),
    };
    Rc::new(backend)
}

/// A backend plan that puts every component on the test device (or the CPU).
pub fn test_plan(threads: usize) -> sd_cli::runner::BackendPlan {
    use sd_cli::runner::{BackendPlan, BackendSpec};
    match test_device() {
        Some(name) => BackendPlan::new(
            BackendSpec {
                default: BackendChoice::Named(name),
                per_role: Vec::new(),
            },
            threads,
        ),
        None => BackendPlan::cpu(threads),
    }
}
