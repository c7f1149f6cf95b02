//! "Sampling" group: steps, guidance, sampler/scheduler names, RNG, step caching, and the
//! Wan2.2 high-noise expert's copies of the sampling flags.

use clap::ArgAction;

const HIGH_NOISE: &str = "Sampling (high noise expert, Wan2.2)";
const CACHE: &str = "Step caching";

/// Sampler, schedule and guidance settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Sampling")]
pub struct SamplingArgs {
    /// number of sample steps
    #[arg(
        long = "steps",
        value_name = "INT",
        default_value_t = 20,
        allow_negative_numbers = true
    )]
    pub steps: i32,

    /// unconditional guidance scale
    #[arg(
        long = "cfg-scale",
        value_name = "FLOAT",
        default_value_t = 7.0,
        allow_negative_numbers = true
    )]
    pub cfg_scale: f32,

    /// image guidance scale for inpaint or image edit models [default: same as --cfg-scale]
    #[arg(
        long = "img-cfg-scale",
        value_name = "FLOAT",
        allow_negative_numbers = true
    )]
    pub img_cfg_scale: Option<f32>,

    /// distilled guidance scale for models with guidance input
    #[arg(
        long = "guidance",
        value_name = "FLOAT",
        default_value_t = 3.5,
        allow_negative_numbers = true
    )]
    pub guidance: f32,

    /// skip layer guidance (SLG) scale, only for DiT models; 0 disables (2.5 is nice for sd3.5 medium)
    #[arg(
        long = "slg-scale",
        value_name = "FLOAT",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub slg_scale: f32,

    /// layers to skip for SLG steps
    #[arg(long = "skip-layers", value_name = "LIST", default_value = "[7,8,9]",
          value_parser = super::parse_layer_list, allow_hyphen_values = true)]
    pub skip_layers: super::LayerList,

    /// SLG enabling point
    #[arg(
        long = "skip-layer-start",
        value_name = "FLOAT",
        default_value_t = 0.01,
        allow_negative_numbers = true
    )]
    pub skip_layer_start: f32,

    /// SLG disabling point
    #[arg(
        long = "skip-layer-end",
        value_name = "FLOAT",
        default_value_t = 0.2,
        allow_negative_numbers = true
    )]
    pub skip_layer_end: f32,

    /// noise multiplier [default: 0 for ddim_trailing, tcd, res_multistep, res_2s; 1 for euler_a,
    /// er_sde, dpm++2s_a, dpm++2m_sde, dpm++2m_sde_bt]
    #[arg(long = "eta", value_name = "FLOAT", allow_negative_numbers = true)]
    pub eta: Option<f32>,

    /// sampling method: euler, euler_a, heun, dpm2, dpm++2s_a, dpm++2m, dpm++2mv2, ipndm, ipndm_v,
    /// lcm, ddim_trailing, tcd, res_multistep, res_2s, er_sde, euler_cfg_pp, euler_a_cfg_pp,
    /// euler_ge, dpm++2m_sde, dpm++2m_sde_bt, lms [default: euler for Flux/SD3/Wan, euler_a otherwise]
    #[arg(
        long = "sampling-method",
        value_name = "NAME",
        allow_hyphen_values = true
    )]
    pub sampling_method: Option<String>,

    /// denoiser sigma scheduler: discrete, karras, exponential, ays, gits, sgm_uniform, simple,
    /// smoothstep, kl_optimal, lcm, bong_tangent, ltx2, logit_normal, flux2, flux, beta
    /// (alias: normal=discrete) [default: model-specific]
    #[arg(long = "scheduler", value_name = "NAME", allow_hyphen_values = true)]
    pub scheduler: Option<String>,

    /// custom sigma values for the sampler, comma-separated (e.g. "14.61,7.8,3.5,0.0")
    #[arg(long = "sigmas", value_name = "LIST", value_parser = super::parse_sigma_list, allow_hyphen_values = true)]
    pub sigmas: Option<super::SigmaList>,

    /// shift value for flow models like SD3.x or Wan [default: auto]
    #[arg(
        long = "flow-shift",
        value_name = "FLOAT",
        allow_negative_numbers = true
    )]
    pub flow_shift: Option<f32>,

    /// shift timestep for NitroFusion models (0 = off; ~250 for NitroSD-Realism, ~500 for NitroSD-Vibrant)
    #[arg(
        long = "timestep-shift",
        value_name = "INT",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub timestep_shift: i32,

    /// RNG: std_default, cuda (sd-webui), cpu (comfyui, matches torch's CPU generator)
    #[arg(
        long = "rng",
        value_name = "NAME",
        default_value = "cuda",
        allow_hyphen_values = true
    )]
    pub rng: String,

    /// sampler RNG: std_default, cuda, cpu [default: same as --rng]
    #[arg(long = "sampler-rng", value_name = "NAME", allow_hyphen_values = true)]
    pub sampler_rng: Option<String>,

    /// extra sampler/scheduler/guidance args, key=value list (e.g. flux: base_shift, max_shift;
    /// beta scheduler: alpha, beta; lms: lms_max_order); repeats are joined with ','
    #[arg(long = "extra-sample-args", value_name = "K=V,...", action = ArgAction::Append, allow_hyphen_values = true)]
    pub extra_sample_args: Vec<String>,

    /// caching method: easycache (DiT), ucache (UNET), dbcache, taylorseer, cache-dit (DiT
    /// block-level), spectrum (UNET/DiT forecasting)
    #[arg(long = "cache-mode", value_name = "MODE", help_heading = CACHE,
          value_parser = ["easycache", "ucache", "dbcache", "taylorseer", "cache-dit", "spectrum"])]
    pub cache_mode: Option<String>,

    /// named cache params, key=value comma-separated (e.g. "threshold=0.25" or "threshold=1.5,reset=0")
    #[arg(long = "cache-option", value_name = "K=V,...", allow_hyphen_values = true, help_heading = CACHE)]
    pub cache_option: Option<String>,

    /// SCM steps mask for cache-dit: comma-separated 0/1, 1=compute, 0=can cache
    #[arg(long = "scm-mask", value_name = "MASK", allow_hyphen_values = true, help_heading = CACHE)]
    pub scm_mask: Option<String>,

    /// SCM policy
    #[arg(long = "scm-policy", value_name = "POLICY", default_value = "dynamic",
          value_parser = ["dynamic", "static"], help_heading = CACHE)]
    pub scm_policy: String,
}

