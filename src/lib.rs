#![deny(unsafe_code)]
//! sd-cli: stable-diffusion.cpp's command-line image generator, rebuilt in Rust on ggml.
//!
//! Architecture map (one-way dependencies, top to bottom; see CONTRIBUTING.md):
//! - [`cli`]: clap flags → `RunConfig::resolve`, the only place flags are parsed and checked.
//! - [`app`]: the validated [`app::RunConfig`] (domain types only) and one module per mode;
//!   image generation is one family-agnostic batch loop.
//! - [`pipeline`]: the family registry ([`pipeline::registry`]): each family a folder
//!   (detection, components and the flags that feed them, defaults, `--model-args`, prompt
//!   template, loading, condition → sample → decode); shared stages (components' own files,
//!   the VAE stage). No ggml calls.
//! - [`models`] (architectures, one folder each, shared by families), [`sampling`] (schedules,
//!   samplers, the guided denoiser), [`tokenizers`], [`image_io`], [`rng`].
//! - [`nn`]: shared blocks (Linear, Conv2d, norms, attention, embeddings, rope).
//! - [`runner`]: owns a backend and model weights, builds a graph per call from a pure
//!   `forward`, allocates, computes, reads outputs back; named cache; graph-cut segments;
//!   device placement.
//! - [`weights`]: model files (safetensors, GGUF, PyTorch checkpoints through a restricted
//!   unpickler) → `TensorStore`; name normalisation.
//! - [`ggml`]: the only `unsafe`: bindings, contexts, tensors, ops, graphs, backends, the
//!   blocked CPU kernels. Leaf types shared by all: [`dtype`] (the one tensor-type table) and
//!   [`tensor`] (host tensors, the one host image type).

// ggml is linked through this crate; referencing it keeps its static libraries in the link.
extern crate llama_cpp_sys_2;

pub mod app;
pub mod cli;
pub mod cpu_info;
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
