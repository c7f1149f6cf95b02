//! The ggml engine: the only place in the crate with `unsafe`.
//!
//! Shapes near ggml are kept in ggml's `ne` order (innermost dimension first), and names
//! that hold such shapes say so (`ne`, [`Ne`]). Graph building is infallible (a shape bug
//! is a programming error that ggml asserts on); allocation and compute return `Result`.

mod arena;
mod backend;
mod context;
mod error;
mod gemm;
mod graph;
mod inspect;
mod logging;
mod mmap;
mod ops;
mod quant;
pub mod rpc;
#[allow(unsafe_code)]
mod sys;
mod types;

pub use arena::{Arena, ReplicaId};
pub use backend::{
    list_devices, Allocation, Backend, BackendChoice, BoundBuffer, DeviceInfo, DeviceKind, Gallocr,
};
pub use context::{Context, Tensor};
pub use error::GgmlError;
pub use gemm::{
    amx_bf16_granted, blocked_gemm_available, AttentionPrecision, BlockedOp, ConvGeometry,
    CpuKernels, Then,
};
pub use graph::{ComputeGraph, Graph, SubGraph};
pub use inspect::MAX_SRC;
pub use logging::{exit_on_abort, set_verbose};
pub use mmap::{map_readonly, release_resident};
pub use ops::{RopeMode, ScaleMode};
pub use quant::{dequantize_rows, quantize_rows, QuantizeError};

/// ggml's limit on tensor names (the C struct holds 64 bytes including the terminator).
pub const MAX_NAME_LEN: usize = 63;

#[cfg(test)]
mod binding_tests;
