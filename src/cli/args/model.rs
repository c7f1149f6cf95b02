//! "Model files" group: weights, encoders, adapters and how weights are typed on load.

use std::path::PathBuf;

use clap::ArgAction;

/// Paths of model files and directories, and weight-type options.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Model files")]
pub struct ModelFileArgs {
    /// path to full model
    #[arg(
        short = 'm',
        long = "model",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub model: Option<PathBuf>,

    /// path to the standalone diffusion model
    #[arg(
        long = "diffusion-model",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub diffusion_model: Option<PathBuf>,

    /// path to the standalone high noise diffusion model
    #[arg(
        long = "high-noise-diffusion-model",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub high_noise_diffusion_model: Option<PathBuf>,

    /// path to the standalone unconditional diffusion model (Ideogram4 CFG)
    #[arg(
        long = "uncond-diffusion-model",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub uncond_diffusion_model: Option<PathBuf>,

    /// path to the clip-l text encoder
    #[arg(long = "clip_l", value_name = "PATH", allow_hyphen_values = true)]
    pub clip_l: Option<PathBuf>,

    /// path to the clip-g text encoder
    #[arg(long = "clip_g", value_name = "PATH", allow_hyphen_values = true)]
    pub clip_g: Option<PathBuf>,

    /// path to the clip-vision encoder
    #[arg(long = "clip_vision", value_name = "PATH", allow_hyphen_values = true)]
    pub clip_vision: Option<PathBuf>,

    /// path to the t5xxl text encoder
    #[arg(long = "t5xxl", value_name = "PATH", allow_hyphen_values = true)]
    pub t5xxl: Option<PathBuf>,

    /// path to a T5 tokenizer file (tokenizer.json / spiece.model) when the weights carry none
    #[arg(
        long = "t5xxl-tokenizer",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub t5xxl_tokenizer: Option<PathBuf>,

    /// path to the llm text encoder (e.g. qwenvl2.5 for qwen-image, Qwen3-VL for Qwen Image 2.1)
    #[arg(
        long = "llm",
        visible_alias = "qwen2vl",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub llm: Option<PathBuf>,

    /// path to the llm vision tower (mmproj)
    #[arg(
        long = "llm_vision",
        visible_alias = "qwen2vl_vision",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub llm_vision: Option<PathBuf>,

    /// path to LTXAV embeddings connectors
    #[arg(
        long = "embeddings-connectors",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub embeddings_connectors: Option<PathBuf>,

    /// path to standalone vae model
    #[arg(long = "vae", value_name = "PATH", allow_hyphen_values = true)]
    pub vae: Option<PathBuf>,

    /// path to standalone LTX audio vae model
    #[arg(long = "audio-vae", value_name = "PATH", allow_hyphen_values = true)]
    pub audio_vae: Option<PathBuf>,

    /// path to taesd. Using Tiny AutoEncoder for fast decoding (low quality)
    #[arg(
        long = "taesd",
        visible_alias = "tae",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub taesd: Option<PathBuf>,

    /// path to control net model
    #[arg(long = "control-net", value_name = "PATH", allow_hyphen_values = true)]
    pub control_net: Option<PathBuf>,

    /// path to IP-Adapter model (requires --clip_vision)
    #[arg(long = "ip-adapter", value_name = "PATH", allow_hyphen_values = true)]
    pub ip_adapter: Option<PathBuf>,

    /// path to AnimateDiff motion module (SD 1.5)
    #[arg(
        long = "motion-module",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub motion_module: Option<PathBuf>,

    /// path to PHOTOMAKER model
    #[arg(long = "photo-maker", value_name = "PATH", allow_hyphen_values = true)]
    pub photo_maker: Option<PathBuf>,

    /// path to PuLID Flux weights
    #[arg(
        long = "pulid-weights",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub pulid_weights: Option<PathBuf>,

    /// path to esrgan model
    #[arg(
        long = "upscale-model",
        value_name = "PATH",
        allow_hyphen_values = true
    )]
    pub upscale_model: Option<PathBuf>,

    /// embeddings directory
    #[arg(long = "embd-dir", value_name = "DIR", allow_hyphen_values = true)]
    pub embd_dir: Option<PathBuf>,

    /// lora model directory
    #[arg(
        long = "lora-model-dir",
        value_name = "DIR",
        default_value = ".",
        allow_hyphen_values = true
    )]
    pub lora_model_dir: PathBuf,

    /// highres fix upscaler model directory
    #[arg(
        long = "hires-upscalers-dir",
        value_name = "DIR",
        allow_hyphen_values = true
    )]
    pub hires_upscalers_dir: Option<PathBuf>,

    /// weight type (e.g. f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K); default: the type in the file
    #[arg(long = "type", value_name = "TYPE", allow_hyphen_values = true)]
    pub weight_type: Option<String>,

    /// weight type per tensor pattern (example: "^vae\.=f16,model\.=q8_0"); repeats are joined with ','
    #[arg(long = "tensor-type-rules", value_name = "RULES", action = ArgAction::Append, allow_hyphen_values = true)]
    pub tensor_type_rules: Vec<String>,

    /// extra model args, key=value list (e.g. qwen_image_2_1_prefix_cache=false,
    /// qwen_image_2_1_prefix_cache_type=q8_0, pixart_pos_embed_base_size=32,
    /// pixart_interpolation_scale=1, pixart_vae_scale_factor=0.18215, chroma_use_dit_mask,
    /// chroma_use_t5_mask, chroma_t5_mask_pad, qwen_image_zero_cond_t); repeats are joined
    #[arg(long = "model-args", value_name = "K=V,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub model_args: Vec<String>,

    /// prediction type override
    #[arg(long = "prediction", value_name = "TYPE",
          value_parser = ["eps", "v", "edm_v", "sd3_flow", "flux_flow", "sefi_flow", "minit2i_flow"])]
    pub prediction: Option<String>,

    /// the way to apply LoRA: auto (at_runtime for quantized weights, else immediately), immediately, at_runtime
    #[arg(long = "lora-apply-mode", value_name = "MODE", default_value = "auto",
          value_parser = ["auto", "immediately", "at_runtime"])]
    pub lora_apply_mode: String,
}
