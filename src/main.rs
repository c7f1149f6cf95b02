//! `sd-cli`: parse flags, run, print the whole error chain on failure.

use std::process::ExitCode;

use sd_cli::app;
use sd_cli::cli::{Cli, RunConfig};

fn main() -> ExitCode {
    let cli = match Cli::parse_args_from(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    sd_cli::logging::init(cli.other.verbose);
    sd_cli::ggml::exit_on_abort();
    if cli.runtime.rpc_server {
        return report(serve_rpc(&cli));
    }
    if cli.other.list_devices {
        if let Err(e) = sd_cli::cli::connect_rpc_servers(&cli) {
            return report(Err(e.into()));
        }
        app::print_devices();
        return ExitCode::SUCCESS;
    }
    if let Some(shell) = cli.other.completions {
        sd_cli::cli::print_completions(shell);
        return ExitCode::SUCCESS;
    }
    if cli.other.man_page {
        return match sd_cli::cli::print_man_page() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: writing the manual page: {e}");
                ExitCode::FAILURE
            }
        };
    }
    report(
        RunConfig::resolve(cli)
            .map_err(sd_cli::error::Error::from)
            .and_then(|cfg| app::run(&cfg)),
    )
}

/// `--rpc-server`: `--backend` lists the local devices to serve (plain names, no `role=`).
fn serve_rpc(cli: &Cli) -> sd_cli::error::Result<()> {
    let r = &cli.runtime;
    let mut devices = Vec::new();
    for entry in r.backend.join(",").split(',').map(str::trim) {
        if entry.is_empty() || entry.eq_ignore_ascii_case("auto") {
            continue;
        }
        if entry.contains('=') {
            return Err(sd_cli::error::Error::Flag {
                flag: "--backend".into(),
                reason: format!(
                    "'{entry}': with --rpc-server, --backend lists the devices to serve \
                     (e.g. cpu or CUDA0,CUDA1), not components"
                ),
            });
        }
        devices.push(entry.to_string());
    }
    let threads = if r.threads <= 0 {
        sd_cli::cli::physical_cores() as usize
    } else {
        r.threads as usize
    };
    app::serve_rpc(&r.host, r.port, &devices, threads, r.rpc_cache.as_deref())
}

/// Exit status 0, or the whole error chain on stderr and status 1.
fn report(result: sd_cli::error::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = anyhow::Error::from(e);
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
