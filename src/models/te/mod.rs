//! Text encoders.

pub mod qwen3;
pub mod t5;
