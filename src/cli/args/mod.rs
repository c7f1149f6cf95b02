//! Command-line flags of `sd-cli`, declared with clap derive.
//!
//! Flag spellings, short flags, aliases and defaults follow upstream
//! stable-diffusion.cpp (`examples/common/common.cpp`, `examples/cli/main.cpp`) so existing
//! shell scripts keep working. Flags are split into groups that become help headings.
//! Values are only parsed syntactically here; cross-flag checks live in
//! [`crate::cli::config::RunConfig::resolve`].
//!
//! Compatibility notes:
//! - Upstream takes the next argv element as a flag's value unconditionally, so every
//!   value-taking flag here allows values starting with `-` (`-n "-blurry"`, `-s -1`).
//! - A flag given twice: the last value wins, except the key=value list flags
//!   (`--model-args`, `--extra-sample-args`, `--backend`, ...) whose repeats are joined
//!   with `,` as upstream does.

mod generation;
mod model;
mod output;
mod runtime;
mod sampling;
mod vae;

pub use generation::GenerationArgs;
pub use model::ModelFileArgs;
pub use output::OutputArgs;
pub use runtime::RuntimeArgs;
pub use sampling::{HighNoiseArgs, SamplingArgs};
pub use vae::VaeArgs;

use std::collections::BTreeSet;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

pub use crate::app::Mode;

/// All flags of `sd-cli`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sd-cli",
    about = "Stable diffusion image generation (a Rust port of stable-diffusion.cpp's sd-cli)",
    version,
    disable_version_flag = true,
    args_override_self = true,
    max_term_width = 120
)]
pub struct Cli {
    /// run mode
    #[arg(short = 'M', long = "mode", value_enum, default_value_t = Mode::ImgGen)]
    pub mode: Mode,

    /// print the version and exit
    #[arg(long = "version", action = ArgAction::Version)]
    pub version: Option<bool>,

    #[command(flatten)]
    pub model: ModelFileArgs,

    #[command(flatten)]
    pub generation: GenerationArgs,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    #[command(flatten)]
    pub high_noise: HighNoiseArgs,

    #[command(flatten)]
    pub vae: VaeArgs,

    #[command(flatten)]
    pub runtime: RuntimeArgs,

    #[command(flatten)]
    pub output: OutputArgs,

    #[command(flatten)]
    pub other: OtherArgs,

    /// Long names (`--steps`) of the flags given on the command line, filled by
    /// [`Cli::parse_args_from`]; used by `unimplemented_flags`.
    #[arg(skip)]
    pub given_flags: BTreeSet<String>,
}

/// Logging, metadata-mode, conversion and diagnostics flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Other")]
pub struct OtherArgs {
    /// print extra info
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,

    /// colors the logging tags according to level
    #[arg(long = "color")]
    pub color: bool,

    /// path to the image to inspect (for metadata mode)
    #[arg(long = "image", value_name = "PATH", allow_hyphen_values = true)]
    pub image: Option<std::path::PathBuf>,

    /// metadata output format
    #[arg(long = "metadata-format", value_name = "FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    pub metadata_format: String,

    /// include raw hex previews for unparsed metadata payloads
    #[arg(long = "metadata-raw")]
    pub metadata_raw: bool,

    /// truncate long metadata text values in text output
    #[arg(long = "metadata-brief")]
    pub metadata_brief: bool,

    /// include structural/container entries such as IHDR and IDAT
    #[arg(long = "metadata-all")]
    pub metadata_all: bool,

    /// convert tensor names (for convert mode)
    #[arg(long = "convert-name")]
    pub convert_name: bool,

    /// compute the imatrix for this run and save it to the provided path
    #[arg(long = "imat-out", value_name = "PATH", allow_hyphen_values = true)]
    pub imat_out: Option<std::path::PathBuf>,

    /// load an imatrix file for quantization or continued collection (repeatable)
    #[arg(long = "imat-in", value_name = "PATH", action = ArgAction::Append, allow_hyphen_values = true)]
    pub imat_in: Vec<std::path::PathBuf>,

    /// list available ggml backend devices (one 'name<TAB>description' per line) and exit
    #[arg(long = "list-devices")]
    pub list_devices: bool,

    /// print a shell completion script (bash, zsh, fish, elvish, powershell) and exit
    #[arg(long = "completions", value_name = "SHELL", value_enum)]
    pub completions: Option<clap_complete::Shell>,

    /// print the manual page (roff; `sd-cli --man-page | man -l -`) and exit
    #[arg(long = "man-page")]
    pub man_page: bool,
}

impl Cli {
    /// Parses `args` (the first item is the program name) and records which flags were
    /// given on the command line. Prefer this over `Cli::try_parse_from`, which leaves
    /// `given_flags` empty.
    pub fn parse_args_from<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut cmd = Cli::command();
        let matches = cmd.try_get_matches_from_mut(args)?;
        let mut cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            // Only explicit command-line use counts; defaults have another source.
            if matches.value_source(id) == Some(ValueSource::CommandLine) {
                if let Some(long) = arg.get_long() {
                    cli.given_flags.insert(format!("--{long}"));
                }
            }
        }
        Ok(cli)
    }

    /// Parses the process arguments; prints help/errors and exits like clap does.
    pub fn parse_env() -> Cli {
        match Cli::parse_args_from(std::env::args_os()) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        }
    }
}

/// Value parser: a list of layer indices written like upstream, `[7,8,9]` or `[7 8 9]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerList(pub Vec<i32>);

pub(crate) fn parse_layer_list(s: &str) -> Result<LayerList, String> {
    let t = s.trim();
    let inner = t
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| format!("expected a bracketed list like [7,8,9], got '{s}'"))?;
    let mut out = Vec::new();
    for tok in inner.split([',', ' ']).filter(|x| !x.is_empty()) {
        out.push(
            tok.parse::<i32>()
                .map_err(|_| format!("'{tok}' is not an integer layer index"))?,
        );
    }
    Ok(LayerList(out))
}

/// Value parser: custom sigmas, `14.61,7.8,3.5,0.0` with optional brackets (upstream rule).
#[derive(Debug, Clone, PartialEq)]
pub struct SigmaList(pub Vec<f32>);

pub(crate) fn parse_sigma_list(s: &str) -> Result<SigmaList, String> {
    let mut t = s;
    t = t.strip_prefix('[').unwrap_or(t);
    t = t.strip_suffix(']').unwrap_or(t);
    let mut out = Vec::new();
    for item in t.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let v: f32 = item
            .parse()
            .map_err(|_| format!("invalid float value '{item}'"))?;
        if !v.is_finite() {
            return Err(format!("sigma '{item}' is not finite"));
        }
        out.push(v);
    }
    if out.is_empty() && !t.trim().is_empty() {
        return Err(format!("could not parse any sigma values from '{s}'"));
    }
    Ok(SigmaList(out))
}
