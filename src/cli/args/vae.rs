//! "VAE" group: VAE format, tiling and convolution options.

use clap::ArgAction;

/// VAE encode/decode settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "VAE")]
pub struct VaeArgs {
    /// process vae encode and decode in spatial tiles to reduce memory usage (default tile: 256x256 image pixels)
    #[arg(long = "vae-tiling")]
    pub vae_tiling: bool,

    /// tile size for vae encode and decode in image pixels, format [W]x[H] or [S]; 0 on an axis =
    /// default (256) [requires --vae-tiling]
    #[arg(
        long = "vae-tile-size",
        value_name = "WxH|S",
        allow_hyphen_values = true
    )]
    pub vae_tile_size: Option<String>,

    /// relative tile size, format [W]x[H] or [S]: <= 1 is a fraction of the image, > 1 a target
    /// tile count (overrides --vae-tile-size) [requires --vae-tiling]
    #[arg(
        long = "vae-relative-tile-size",
        value_name = "WxH|S",
        allow_hyphen_values = true
    )]
    pub vae_relative_tile_size: Option<String>,

    /// tile overlap for vae tiling, in fraction of tile size, clamped to [0, 0.5] [default: 0.5]
    /// [requires --vae-tiling]
    #[arg(
        long = "vae-tile-overlap",
        value_name = "FLOAT",
        allow_negative_numbers = true
    )]
    pub vae_tile_overlap: Option<f32>,

    /// enable temporal tiling for LTX video VAE decode
    #[arg(long = "temporal-tiling")]
    pub temporal_tiling: bool,

    /// extra VAE tiling args, key=value list (LTX video VAE: temporal_tile_frames, temporal_tile_overlap)
    #[arg(long = "extra-tiling-args", value_name = "K=V,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub extra_tiling_args: Vec<String>,

    /// VAE latent format override
    #[arg(long = "vae-format", value_name = "FORMAT", default_value = "auto",
          value_parser = ["auto", "flux", "sd3", "flux2", "wan"])]
    pub vae_format: String,

    /// keep the vae on the CPU (deprecated upstream; same as --backend vae=cpu)
    #[arg(long = "vae-on-cpu")]
    pub vae_on_cpu: bool,

    /// use direct 2D convolution in the vae model
    #[arg(long = "vae-conv-direct")]
    pub vae_conv_direct: bool,

    /// force use of conv scale on sdxl vae
    #[arg(long = "force-sdxl-vae-conv-scale")]
    pub force_sdxl_vae_conv_scale: bool,
}
