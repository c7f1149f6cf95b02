//! Command-line parsing and validation (`Cli` → `RunConfig` → the sampling plan), without running
//! anything. Arguments are the input split at NUL bytes. Validation probes the file system
//! (inputs exist, output writable), so arguments with path separators are only parsed, never
//! resolved: the fuzzer cannot make it touch files outside its working directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sd_cli::pipeline::registry::FAMILIES;
use sd_cli::cli::{Cli, RunConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<&str> = std::iter::once("sd-cli").chain(text.split('\0')).collect();
    let Ok(cli) = Cli::parse_args_from(args.iter()) else {
        return;
    };
    if args
        .iter()
        .any(|a| a.contains('/') || a.contains('\\') || a.starts_with('~'))
    {
        return;
    }
    if let Ok(cfg) = RunConfig::resolve(cli) {
        for family in FAMILIES {
            let _ = cfg.plan(&family.defaults());
        }
        let _ = cfg.output_path_for(0);
    }
});
