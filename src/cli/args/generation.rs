//! "Generation" group: prompts, size, seed, batch, input images, and the rarer generation
//! features (video, hires fix, ADetailer, PhotoMaker, PuLID) under their own headings.

use std::path::PathBuf;

use clap::ArgAction;

const VIDEO: &str = "Video";
const HIRES: &str = "Hires fix";
const EXTRAS: &str = "ADetailer, PhotoMaker, PuLID, upscaling";

/// What to generate and from which inputs.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Generation")]
pub struct GenerationArgs {
    /// the prompt to render
    #[arg(
        short = 'p',
        long = "prompt",
        value_name = "TEXT",
        default_value = "",
        hide_default_value = true,
        allow_hyphen_values = true,
        conflicts_with = "prompt_file"
    )]
    pub prompt: String,

    /// the negative prompt (default: "")
    #[arg(
        short = 'n',
        long = "negative-prompt",
        value_name = "TEXT",
        default_value = "",
        hide_default_value = true,
        allow_hyphen_values = true,
        conflicts_with = "negative_prompt_file"
    )]
    pub negative_prompt: String,

    /// path to the file containing the prompt to render
    #[arg(long = "prompt-file", value_name = "PATH", allow_hyphen_values = true)]
    pub prompt_file: Option<PathBuf>,

    /// path to the file containing the negative prompt
    #[arg(
        long = "negative-prompt-file",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub negative_prompt_file: Option<PathBuf>,

    /// image width, in pixel space [default: 512, or the init image's width]
    #[arg(
        short = 'W',
        long = "width",
        value_name = "INT",
        allow_negative_numbers = true
    )]
    pub width: Option<i32>,

    /// image height, in pixel space [default: 512, or the init image's height]
    #[arg(
        short = 'H',
        long = "height",
        value_name = "INT",
        allow_negative_numbers = true
    )]
    pub height: Option<i32>,

    /// RNG seed (use a random seed for < 0)
    #[arg(
        short = 's',
        long = "seed",
        value_name = "INT",
        default_value_t = 42,
        allow_negative_numbers = true
    )]
    pub seed: i64,

    /// number of images to generate
    #[arg(
        short = 'b',
        long = "batch-count",
        value_name = "INT",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub batch_count: i32,

    /// ignore last layers of CLIP network; 1 ignores none, 2 ignores one layer; <= 0 = model default
    #[arg(long = "clip-skip", value_name = "INT", default_value_t = -1, allow_negative_numbers = true)]
    pub clip_skip: i32,

    /// strength for noising/unnoising (img2img)
    #[arg(
        long = "strength",
        value_name = "FLOAT",
        default_value_t = 0.75,
        allow_negative_numbers = true
    )]
    pub strength: f32,

    /// path to the init image
    #[arg(
        short = 'i',
        long = "init-img",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub init_img: Option<PathBuf>,

    /// path to the end image, required by flf2v
    #[arg(long = "end-img", value_name = "PATH", allow_hyphen_values = true)]
    pub end_img: Option<PathBuf>,

    /// path to the mask image
    #[arg(long = "mask", value_name = "PATH", allow_hyphen_values = true)]
    pub mask: Option<PathBuf>,

    /// reference image for edit models (Flux Kontext, Qwen Image edit, ...); repeatable, order kept
    #[arg(short = 'r', long = "ref-image", value_name = "PATH", action = ArgAction::Append, allow_hyphen_values = true)]
    pub ref_image: Vec<PathBuf>,

    /// key=value list setting how reference images are processed (empty = auto-detect)
    #[arg(long = "ref-image-args", value_name = "K=V,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub ref_image_args: Vec<String>,

    /// automatically increase the indices of reference images in listed order (starting with 1)
    #[arg(long = "increase-ref-index")]
    pub increase_ref_index: bool,

    /// disable auto resize of ref images
    #[arg(long = "disable-auto-resize-ref-image")]
    pub disable_auto_resize_ref_image: bool,

    /// path to control image, control net
    #[arg(
        long = "control-image",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub control_image: Option<PathBuf>,

    /// strength to apply Control Net
    #[arg(
        long = "control-strength",
        value_name = "FLOAT",
        default_value_t = 0.9,
        allow_negative_numbers = true
    )]
    pub control_strength: f32,

    /// apply canny preprocessor (edge detection) to the control image
    #[arg(long = "canny")]
    pub canny: bool,

    /// path to the IP-Adapter reference image
    #[arg(
        long = "ip-adapter-image",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub ip_adapter_image: Option<PathBuf>,

    /// strength to apply IP-Adapter
    #[arg(
        long = "ip-adapter-strength",
        value_name = "FLOAT",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub ip_adapter_strength: f32,

    /// enable circular padding on both axes for tileable output
    #[arg(long = "circular")]
    pub circular: bool,

    /// enable circular padding on x-axis (width) only
    #[arg(long = "circularx")]
    pub circularx: bool,

    /// enable circular padding on y-axis (height) only
    #[arg(long = "circulary")]
    pub circulary: bool,

    /// number of Qwen Image Layered layers; latent/output count is layers + 1
    #[arg(
        long = "qwen-image-layers",
        value_name = "INT",
        default_value_t = 3,
        allow_negative_numbers = true
    )]
    pub qwen_image_layers: i32,

    /// video frames
    #[arg(long = "video-frames", value_name = "INT", default_value_t = 1, allow_negative_numbers = true, help_heading = VIDEO)]
    pub video_frames: i32,

    /// frames per second (upstream's help says 24; its code default is 16, kept here)
    #[arg(long = "fps", value_name = "INT", default_value_t = 16, allow_negative_numbers = true, help_heading = VIDEO)]
    pub fps: i32,

    /// path to control video frames directory (frames sorted by file name)
    #[arg(long = "control-video", value_name = "DIR", allow_hyphen_values = true, help_heading = VIDEO)]
    pub control_video: Option<PathBuf>,

    /// reference video frame directory at 24 fps (MiniMax-H3 Ref2VA); repeatable
    #[arg(long = "ref-video", value_name = "DIR", action = ArgAction::Append, allow_hyphen_values = true, help_heading = VIDEO)]
    pub ref_video: Vec<PathBuf>,

    /// WAV soundtrack paired by index with --ref-video; repeatable
    #[arg(long = "ref-video-audio", value_name = "PATH", action = ArgAction::Append, allow_hyphen_values = true, help_heading = VIDEO)]
    pub ref_video_audio: Vec<PathBuf>,

    /// standalone WAV reference for MiniMax-H3 Ref2VA; repeatable
    #[arg(long = "ref-audio", value_name = "PATH", action = ArgAction::Append, allow_hyphen_values = true, help_heading = VIDEO)]
    pub ref_audio: Vec<PathBuf>,

    /// timestep boundary for Wan2.2 MoE model (only with --high-noise-steps -1)
    #[arg(long = "moe-boundary", value_name = "FLOAT", default_value_t = 0.875, allow_negative_numbers = true, help_heading = VIDEO)]
    pub moe_boundary: f32,

    /// wan vace strength
    #[arg(long = "vace-strength", value_name = "FLOAT", default_value_t = 1.0, allow_negative_numbers = true, help_heading = VIDEO)]
    pub vace_strength: f32,

    /// enable highres fix
    #[arg(long = "hires", help_heading = HIRES)]
    pub hires: bool,

    /// highres fix upscaler: Lanczos, Nearest, Latent, Latent (nearest), Latent (nearest-exact),
    /// Latent (antialiased), Latent (bicubic), Latent (bicubic antialiased), or a model name
    /// under --hires-upscalers-dir
    #[arg(long = "hires-upscaler", value_name = "NAME", default_value = "Latent", allow_hyphen_values = true, help_heading = HIRES)]
    pub hires_upscaler: String,

    /// highres fix scale when target size is not set
    #[arg(long = "hires-scale", value_name = "FLOAT", default_value_t = 2.0, allow_negative_numbers = true, help_heading = HIRES)]
    pub hires_scale: f32,

    /// highres fix target width, 0 to use --hires-scale
    #[arg(long = "hires-width", value_name = "INT", default_value_t = 0, allow_negative_numbers = true, help_heading = HIRES)]
    pub hires_width: i32,

    /// highres fix target height, 0 to use --hires-scale
    #[arg(long = "hires-height", value_name = "INT", default_value_t = 0, allow_negative_numbers = true, help_heading = HIRES)]
    pub hires_height: i32,

    /// highres fix second pass sample steps, 0 to reuse --steps
    #[arg(long = "hires-steps", value_name = "INT", default_value_t = 0, allow_negative_numbers = true, help_heading = HIRES)]
    pub hires_steps: i32,

    /// highres fix second pass denoising strength
    #[arg(long = "hires-denoising-strength", value_name = "FLOAT", default_value_t = 0.7, allow_negative_numbers = true, help_heading = HIRES)]
    pub hires_denoising_strength: f32,

    /// highres fix upscaler tile size (model-backed upscalers)
    #[arg(long = "hires-upscale-tile-size", value_name = "INT", default_value_t = 128, allow_negative_numbers = true, help_heading = HIRES)]
    pub hires_upscale_tile_size: i32,

    /// custom sigma values for the highres fix second pass, comma-separated
    #[arg(long = "hires-sigmas", value_name = "LIST", value_parser = super::parse_sigma_list,
          allow_hyphen_values = true, help_heading = HIRES)]
    pub hires_sigmas: Option<super::SigmaList>,

    /// run the ESRGAN upscaler this many times
    #[arg(long = "upscale-repeats", value_name = "INT", default_value_t = 1, allow_negative_numbers = true, help_heading = EXTRAS)]
    pub upscale_repeats: i32,

    /// tile size for ESRGAN upscaling
    #[arg(long = "upscale-tile-size", value_name = "INT", default_value_t = 128, allow_negative_numbers = true, help_heading = EXTRAS)]
    pub upscale_tile_size: i32,

    /// path to a converted YOLOv8 detection model for ADetailer
    #[arg(long = "ad-model", value_name = "PATH", allow_hyphen_values = true, help_heading = EXTRAS)]
    pub ad_model: Option<PathBuf>,

    /// ADetailer prompt; empty inherits the main prompt
    #[arg(long = "ad-prompt", value_name = "TEXT", default_value = "", hide_default_value = true,
          allow_hyphen_values = true, help_heading = EXTRAS)]
    pub ad_prompt: String,

    /// ADetailer negative prompt; empty inherits the main negative prompt
    #[arg(long = "ad-negative-prompt", value_name = "TEXT", default_value = "", hide_default_value = true,
          allow_hyphen_values = true, help_heading = EXTRAS)]
    pub ad_negative_prompt: String,

    /// extra ADetailer args, key=value list; repeats are joined with ','
    #[arg(long = "extra-ad-args", value_name = "K=V,...", action = ArgAction::Append, allow_hyphen_values = true, help_heading = EXTRAS)]
    pub extra_ad_args: Vec<String>,

    /// path to PHOTOMAKER input id images dir
    #[arg(long = "pm-id-images-dir", value_name = "DIR", allow_hyphen_values = true, help_heading = EXTRAS)]
    pub pm_id_images_dir: Option<PathBuf>,

    /// path to PHOTOMAKER v2 id embed
    #[arg(long = "pm-id-embed-path", value_name = "PATH", allow_hyphen_values = true, help_heading = EXTRAS)]
    pub pm_id_embed_path: Option<PathBuf>,

    /// PhotoMaker style strength
    #[arg(long = "pm-style-strength", value_name = "FLOAT", default_value_t = 20.0, allow_negative_numbers = true, help_heading = EXTRAS)]
    pub pm_style_strength: f32,

    /// path to PuLID id embedding
    #[arg(long = "pulid-id-embedding", value_name = "PATH", allow_hyphen_values = true, help_heading = EXTRAS)]
    pub pulid_id_embedding: Option<PathBuf>,

    /// strength of PuLID identity injection
    #[arg(long = "pulid-id-weight", value_name = "FLOAT", default_value_t = 1.0, allow_negative_numbers = true, help_heading = EXTRAS)]
    pub pulid_id_weight: f32,
}
