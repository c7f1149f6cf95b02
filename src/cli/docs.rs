//! Shell completions and the manual page, generated from the flags themselves (clap).

use std::io::Write;

use clap::CommandFactory;

use super::Cli;

/// Writes the completion script of `shell` to stdout.
pub fn print_completions(shell: clap_complete::Shell) {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "sd-cli", &mut std::io::stdout());
}

/// Writes the roff manual page to stdout.
pub fn print_man_page() -> std::io::Result<()> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut out)?;
    std::io::stdout().write_all(&out)
}
