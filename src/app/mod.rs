//! What `sd-cli` does once its flags are validated: the run's configuration ([`RunConfig`])
//! and one module per mode. Image generation is family-agnostic: the family registry
//! (`pipeline::registry`) supplies everything model-specific.

mod config;
mod convert;
mod devices;
mod generate;
mod lora;
mod metadata;
mod output;
pub mod output_path;
mod preview;
mod rpc_server;
mod upscale;

pub use config::{
    HighNoiseSettings, HiresMethod, HiresSettings, InputImages, Mode, OutputConfig,
    PreviewSettings, RunConfig, RuntimeConfig, SamplingConfig, UpscaleSettings, VideoSettings,
};
pub use devices::print_devices;
pub use rpc_server::serve_rpc;

use crate::error::{Error, Result};

/// Runs one validated invocation.
pub fn run(cfg: &RunConfig) -> Result<()> {
    for w in &cfg.warnings {
        log::warn!("{w}");
    }
    if !cfg.pending_flags.is_empty() {
        return Err(Error::Unsupported(format!(
            "not implemented yet: {} (remove the flag to continue)",
            cfg.pending_flags.join(", ")
        )));
    }
    match cfg.mode {
        Mode::Metadata => metadata::run(cfg),
        Mode::Convert => convert::run(cfg),
        Mode::ImgGen | Mode::VidGen => generate::run(cfg),
        Mode::Upscale => upscale::run(cfg),
        other => Err(Error::Unsupported(format!(
            "mode '{}' is not implemented yet in this build",
            other.as_str()
        ))),
    }
}
