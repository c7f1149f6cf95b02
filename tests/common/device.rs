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
