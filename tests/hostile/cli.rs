//! Running the `sd-cli` binary and checking that it failed cleanly.

use std::process::{Command, Output};

pub fn sd_cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(args)
        .output()
        .expect("run sd-cli")
}

/// Exit code 1 (not a signal, abort or panic) and an `error:` line naming `needle`.
pub fn assert_clean_failure(o: &Output, needle: &str, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{what}: status {:?}, stderr: {err}",
        o.status
    );
    assert!(!err.contains("panicked"), "{what}: panic: {err}");
    let line = err.lines().find(|l| l.starts_with("error:"));
    let line = line.unwrap_or_else(|| panic!("{what}: no error line: {err}"));
    assert!(
        line.contains(needle),
        "{what}: error line lacks '{needle}': {line}"
    );
}
