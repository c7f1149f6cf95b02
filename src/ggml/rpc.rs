//! ggml's RPC backend: devices of other machines as local devices (`--rpc-servers`), and this
//! machine's devices served to others (`--rpc-server`). The protocol is ggml's own; it has no
//! authentication and no encryption (docs/rpc.md).
//!
//! ggml aborts the process when a server cannot be reached or answers wrongly, so every
//! endpoint is checked here first with the protocol's own greeting, which turns the common
//! mistakes (nothing listening, a different program, another ggml version) into errors.

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use super::backend::{device_info, devices, DeviceInfo, DeviceKind};
use super::error::GgmlError;
use super::sys;

/// The greeting's command number; ggml keeps it fixed across protocol versions.
const HELLO: u8 = 14;
/// Bytes of transport capabilities in the greeting (ggml-rpc `RPC_CONN_CAPS_SIZE`).
const CONN_CAPS: usize = 24;
/// How long a server may take to accept and answer the greeting. A server talks to one
/// client at a time, so a busy one does not answer at all.
const GREETING_TIMEOUT: Duration = Duration::from_secs(15);

/// Endpoints whose devices are registered, in order (their devices are `RPC0`, `RPC1`, ...).
static REGISTERED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The RPC endpoints this process uses (for error messages).
pub fn registered_endpoints() -> Vec<String> {
    REGISTERED.lock().map(|r| r.clone()).unwrap_or_default()
}

fn rpc_error(endpoint: &str, reason: impl Into<String>) -> GgmlError {
    GgmlError::Rpc {
        endpoint: endpoint.to_string(),
        reason: reason.into(),
    }
}

/// Checks `host:port` the way ggml reads it (the first `:` splits host from port, so IPv6
/// literals are not supported).
pub fn parse_endpoint(endpoint: &str) -> Result<(String, u16), GgmlError> {
    let (host, port) = endpoint
        .split_once(':')
        .ok_or_else(|| rpc_error(endpoint, "expected host:port, e.g. 127.0.0.1:50052"))?;
    if host.is_empty() {
        return Err(rpc_error(endpoint, "the host is empty"));
    }
    let port = match port.parse::<u16>() {
        Ok(p) if p > 0 => p,
        _ => {
            return Err(rpc_error(
                endpoint,
                format!("'{port}' is not a port number"),
            ))
        }
    };
    Ok((host.to_string(), port))
}

fn resolve(endpoint: &str) -> Result<Vec<SocketAddr>, GgmlError> {
    let (host, port) = parse_endpoint(endpoint)?;
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| rpc_error(endpoint, format!("cannot resolve '{host}': {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(rpc_error(endpoint, format!("'{host}' has no address")));
    }
    Ok(addrs)
}

/// The protocol version a server at `endpoint` speaks, read through the protocol's greeting.
fn greet(endpoint: &str) -> Result<(u8, u8, u8), GgmlError> {
    let addrs = resolve(endpoint)?;
    let mut last = None;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, GREETING_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| {
        let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
        rpc_error(
            endpoint,
            format!("cannot connect ({why}); is `sd-cli --rpc-server` running there?"),
        )
    })?;
    let io = |e: std::io::Error| {
        let why = match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                "no answer to the RPC greeting within {} s (a server serves one client at a \
                 time: is another client connected?)",
                GREETING_TIMEOUT.as_secs()
            ),
            _ => format!("the RPC greeting failed ({e}); is this a ggml RPC server?"),
        };
        rpc_error(endpoint, why)
    };
    stream
        .set_read_timeout(Some(GREETING_TIMEOUT))
        .map_err(io)?;
    stream
        .set_write_timeout(Some(GREETING_TIMEOUT))
        .map_err(io)?;
    // Request: command byte, u64 payload size, payload (capabilities; none offered).
    let mut request = vec![HELLO];
    request.extend_from_slice(&(CONN_CAPS as u64).to_le_bytes());
    request.extend_from_slice(&[0u8; CONN_CAPS]);
    stream.write_all(&request).map_err(io)?;
    // Reply: u64 size, then major, minor, patch, padding and the server's capabilities.
    let mut size = [0u8; 8];
    stream.read_exact(&mut size).map_err(io)?;
    let size = u64::from_le_bytes(size);
    if size != (4 + CONN_CAPS) as u64 {
        return Err(rpc_error(
            endpoint,
            format!(
                "answered the RPC greeting with {size} bytes instead of {}: not a ggml RPC \
                 server of this protocol",
                4 + CONN_CAPS
            ),
        ));
    }
    let mut reply = [0u8; 4 + CONN_CAPS];
    stream.read_exact(&mut reply).map_err(io)?;
    Ok((reply[0], reply[1], reply[2]))
}

/// Fails unless a ggml RPC server speaking this build's protocol answers at `endpoint`.
pub fn check_server(endpoint: &str) -> Result<(), GgmlError> {
    let (major, minor, patch) = greet(endpoint)?;
    let ours = (
        sys::RPC_PROTO_MAJOR_VERSION as u8,
        sys::RPC_PROTO_MINOR_VERSION as u8,
    );
    if major != ours.0 || minor > ours.1 {
        return Err(rpc_error(
            endpoint,
            format!(
                "the server speaks RPC protocol {major}.{minor}.{patch}, this build {}.{}.x: \
                 run a server built from the same ggml (e.g. `sd-cli --rpc-server`)",
                ours.0, ours.1
            ),
        ));
    }
    Ok(())
}

