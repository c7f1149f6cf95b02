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
    if cli.other.list_devices {
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
    match RunConfig::resolve(cli)
        .map_err(sd_cli::error::Error::from)
        .and_then(|cfg| app::run(&cfg))
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = anyhow::Error::from(e);
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
