//! LoRA and its relatives (LoHa, LoKr, full differences) named in the prompt with
//! `<lora:NAME:WEIGHT>` (upstream `docs/lora.md`).
//!
//! The prompt's tags name files under `--lora-model-dir` ([`tags`], [`requests`]); each file's
//! tensors are grouped by the module they adapt ([`keys`], [`file`]); when a component loads,
//! its declared weights are matched by name — their own, or the other names the family's
//! alias rules give them ([`names`]) — and each match becomes a difference ([`delta`]) that the
//! weight loader merges into the weight or keeps beside it for the graph
//! (`--lora-apply-mode`, see `runner::adapters`).

pub mod delta;
pub mod file;
pub mod keys;
pub mod names;
mod set;
pub mod tags;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;

pub use file::LoraFile;
pub use set::LoraSet;

/// `--lora-apply-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoraApplyMode {
    /// at_runtime when a model weight is quantized (in its file or by `--type`), else
    /// immediately (upstream's rule).
    #[default]
    Auto,
    Immediately,
    AtRuntime,
}

impl std::str::FromStr for LoraApplyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "immediately" => Ok(Self::Immediately),
            "at_runtime" => Ok(Self::AtRuntime),
            _ => Err(format!(
                "unknown LoRA apply mode '{s}' (auto, immediately, at_runtime)"
            )),
        }
    }
}

#[derive(Debug, Error)]
pub enum LoraError {
    #[error("LoRA '{name}' named in the prompt: no file {tried} (looked in --lora-model-dir)")]
    Missing { name: String, tried: String },
    #[error("LoRA {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("LoRA {path}: none of its modules matches a weight of this {family} model (first key '{first_key}'); is it a LoRA for another model family?")]
    NoMatch {
        path: PathBuf,
        family: String,
        first_key: String,
    },
}

/// Extensions tried after NAME, as upstream.
const EXTENSIONS: [&str; 4] = [".gguf", ".safetensors", ".pt", ".ckpt"];

/// One LoRA file a prompt asks for, with its summed weight.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraRequest {
    pub path: PathBuf,
    /// The NAME of its (first) tag.
    pub name: String,
    pub weight: f32,
    /// Tagged `<lora:|high_noise|NAME:W>`: for the high-noise expert of a MoE pair
    /// (`--high-noise-diffusion-model`) only; plain tags never reach that model (upstream).
    pub high_noise: bool,
}

/// The file a tag names: NAME as a path (absolute, or under `dir`), else with one of the
/// upstream extensions appended.
fn find_file(dir: &Path, name: &str) -> Result<PathBuf, LoraError> {
    let base = if Path::new(name).is_absolute() {
        PathBuf::from(name)
    } else {
        dir.join(name)
    };
    if base.is_file() {
        return Ok(base);
    }
    for ext in EXTENSIONS {
        let mut p = base.clone().into_os_string();
        p.push(ext);
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(LoraError::Missing {
        name: name.to_string(),
        tried: format!(
            "{} or {}{{.gguf,.safetensors,.pt,.ckpt}}",
            base.display(),
            base.display()
        ),
    })
}

/// The prompt without its tags, and the files they name (a file named twice for the same
/// model sums its weights; a tag whose weight is no number is dropped, as upstream).
pub fn requests(prompt: &str, dir: &Path) -> Result<(String, Vec<LoraRequest>), LoraError> {
    let (text, found) = tags::extract(prompt);
    let mut by_path: BTreeMap<(bool, PathBuf), LoraRequest> = BTreeMap::new();
    for t in found {
        let Some(weight) = t.weight else {
            log::warn!("LoRA tag '{}': its weight is not a number; ignored", t.name);
            continue;
        };
        let path = find_file(dir, &t.name)?;
        by_path
            .entry((t.high_noise, path.clone()))
            .and_modify(|r| r.weight += weight)
            .or_insert(LoraRequest {
                path,
                name: t.name,
                weight,
                high_noise: t.high_noise,
            });
    }
    Ok((text, by_path.into_values().collect()))
}

/// Opens the requested files.
pub fn open_all(requests: &[LoraRequest]) -> Result<Vec<LoraFile>, LoraError> {
    requests
        .iter()
        .map(|r| {
            let mut f = LoraFile::open(&r.path, &r.name, r.weight)?;
            f.high_noise = r.high_noise;
            Ok(f)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_sum_and_find_extensions() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.safetensors"), b"x").unwrap();
        std::fs::write(dir.path().join("b.ckpt"), b"x").unwrap();
        let (p, r) = requests(
            "x <lora:a:0.5> y <lora:b:1> <lora:a.safetensors:0.25> <lora:c:zz>",
            dir.path(),
        )
        .unwrap();
        assert_eq!(p, "x  y   ");
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].weight, 0.75);
        assert!(r[1].path.ends_with("b.ckpt"));
        let err = requests("<lora:nope:1>", dir.path()).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        // The same file for both experts is two requests; each sums its own tags.
        let (_, r) = requests(
            "<lora:a:1><lora:|high_noise|a:0.5><lora:|high_noise|a:0.25>",
            dir.path(),
        )
        .unwrap();
        let w: Vec<_> = r.iter().map(|r| (r.high_noise, r.weight)).collect();
        assert_eq!(w, vec![(false, 1.0), (true, 0.75)]);
    }
}
