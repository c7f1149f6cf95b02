//! One LoRA file: its tensors (mapped, read only when a weight needs them) grouped by the
//! module they adapt.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::delta::Pieces;
use super::keys::{self, LoraTarget};
use super::LoraError;
use crate::weights::TensorStore;

/// A module of a LoRA file: which model part, and its flattened name.
pub type ModuleKey = (LoraTarget, String);

pub struct LoraFile {
    pub path: PathBuf,
    /// The name the prompt gave it (the metadata's name).
    pub name: String,
    /// The summed weights of its tags.
    pub multiplier: f32,
    /// For the high-noise expert of a MoE pair only (`<lora:|high_noise|...>`).
    pub high_noise: bool,
    pub(super) store: TensorStore,
    pub(super) modules: BTreeMap<ModuleKey, Pieces>,
    /// Tensors that are no adapter piece (counted in the `-v` report).
    pub(super) other: Vec<String>,
}

impl LoraFile {
    /// Opens `path` (safetensors, GGUF or a PyTorch checkpoint) and groups its tensors.
    pub fn open(path: &Path, name: &str, multiplier: f32) -> Result<LoraFile, LoraError> {
        let store = TensorStore::open(path).map_err(|e| LoraError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let mut modules: BTreeMap<ModuleKey, Pieces> = BTreeMap::new();
        let mut other = Vec::new();
        for t in store.iter() {
            match keys::parse(&t.name) {
                Some(k) => {
                    modules
                        .entry((k.target, k.module))
                        .or_default()
                        .insert(k.part, t.name.clone());
                }
                None => other.push(t.name.clone()),
            }
        }
        if modules.is_empty() {
            return Err(LoraError::File {
                path: path.to_path_buf(),
                reason: format!(
                    "no LoRA tensors in it (names end in .lora_down/.lora_up, .lora_A/.lora_B, \
                     .hada_*, .lokr_*, .diff){}",
                    other
                        .first()
                        .map(|n| format!("; its first tensor is '{n}'"))
                        .unwrap_or_default()
                ),
            });
        }
        Ok(LoraFile {
            path: path.to_path_buf(),
            name: name.to_string(),
            multiplier,
            high_noise: false,
            store,
            modules,
            other,
        })
    }

    /// The first tensor name of a module (for messages).
    pub(super) fn first_key(&self, key: &ModuleKey) -> &str {
        self.modules
            .get(key)
            .and_then(|p| p.values().next())
            .map_or("", String::as_str)
    }

    /// A1111's short hash of a LoRA ("addnet" hash: SHA-256 of a safetensors file's bytes
    /// after its header, of the whole file otherwise; first 12 hex digits).
    pub fn short_hash(&self) -> Result<String, LoraError> {
        let io = |e: std::io::Error| LoraError::File {
            path: self.path.clone(),
            reason: e.to_string(),
        };
        let mut f = std::fs::File::open(&self.path).map_err(io)?;
        let is_safetensors = self
            .path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"));
        if is_safetensors {
            let mut len = [0u8; 8];
            f.read_exact(&mut len).map_err(io)?;
            let skip = u64::from_le_bytes(len);
            std::io::copy(&mut (&mut f).take(skip), &mut std::io::sink()).map_err(io)?;
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(hex[..12].to_string())
    }
}
