//! Model files: safetensors, GGUF and PyTorch checkpoint readers (memory-mapped, validating;
//! checkpoints through a restricted unpickler that runs nothing), a GGUF writer,
//! [`TensorStore`] (name → type, shape, file, offset), element types, and checkpoint name
//! normalisation.
//!
//! This layer is pure Rust and never touches ggml: it describes where each tensor's bytes are
//! and what ggml type they load as. Every size, count and offset read from a file is checked
//! against the file's length with overflow-safe arithmetic before it is used, so hostile or
//! truncated files produce a [`WeightsError`] naming the file and key, never a panic or a huge
//! allocation.
//!
//! Shapes near ggml use ggml's `ne` order (innermost first); safetensors and checkpoint shapes
//! (PyTorch order) are reversed when they enter the store.

pub mod dtype;
pub mod error;
pub mod gguf;
pub mod gguf_writer;
pub mod mmap;
pub mod names;
pub mod pickle;
pub mod safetensors;
pub mod store;
pub mod torch;
pub mod zip;

pub use dtype::{convert_for_load, to_f32, SourceDType};
pub use error::{Result, WeightsError};
pub use gguf::{GgufHeader, GgufMetadata, GgufTensorInfo, GgufType, GgufValue, GgufWriter};
pub use names::{normalize_name, Component};
pub use store::{FileFormat, FileMeta, TensorInfo, TensorStore};
pub use torch::TorchFormat;

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A buffered writer that names its file in errors.
pub(crate) struct PathWriter<'p> {
    path: &'p Path,
    inner: BufWriter<File>,
}

impl PathWriter<'_> {
    pub(crate) fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.inner
            .write_all(bytes)
            .map_err(|e| WeightsError::io(self.path, e))
    }
}

/// Writes `path` atomically: the body goes to a temporary file in the same folder, which is
/// flushed, synced and renamed over `path`; on any error the temporary file is removed.
pub(crate) fn write_atomic<F>(path: &Path, body: F) -> Result<()>
where
    F: FnOnce(&mut PathWriter<'_>) -> Result<()>,
{
    let file_name = path.file_name().ok_or_else(|| {
        WeightsError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"),
        )
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp: PathBuf = path.with_file_name(tmp_name);
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| WeightsError::io(&tmp, e))?;
        let mut w = PathWriter {
            path: &tmp,
            inner: BufWriter::new(file),
        };
        body(&mut w)?;
        let file = w
            .inner
            .into_inner()
            .map_err(|e| WeightsError::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| WeightsError::io(&tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| WeightsError::io(path, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
