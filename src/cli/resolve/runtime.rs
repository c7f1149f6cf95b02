//! Threads, devices and memory.

use crate::app::RuntimeConfig;
use crate::cli::args::Cli;
use crate::cli::checks::physical_cores;
use crate::cli::error::{invalid, CliError};
use crate::ggml::BackendChoice;
use crate::runner::{BackendSpec, MaxVram, MemoryOptions, Role};

/// Connects the `--rpc-servers`, so their devices (`RPC0`, ...) can be named in `--backend`
/// and `--max-vram` and show in `--list-devices`.
pub fn connect_rpc_servers(cli: &Cli) -> Result<(), CliError> {
    let text = cli.runtime.rpc_servers.join(",");
    let endpoints: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(String::from)
        .collect();
    if endpoints.is_empty() {
        return Ok(());
    }
    let added = crate::ggml::rpc::add_servers(&endpoints)
        .map_err(|e| invalid("--rpc-servers", &text, e.to_string()))?;
    for d in added {
        log::info!("RPC device {} on {}", d.name, d.description);
    }
    Ok(())
}

pub(super) fn resolve(cli: &Cli) -> Result<RuntimeConfig, CliError> {
    connect_rpc_servers(cli)?;
    let r = &cli.runtime;
    let threads = if r.threads <= 0 {
        physical_cores()
    } else {
        r.threads as u32
    };
    let backend_text = r.backend.join(",");
    let mut backends =
        BackendSpec::parse(&backend_text).map_err(|e| invalid("--backend", &backend_text, e))?;
    // The deprecated placement flags say the same as `--backend te=cpu` / `vae=cpu`.
    if r.clip_on_cpu {
        backends.set(Role::TextEncoder, BackendChoice::Cpu);
    }
    if cli.vae.vae_on_cpu {
        backends.set(Role::Vae, BackendChoice::Cpu);
    }
    let max_vram =
        MaxVram::parse(&r.max_vram).map_err(|e| invalid("--max-vram", &r.max_vram, e))?;
    Ok(RuntimeConfig {
        threads,
        backends,
        memory: MemoryOptions {
            max_vram,
            offload_to_cpu: r.offload_to_cpu,
            prefetch: !r.disable_prefetch,
            segmented: !r.disable_segmented_compute,
            ..MemoryOptions::default()
        },
        mmap: r.mmap,
        flash_attn: r.fa || r.diffusion_fa,
        verbose: cli.other.verbose,
        color: cli.other.color,
    })
}
