//! Command-line front end: flags ([`args`]) and `RunConfig::resolve` ([`resolve`]), which
//! turns them into the run's types ([`crate::app::RunConfig`]), checked, before any model
//! loads. Flags that parse but are not implemented yet are listed in [`unimplemented`].

pub mod args;
mod checks;
mod docs;
mod error;
pub mod resolve;
pub mod unimplemented;

pub use crate::app::{Mode, RunConfig};
pub use args::Cli;
pub use checks::physical_cores;
pub use docs::{print_completions, print_man_page};
pub use error::CliError;
pub use resolve::connect_rpc_servers;
pub use unimplemented::{unimplemented_flags, unimplemented_mode};