/// Adds each server's devices to ggml's device list (named `RPC0`, `RPC1`, ... in order) and
/// returns the devices added. An endpoint already added is skipped.
pub fn add_servers(endpoints: &[String]) -> Result<Vec<DeviceInfo>, GgmlError> {
    let mut registered = REGISTERED
        .lock()
        .map_err(|_| rpc_error("-", "the RPC registry is poisoned"))?;
    let mut added = Vec::new();
    for endpoint in endpoints {
        if registered.contains(endpoint) {
            continue;
        }
        check_server(endpoint)?;
        let c = CString::new(endpoint.as_str())
            .map_err(|_| rpc_error(endpoint, "contains a NUL byte"))?;
        // SAFETY: NUL-terminated endpoint; the server answered the greeting just now, so
        // ggml's connection (which aborts on failure) is expected to succeed.
        let reg = unsafe { sys::ggml_backend_rpc_add_server(c.as_ptr()) };
        if reg.is_null() {
            return Err(rpc_error(endpoint, "the server reports no devices"));
        }
        // SAFETY: `reg` is a registry ggml made for this endpoint; it lives for the process.
        unsafe { sys::ggml_backend_register(reg) };
        // SAFETY: as above.
        let n = unsafe { sys::ggml_backend_reg_dev_count(reg) };
        for i in 0..n {
            // SAFETY: index < count of a live registry.
            let dev = unsafe { sys::ggml_backend_reg_dev_get(reg, i) };
            added.push(device_info(dev));
        }
        registered.push(endpoint.clone());
    }
    Ok(added)
}

/// Serves this machine's devices named in `device_names` (all GPUs, else the CPU, when empty)
/// on `endpoint` until the process is stopped. `threads` applies to a CPU device; a
/// `cache_dir` keeps large tensors a client sent, so a reconnecting client skips them.
pub fn serve(
    endpoint: &str,
    device_names: &[String],
    threads: usize,
    cache_dir: Option<&Path>,
) -> Result<(), GgmlError> {
    let (host, port) = parse_endpoint(endpoint)?;
    // ggml only says "Failed to create server socket"; trying first names the cause.
    TcpListener::bind((host.as_str(), port))
        .map_err(|e| rpc_error(endpoint, format!("cannot listen there: {e}")))?;
    let local: Vec<sys::ggml_backend_dev_t> = devices()
        .into_iter()
        .filter(|&d| !device_info(d).name.starts_with("RPC"))
        .collect();
    let chosen: Vec<sys::ggml_backend_dev_t> = if device_names.is_empty() {
        let gpus: Vec<_> = local
            .iter()
            .copied()
            .filter(|&d| {
                matches!(
                    device_info(d).kind,
                    DeviceKind::Gpu | DeviceKind::IntegratedGpu
                )
            })
            .collect();
        if gpus.is_empty() {
            local
                .iter()
                .copied()
                .filter(|&d| device_info(d).kind == DeviceKind::Cpu)
                .collect()
        } else {
            gpus
        }
    } else {
        let mut chosen = Vec::new();
        for name in device_names {
            let dev = local
                .iter()
                .copied()
                .find(|&d| device_info(d).name.eq_ignore_ascii_case(name))
                .ok_or_else(|| GgmlError::UnknownDevice(name.clone()))?;
            chosen.push(dev);
        }
        chosen
    };
    if chosen.is_empty() {
        return Err(rpc_error(endpoint, "no local device to serve"));
    }
    let c_endpoint =
        CString::new(endpoint).map_err(|_| rpc_error(endpoint, "contains a NUL byte"))?;
    let c_cache = match cache_dir {
        Some(dir) => Some(
            CString::new(dir.to_string_lossy().as_bytes())
                .map_err(|_| rpc_error(endpoint, "the cache directory contains a NUL byte"))?,
        ),
        None => None,
    };
    let mut chosen = chosen;
    // SAFETY: NUL-terminated strings and a device array that outlive the call; ggml only
    // returns when it cannot start (it reports why on stderr).
    unsafe {
        sys::ggml_backend_rpc_start_server(
            c_endpoint.as_ptr(),
            c_cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            threads.max(1),
            chosen.len(),
            chosen.as_mut_ptr(),
        )
    };
    Err(rpc_error(endpoint, "the RPC server stopped"))
}

/// Serves this process's CPU over RPC on a free loopback port from a thread (it ends with the
/// process), adds that server's devices, and returns the first one's name. Tests and
/// benchmarks use it to run on a device without a GPU.
pub fn serve_loopback(threads: usize) -> Result<String, GgmlError> {
    let endpoint = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| rpc_error("127.0.0.1", format!("no free port: {e}")))?
        .to_string();
    let at = endpoint.clone();
    std::thread::spawn(move || {
        let _ = serve(&at, &["CPU".to_string()], threads, None);
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(&endpoint).is_err() {
        if std::time::Instant::now() > deadline {
            return Err(rpc_error(&endpoint, "the loopback server did not start"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The readiness probe above is itself a client the server has to see off; a greeting
    // sent while it does so can be reset. Try a few times before giving up.
    let mut attempt = 0;
    let devices = loop {
        match add_servers(std::slice::from_ref(&endpoint)) {
            Ok(d) => break d,
            Err(e) if attempt >= 4 => return Err(e),
            Err(_) => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(100 * attempt));
            }
        }
    };
    devices
        .first()
        .map(|d| d.name.clone())
        .ok_or_else(|| rpc_error(&endpoint, "the server reports no devices"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_host_colon_port() {
        assert_eq!(
            parse_endpoint("127.0.0.1:50052").unwrap(),
            ("127.0.0.1".to_string(), 50052)
        );
        assert_eq!(
            parse_endpoint("gpu-box:7").unwrap(),
            ("gpu-box".to_string(), 7)
        );
        for bad in [
            "",
            "localhost",
            ":50052",
            "host:",
            "host:0",
            "host:65536",
            "host:x",
        ] {
            let e = parse_endpoint(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}
