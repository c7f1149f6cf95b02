//! Read-only memory maps of model files.
//!
//! Mapping a file is an `unsafe` operation (done in `ggml::map_readonly`): memmap2 cannot promise that no
//! other process truncates or rewrites the file while it is mapped. We accept that risk the way
//! every GGUF/safetensors loader does (llama.cpp, candle, safetensors): the maps are read-only,
//! and all offsets are validated against the mapped length before any slice is taken.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::ggml::{map_readonly, release_resident};

use super::error::{Result, WeightsError};

/// A read-only mapped file together with its path (for error messages).
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

impl MappedFile {
    /// Opens and maps `path` read-only.
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| WeightsError::io(path, e))?;
        let map = map_readonly(&file).map_err(|e| WeightsError::io(path, e))?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            map,
        })
    }

    /// The file's path as given to [`MappedFile::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// If `bytes` lies inside this map, drops its resident pages (see
    /// [`release_resident`]) and returns true.
    pub fn release(&self, bytes: &[u8]) -> bool {
        let base = self.map.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        match start.checked_sub(base) {
            Some(offset) if offset + bytes.len() <= self.map.len() => {
                release_resident(&self.map, offset, bytes.len());
                true
            }
            _ => false,
        }
    }
}
