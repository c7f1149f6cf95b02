//! `--rpc-server`: serves this machine's devices to other `sd-cli` runs over ggml RPC.

use std::net::IpAddr;
use std::path::Path;

use crate::error::Result;
use crate::ggml::rpc;

/// Listens on `host:port` until the process is stopped; `devices` are local device names
/// (none: the GPUs, else the CPU).
pub fn serve_rpc(
    host: &str,
    port: u16,
    devices: &[String],
    threads: usize,
    cache_dir: Option<&Path>,
) -> Result<()> {
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        log::warn!(
            "the RPC server on {host}:{port} has no authentication and no encryption: anyone \
             who can reach this port can use this machine's devices and memory. Use it only \
             on a trusted network."
        );
    }
    if let Some(dir) = cache_dir {
        std::fs::create_dir_all(dir).map_err(|e| crate::error::Error::Flag {
            flag: "--rpc-cache".into(),
            reason: format!("cannot create '{}': {e}", dir.display()),
        })?;
    }
    rpc::serve(&format!("{host}:{port}"), devices, threads, cache_dir)?;
    Ok(())
}
