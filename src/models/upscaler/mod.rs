//! Image upscalers (`-M upscale`, `--upscale-model`).

pub mod esrgan;
