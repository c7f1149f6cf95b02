#![deny(unsafe_code)]
//! sd-cli: stable-diffusion.cpp's command-line image generator, rebuilt in Rust on ggml.
//!
//! Architecture map (one-way dependencies, top to bottom):
//! - [`cli`]: clap flags → validated `RunConfig`; mode dispatch.
//! - `pipeline` (per family): condition → sample → decode; no ggml calls.
//! - [`runner`]: owns a backend and model weights, builds a graph per call from a pure
//!   `forward`, allocates, computes, reads outputs back; named persistent cache.
//! - [`nn`]: shared blocks (Linear, Conv2d, norms, attention, embeddings, rope).
//! - [`weights`]: model files (safetensors, GGUF) → `TensorStore`; name normalisation.
//! - [`ggml`]: the only `unsafe`: bindings, contexts, tensors, ops, graphs, backends.

// ggml is linked through this crate; referencing it keeps its static libraries in the link.
extern crate llama_cpp_sys_2;

pub mod app;
pub mod cli;
pub mod dtype;
pub mod error;
#[allow(unsafe_code)]
pub mod ggml;
pub mod image_io;
pub mod logging;
pub mod models;
pub mod nn;
pub mod pipeline;
pub mod progress;
pub mod rng;
pub mod runner;
pub mod sampling;
pub mod tensor;
pub mod tokenizers;
pub mod weights;
