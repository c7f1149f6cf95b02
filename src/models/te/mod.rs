//! Text encoders.

pub mod t5;
