//! Errors of the model-file layer. Every variant names the file and, where there is one, the
//! tensor or metadata key, so a user can tell which input is broken and where.

use std::path::PathBuf;

/// Result alias for this module.
pub type Result<T, E = WeightsError> = std::result::Result<T, E>;

/// Everything that can go wrong while reading, validating or writing model files.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("cannot read or write '{path}': {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("'{path}' is truncated: the file ends inside {what}")]
    Truncated { path: PathBuf, what: String },

    #[error("'{path}' is not a GGUF, safetensors or PyTorch checkpoint file (unrecognised magic)")]
    BadMagic { path: PathBuf },

    #[error("'{path}': unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { path: PathBuf, version: u32 },

    #[error("'{path}': header length {len} is too large (limit {limit} bytes)")]
    HeaderTooLarge { path: PathBuf, len: u64, limit: u64 },

    #[error("'{path}': the header is not valid JSON: {reason}")]
    BadJson { path: PathBuf, reason: String },

    #[error("'{path}': malformed header entry '{key}': {reason}")]
    BadHeader {
        path: PathBuf,
        key: String,
        reason: String,
    },

    #[error("'{path}': tensor '{key}' has unknown or unsupported dtype '{dtype}'")]
    UnknownDType {
        path: PathBuf,
        key: String,
        dtype: String,
    },

    #[error("'{path}': tensor '{key}' has an invalid shape: {reason}")]
    BadShape {
        path: PathBuf,
        key: String,
        reason: String,
    },

    #[error("'{path}': tensor '{key}': {reason}")]
    ShapeMismatch {
        path: PathBuf,
        key: String,
        reason: String,
    },

    #[error("'{path}': data of tensor '{key}' (bytes {begin}..{end}) lies outside the data section (size {limit})")]
    OffsetOutOfBounds {
        path: PathBuf,
        key: String,
        begin: u64,
        end: u64,
        limit: u64,
    },

    #[error("'{path}': tensor '{key}' at offset {offset} is not aligned to {alignment} bytes")]
    Misaligned {
        path: PathBuf,
        key: String,
        offset: u64,
        alignment: u64,
    },

    #[error("'{path}': invalid alignment {alignment} (must be a non-zero power of two)")]
    BadAlignment { path: PathBuf, alignment: u64 },

    #[error("'{path}': data of tensors '{key}' and '{other}' overlap")]
    Overlap {
        path: PathBuf,
        key: String,
        other: String,
    },

    #[error("'{path}': duplicate key '{key}'")]
    Duplicate { path: PathBuf, key: String },

    #[error("tensor '{key}' not found in '{file}'")]
    MissingTensor { key: String, file: PathBuf },

    #[error("'{path}': {what} count {count} exceeds the limit {limit} or what the file can hold")]
    TooMany {
        path: PathBuf,
        what: String,
        count: u64,
        limit: u64,
    },

    #[error("'{path}': string of {len} bytes in {what} runs past the end of the file")]
    StringTooLong {
        path: PathBuf,
        what: String,
        len: u64,
    },

    #[error("'{path}': invalid tensor name '{key}': {reason}")]
    BadName {
        path: PathBuf,
        key: String,
        reason: String,
    },

    #[error("'{path}': metadata key '{key}': {reason}")]
    BadValue {
        path: PathBuf,
        key: String,
        reason: String,
    },

    #[error("'{path}': invalid safetensors index: {reason}")]
    BadIndex { path: PathBuf, reason: String },

    #[error("'{path}' is not a model file or folder this program can read: {reason}")]
    NotAModel { path: PathBuf, reason: String },

    #[error("'{path}': invalid zip archive: {reason}")]
    BadZip { path: PathBuf, reason: String },

    #[error("'{path}': {part}: malformed pickle at byte {offset}: {reason}")]
    BadPickle {
        path: PathBuf,
        /// Which pickle: a zip entry (`archive/data.pkl`) or a legacy file's section.
        part: String,
        offset: u64,
        reason: String,
    },

    #[error("'{path}': {part}: refuses to call {global}: {reason}")]
    PickleRefused {
        path: PathBuf,
        part: String,
        /// `module.name` of the refused global.
        global: String,
        reason: String,
    },

    #[error("'{path}': unsupported PyTorch checkpoint: {reason}")]
    UnsupportedTorch { path: PathBuf, reason: String },

    #[error("cannot convert tensor '{key}': {reason}")]
    Convert { key: String, reason: String },
}

impl WeightsError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WeightsError::Io {
            path: path.into(),
            source,
        }
    }
}
