//! Small validation helpers of [`super::config::RunConfig::resolve`]: input files,
//! image sides, threads, seeds, `--max-vram` syntax.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::config::{invalid, CliError, MAX_IMAGE_SIDE};

pub(crate) fn check_file(flag: &'static str, p: &Option<PathBuf>) -> Result<(), CliError> {
    match p {
        Some(p) => check_file_path(flag, p),
        None => Ok(()),
    }
}

pub(crate) fn check_file_path(flag: &'static str, p: &Path) -> Result<(), CliError> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(CliError::InputWrongKind {
            flag,
            path: p.to_path_buf(),
            expected: "file",
        }),
        Err(_) => Err(CliError::InputMissing {
            flag,
            path: p.to_path_buf(),
        }),
    }
}

pub(crate) fn check_dir(flag: &'static str, p: &Path) -> Result<(), CliError> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(CliError::InputWrongKind {
            flag,
            path: p.to_path_buf(),
            expected: "directory",
        }),
        Err(_) => Err(CliError::InputMissing {
            flag,
            path: p.to_path_buf(),
        }),
    }
}

pub(crate) fn read_text(flag: &'static str, p: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(p).map_err(|source| CliError::InputRead {
        flag,
        path: p.to_path_buf(),
        source,
    })
}

/// `-W`/`-H`: -1 (upstream's "unset" sentinel) → `None`; otherwise 1..=16384.
pub(crate) fn image_side(flag: &'static str, v: Option<i32>) -> Result<Option<u32>, CliError> {
    match v {
        None | Some(-1) => Ok(None),
        Some(v) if (1..=MAX_IMAGE_SIDE).contains(&v) => Ok(Some(v as u32)),
        Some(v) => Err(invalid(
            flag,
            v,
            format!("must be between 1 and {MAX_IMAGE_SIDE} pixels (or -1 for the default)"),
        )),
    }
}

/// Number of physical CPU cores (Linux: distinct (package, core) pairs in /proc/cpuinfo);
/// falls back to the logical count.
pub fn physical_cores() -> u32 {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = BTreeSet::new();
    let mut phys = String::new();
    for line in info.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "physical id" => phys = v.trim().to_string(),
            "core id" => {
                cores.insert((phys.clone(), v.trim().to_string()));
            }
            _ => {}
        }
    }
    if cores.is_empty() {
        logical
    } else {
        (cores.len() as u32).min(logical).max(1)
    }
}

/// A seed in [0, 2^31), like upstream's `rand()` after `srand(time)`.
pub(crate) fn random_seed() -> i64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    (h.finish() & 0x7fff_ffff) as i64
}

/// `--max-vram`: a number (GiB, negative = spare that much), or `device=GiB` items.
pub(crate) fn check_max_vram(s: &str) -> Result<(), CliError> {
    for item in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let num = item.split_once('=').map(|(_, v)| v.trim()).unwrap_or(item);
        match num.parse::<f64>() {
            Ok(v) if v.is_finite() => {}
            _ => {
                return Err(invalid(
                    "--max-vram",
                    s,
                    format!("'{item}' is not GiB or device=GiB"),
                ))
            }
        }
    }
    Ok(())
}
