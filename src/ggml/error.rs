use thiserror::Error;

/// Failures of the ggml layer. Graph building never fails; these come from allocation,
/// compute and device selection.
#[derive(Debug, Error)]
pub enum GgmlError {
    #[error("ggml could not create a context of {bytes} bytes")]
    ContextInit { bytes: usize },
    #[error("out of memory on {device}: could not allocate {bytes} bytes for {what}")]
    OutOfMemory {
        device: String,
        what: String,
        bytes: usize,
    },
    #[error("graph compute failed on {device}: {status}")]
    Compute { device: String, status: String },
    #[error(
        "{device} cannot run op {op} (node '{tensor}', operands {types}); \
         run this component on another device (--backend)"
    )]
    UnsupportedOp {
        device: String,
        op: String,
        tensor: String,
        types: String,
    },
    #[error("no compute device named '{0}' (run with --list-devices to see the choices)")]
    UnknownDevice(String),
    #[error("could not initialise compute device '{0}'")]
    DeviceInit(String),
    #[error("tensor data size mismatch for '{name}': expected {expected} bytes, got {got}")]
    DataSize {
        name: String,
        expected: usize,
        got: usize,
    },
    #[error("tensor '{0}' has no memory bound (never allocated, or its memory was released)")]
    Unbound(String),
    #[error("tensor memory binding: {0}")]
    Binding(String),
    #[error("RPC server {endpoint}: {reason}")]
    Rpc { endpoint: String, reason: String },
    #[error("tensor '{name}' has type {ty}, which cannot be read back as f32")]
    Unreadable { name: String, ty: String },
}
