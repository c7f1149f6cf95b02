//! Diffusion transformers.

pub mod pixart;
pub mod qwen_image_2_1;
