//! PyTorch checkpoints (`.ckpt`, `.pt`, `.pth`, `pytorch_model.bin`): the ZIP format of
//! `torch.save` (PyTorch ≥ 1.6) and the legacy one before it, read without running their
//! pickles (see [`crate::weights::pickle`]).
//!
//! The result is the same as a safetensors header gives: each tensor's name, element type,
//! shape (PyTorch order) and byte range in the file, so the store maps both alike and copies
//! nothing. Every tensor must be one contiguous byte range of a stored (uncompressed) entry:
//! compressed entries and non-contiguous views are refused with an error naming them.
//!
//! Which tensors: upstream's rule (every tensor under a string key of the root dict or of a
//! dict nested in it; see `state_dict.rs`), 0-d tensors (a LoRA's `.alpha`) included. Types the store does not
//! load (uint8, bool, uint16/32/64) come through and are skipped by the store like safetensors
//! ones; complex and quantized tensors are errors, as unknown safetensors dtypes are.
//!
//! Differences from upstream (`model_io/pickle_io.cpp`, `torch_zip_io.cpp`,
//! `torch_legacy_io.cpp`), which is the spec otherwise:
//! - upstream turns every REDUCE it does not know into `None`. Here code-running globals are
//!   refused on sight and applying a global outside the allowlist is refused, so a checkpoint
//!   holding a pickled custom object (a whole `nn.Module`, a custom class among its
//!   hyperparameters) loads upstream but not here;
//! - upstream rejects the whole file on `Byte`/`Bool`/`Short`/`CharStorage`; here int16 and
//!   int8 load, uint8 and bool are skipped;
//! - upstream drops `_rebuild_tensor_v3` tensors (float8, uint16/32/64); here they load like
//!   the same safetensors types;
//! - upstream checks the layout of every tensor in the pickle, here only of those loaded (a
//!   non-contiguous optimizer state does not matter);
//! - upstream reads every `data.pkl` of the archive and inflates compressed entries; here
//!   exactly one `data.pkl` (top level or one folder down) and stored entries only;
//! - upstream also reads a legacy file that lacks the magic-number pickle; here it is required;
//! - a `byteorder` record other than `little`, or a legacy `sys_info` saying big-endian, is
//!   refused (upstream ignores both).

mod legacy;
mod state_dict;
mod zip_format;

use std::path::Path;

pub use legacy::is_torch_legacy;

use super::dtype::SourceDType;
use super::error::{Result, WeightsError};
use super::pickle::PickleError;
use super::zip::LOCAL_MAGIC;

/// Which of torch's two container formats a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchFormat {
    /// A ZIP archive (PyTorch ≥ 1.6).
    Zip,
    /// Back-to-back pickles and raw storages (`_use_new_zipfile_serialization=False`).
    Legacy,
}

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchTensor {
    /// The key it had in its dict.
    pub name: String,
    pub dtype: SourceDType,
    /// PyTorch order (outermost first).
    pub shape: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub len: u64,
}

/// A parsed and validated checkpoint.
#[derive(Debug, Clone)]
pub struct TorchCheckpoint {
    pub format: TorchFormat,
    /// In the order the walk found them (file order).
    pub tensors: Vec<TorchTensor>,
}

/// True when `bytes` starts like a ZIP archive (`PK\x03\x04`), as `torch.save` output does.
pub fn is_torch_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(&LOCAL_MAGIC)
}

/// Parses a checkpoint whose whole file is `bytes`, recognising the format by its magic bytes.
pub fn parse_torch(bytes: &[u8], path: &Path) -> Result<TorchCheckpoint> {
    let (format, tensors) = if is_torch_zip(bytes) {
        (TorchFormat::Zip, zip_format::parse_zip(bytes, path)?)
    } else if is_torch_legacy(bytes) {
        (TorchFormat::Legacy, legacy::parse_legacy(bytes, path)?)
    } else {
        return Err(WeightsError::BadMagic {
            path: path.to_path_buf(),
        });
    };
    Ok(TorchCheckpoint { format, tensors })
}

/// A pickle failure as a [`WeightsError`]: `part` names the pickle, `base` is its offset in
/// the part (so offsets are absolute in a legacy file).
pub(crate) fn pickle_error(e: PickleError, path: &Path, part: &str, base: u64) -> WeightsError {
    match e {
        PickleError::Malformed { offset, reason } => WeightsError::BadPickle {
            path: path.to_path_buf(),
            part: part.to_string(),
            offset: base + offset as u64,
            reason,
        },
        PickleError::Refused {
            offset: _,
            global,
            reason,
        } => WeightsError::PickleRefused {
            path: path.to_path_buf(),
            part: part.to_string(),
            global,
            reason,
        },
    }
}
