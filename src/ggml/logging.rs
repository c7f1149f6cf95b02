//! Routes ggml's own log lines through the `log` crate so `-v` controls them.

use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use super::sys;

static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Installs the log callback; ggml's debug/info lines show only when `verbose`.
pub fn set_verbose(verbose: bool) {
    VERBOSE.store(verbose, Ordering::Relaxed);
    // SAFETY: the callback is a plain `extern "C"` fn with 'static lifetime and no user data.
    unsafe { sys::ggml_log_set(Some(log_callback), std::ptr::null_mut()) };
}

extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a NUL-terminated string that lives for the duration of the call.
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() {
        return;
    }
    match level {
        sys::GGML_LOG_LEVEL_ERROR => log::error!("ggml: {msg}"),
        sys::GGML_LOG_LEVEL_WARN => log::warn!("ggml: {msg}"),
        _ if VERBOSE.load(Ordering::Relaxed) => log::debug!("ggml: {msg}"),
        _ => {}
    }
}

extern "C" {
    /// POSIX `_exit`: ends the process without running exit handlers.
    fn _exit(status: std::os::raw::c_int) -> !;
}

/// Makes ggml's fatal errors (a failed internal check, a lost RPC server) end the process with
/// a one-line error and exit status 1 instead of an abort and a backtrace. Output files are
/// written atomically, so nothing half-written is left behind.
pub fn exit_on_abort() {
    // SAFETY: the callback is a plain `extern "C"` fn with 'static lifetime.
    unsafe { sys::ggml_set_abort_callback(Some(abort_callback)) };
}

extern "C" fn abort_callback(text: *const c_char) {
    let msg = if text.is_null() {
        String::from("(no message)")
    } else {
        // SAFETY: ggml passes a NUL-terminated message that lives for the duration of the call.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    // ggml prefixes the source path; its file name and line are enough to report.
    let msg = match msg.split_once(": ") {
        Some((place, rest)) if place.contains('/') => {
            let file = place.rsplit('/').next().unwrap_or(place);
            format!("{file}: {rest}")
        }
        _ => msg,
    };
    eprintln!("error: ggml stopped: {}", msg.trim_end());
    let endpoints = super::rpc::registered_endpoints();
    if !endpoints.is_empty() && msg.contains("RPC") {
        eprintln!(
            "error: an RPC server ({}) stopped or the connection to it was lost; no output \
             was written for the unfinished image",
            endpoints.join(", ")
        );
    }
    // SAFETY: other threads (ggml's workers, the RPC dispatcher) may still run, so the process
    // ends at once rather than through exit handlers that would tear down state they use.
    unsafe { _exit(1) }
}
