//! Mode dispatch: what `sd-cli` does once its flags are validated.

mod backends;
mod convert;
mod devices;
mod generate;
mod metadata;
mod sampling_setup;

use crate::cli::{unimplemented_flags, unimplemented_mode, Mode, RunConfig};
use crate::error::{Error, Result};

pub use backends::{BackendPlan, Module};
pub use devices::print_devices;
pub use sampling_setup::SamplingSetup;

/// Runs one validated invocation.
pub fn run(cfg: &RunConfig) -> Result<()> {
    for w in &cfg.warnings {
        log::warn!("{w}");
    }
    if let Some(mode) = unimplemented_mode(cfg) {
        return Err(Error::Unsupported(format!(
            "mode '{}' is not implemented yet in this build",
            mode.as_str()
        )));
    }
    let pending = unimplemented_flags(cfg);
    if !pending.is_empty() {
        return Err(Error::Unsupported(format!(
            "not implemented yet: {} (remove the flag to continue)",
            pending.join(", ")
        )));
    }
    match cfg.mode {
        Mode::Metadata => metadata::run(cfg),
        Mode::Convert => convert::run(cfg),
        Mode::ImgGen => generate::run(cfg),
        other => Err(Error::Unsupported(format!(
            "mode '{}' is not implemented yet",
            other.as_str()
        ))),
    }
}
