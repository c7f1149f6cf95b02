//! `RunConfig::resolve`: the single place where flags are parsed into the run's types and
//! checked against each other and the file system (inputs exist, output is writable), before
//! any model loads. One function per concern:
//!
//! - [`modes`]: what each mode requires, and that input files exist;
//! - [`generation`]: prompts, size, seed, batch, strength, input images;
//! - [`hires`]: the hires fix;
//! - [`sampling`]: sampler, schedule, guidance, RNG, `--extra-sample-args`;
//! - [`runtime`]: threads, devices and memory;
//! - [`models`]: model files, `--type`, `--model-args`;
//! - [`tiling`]: the VAE tiling flags;
//! - [`output`]: output naming and writability.
//!
//! Rules follow upstream `SDContextParams/SDGenerationParams/SDCliParams::validate` where
//! upstream has one; extra checks (inputs exist, output writable, tiling flag syntax) are ours.

mod generation;
mod hires;
mod models;
mod modes;
mod output;
mod runtime;
pub use runtime::connect_rpc_servers;
mod sampling;
mod tiling;

pub use tiling::{clamp_overlap, parse_relative_tile_size, parse_tile_size};

use super::args::Cli;
use super::error::CliError;
use super::unimplemented::unimplemented_flags;
use crate::app::{Mode, RunConfig};

/// Largest accepted `-W`/`-H`; above this the latent alone would not fit in any device.
pub const MAX_IMAGE_SIDE: i32 = 16384;

impl RunConfig {
    /// Validates `cli` and resolves defaults. No model is touched; the file system is only
    /// read (inputs exist, prompt files) and probed (output directory writable).
    pub fn resolve(cli: Cli) -> Result<RunConfig, CliError> {
        let mut warnings = Vec::new();
        modes::check(&cli)?;
        let gen = generation::resolve(&cli, &mut warnings)?;
        let hires = hires::resolve(&cli, &mut warnings)?;
        let sampling = sampling::resolve(&cli.sampling, &mut warnings)?;
        let models = models::resolve(&cli, &mut warnings)?;
        let vae_tiling = tiling::resolve(&cli.vae, &mut warnings)?;
        tiling::temporal(&cli.vae, &mut warnings);
        let runtime = runtime::resolve(&cli)?;
        let output = output::resolve(&cli, &mut warnings)?;
        let mut cfg = RunConfig {
            mode: cli.mode,
            models: models.files,
            weight_type: models.weight_type,
            model_args: models.model_args,
            prediction: models.prediction,
            lora_apply_mode: models.lora_apply_mode,
            prompt: gen.prompt,
            negative_prompt: gen.negative_prompt,
            width: gen.width,
            height: gen.height,
            seed: gen.seed,
            seed_was_random: gen.seed_was_random,
            batch_count: gen.batch_count,
            clip_skip: gen.clip_skip,
            strength: gen.strength,
            video: gen.video,
            high_noise: sampling::high_noise(&cli, &mut warnings)?,
            inputs: gen.inputs,
            upscale: gen.upscale,
            hires,
            sampling,
            vae_tiling,
            runtime,
            output,
            metadata_image: (cli.mode == Mode::Metadata)
                .then(|| cli.other.image.clone())
                .flatten(),
            warnings,
            given_flags: cli.given_flags.clone(),
            pending_flags: Vec::new(),
        };
        cfg.pending_flags = unimplemented_flags(&cfg);
        Ok(cfg)
    }
}
