//! "Output" group: result path and naming, metadata embedding, previews.

use std::path::PathBuf;

/// Where results (and previews) go.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// path to write the result image to; printf-style %d specifiers number image sequences
    /// (e.g. output_%03d.png)
    #[arg(
        short = 'o',
        long = "output",
        value_name = "PATH",
        default_value = "output.png",
        allow_hyphen_values = true
    )]
    pub output: String,

    /// starting index for numbered outputs, must be non-negative [default: 0]
    #[arg(
        long = "output-begin-idx",
        value_name = "INT",
        allow_negative_numbers = true
    )]
    pub output_begin_idx: Option<i32>,

    /// do not embed generation metadata in image files
    #[arg(long = "disable-image-metadata")]
    pub disable_image_metadata: bool,

    /// preview method
    #[arg(long = "preview", value_name = "METHOD", default_value = "none",
          value_parser = ["none", "proj", "tae", "vae"])]
    pub preview: String,

    /// path to write the preview image to
    #[arg(
        long = "preview-path",
        value_name = "PATH",
        default_value = "preview.png",
        allow_hyphen_values = true
    )]
    pub preview_path: PathBuf,

    /// interval in denoising steps between preview updates
    #[arg(
        long = "preview-interval",
        value_name = "INT",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub preview_interval: i32,

    /// preview the noisy inputs of the model rather than the denoised outputs
    #[arg(long = "preview-noisy")]
    pub preview_noisy: bool,

    /// use taesd only for previews, not for decoding the final image (with --preview tae)
    #[arg(long = "taesd-preview-only")]
    pub taesd_preview_only: bool,
}
