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
