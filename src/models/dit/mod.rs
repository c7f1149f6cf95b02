//! Diffusion transformers.

pub mod pixart;