/// The high-noise expert's sampling settings (Wan2.2 MoE).
#[derive(Debug, Clone, clap::Args)]
pub struct HighNoiseArgs {
    /// (high noise) number of sample steps (-1 = auto)
    #[arg(long = "high-noise-steps", value_name = "INT", default_value_t = -1, allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_steps: i32,

    /// (high noise) unconditional guidance scale
    #[arg(long = "high-noise-cfg-scale", value_name = "FLOAT", default_value_t = 7.0, allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_cfg_scale: f32,

    /// (high noise) image guidance scale [default: same as --high-noise-cfg-scale]
    #[arg(long = "high-noise-img-cfg-scale", value_name = "FLOAT", allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_img_cfg_scale: Option<f32>,

    /// (high noise) distilled guidance scale
    #[arg(long = "high-noise-guidance", value_name = "FLOAT", default_value_t = 3.5, allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_guidance: f32,

    /// (high noise) skip layer guidance (SLG) scale
    #[arg(long = "high-noise-slg-scale", value_name = "FLOAT", default_value_t = 0.0, allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_slg_scale: f32,

    /// (high noise) layers to skip for SLG steps
    #[arg(long = "high-noise-skip-layers", value_name = "LIST", default_value = "[7,8,9]",
          value_parser = super::parse_layer_list, allow_hyphen_values = true, help_heading = HIGH_NOISE)]
    pub high_noise_skip_layers: super::LayerList,

    /// (high noise) SLG enabling point
    #[arg(long = "high-noise-skip-layer-start", value_name = "FLOAT", default_value_t = 0.01, allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_skip_layer_start: f32,

    /// (high noise) SLG disabling point
    #[arg(long = "high-noise-skip-layer-end", value_name = "FLOAT", default_value_t = 0.2, allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_skip_layer_end: f32,

    /// (high noise) noise multiplier [default: sampler-specific]
    #[arg(long = "high-noise-eta", value_name = "FLOAT", allow_negative_numbers = true, help_heading = HIGH_NOISE)]
    pub high_noise_eta: Option<f32>,

    /// (high noise) sampling method [default: euler for Flux/SD3/Wan, euler_a otherwise]
    #[arg(long = "high-noise-sampling-method", value_name = "NAME", allow_hyphen_values = true, help_heading = HIGH_NOISE)]
    pub high_noise_sampling_method: Option<String>,
}
