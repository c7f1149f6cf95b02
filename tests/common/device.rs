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
                return Some(start_loopback_server());
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

fn start_loopback_server() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let serve_at = endpoint.clone();
    std::thread::spawn(move || {
        let e = rpc::serve(&serve_at, &["CPU".to_string()], 2, None);
        panic!("the test RPC server stopped: {e:?}");
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(&endpoint).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "test RPC server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let devices = rpc::add_servers(std::slice::from_ref(&endpoint)).expect("test RPC server");
    devices.first().expect("an RPC device").name.clone()
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
