//! Command-line front end: flags ([`args`]), the `--model-args` / `--extra-sample-args`
//! parsers ([`model_args`]), output naming ([`output_path`]), VAE tiling flag syntax
//! ([`tiling`]) and the validated run configuration ([`config`]).

pub mod args;
mod checks;
pub mod config;
pub mod model_args;
pub mod output_path;
pub mod ref_image_args;
pub mod tiling;
pub mod unimplemented;

pub use args::{Cli, Mode};
pub use checks::physical_cores;
pub use config::{align_size_up, CliError, RunConfig};
pub use model_args::{ModelArgs, PrefixCacheType};
pub use ref_image_args::RefImageArgs;
pub use tiling::VaeTiling;
pub use unimplemented::{unimplemented_flags, unimplemented_mode};
