//! Generation metadata embedded in output PNGs.
//!
//! `parameters` follows the A1111 "infotext" layout that upstream sd-cli writes
//! (`get_image_params` in examples/common/common.cpp): prompt line, optional
//! `Negative prompt:` line, then `Key: value, ...`; floats are printed like C++
//! `std::to_string` (six decimals) so tools that parse upstream's files parse ours.
//! The full record is also stored as JSON under [`JSON_KEYWORD`].

use serde::{Deserialize, Serialize};

/// Keyword of the A1111-style text chunk.
pub const PARAMETERS_KEYWORD: &str = "parameters";
/// Keyword of the JSON chunk (serialized [`GenerationParams`]).
pub const JSON_KEYWORD: &str = "sd-cli-json";

/// What produced an image. Model paths are stored as file names only (no directories).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GenerationParams {
    /// Schema tag, `sd-cli.image.params/v1`.
    pub schema: String,
    /// `img_gen`, ...
    pub mode: String,
    pub prompt: String,
    pub negative_prompt: String,
    pub steps: u32,
    pub cfg_scale: f32,
    pub img_cfg_scale: Option<f32>,
    pub guidance: f32,
    /// Resolved eta of the sampler.
    pub eta: Option<f32>,
    pub slg_scale: f32,
    pub skip_layers: Vec<i32>,
    pub skip_layer_start: f32,
    pub skip_layer_end: f32,
    /// Seed of this image (base seed + batch index, as upstream).
    pub seed: i64,
    pub batch_index: u32,
    pub width: u32,
    pub height: u32,
    /// Resolved sampler name (e.g. `euler`).
    pub sampler: String,
    /// Resolved scheduler name; not printed when custom sigmas are used.
    pub scheduler: Option<String>,
    pub custom_sigmas: Vec<f32>,
    pub flow_shift: Option<f32>,
    pub rng: String,
    pub sampler_rng: Option<String>,
    pub strength: Option<f32>,
    pub clip_skip: Option<u32>,
    /// `-m` file name.
    pub model: Option<String>,
    /// `--diffusion-model` file name.
    pub diffusion_model: Option<String>,
    /// Text encoder file names in flag order (clip_l, clip_g, t5xxl, llm, llm_vision).
    pub text_encoders: Vec<String>,
    pub vae: Option<String>,
    pub extra_sample_args: String,
    pub model_args: String,
    /// The LoRAs applied (A1111's `Lora hashes`).
    #[serde(default)]
    pub loras: Vec<LoraUse>,
    /// The hires fix, when it ran.
    #[serde(default)]
    pub hires: Option<HiresUse>,
    /// Video runs: the frame count and rate written.
    #[serde(default)]
    pub video: Option<VideoUse>,
    /// Settings only some models read (`VACE strength`, the MoE expert's), as printed.
    #[serde(default)]
    pub model_settings: Vec<(String, String)>,
    /// Free-form extras (tiling, prefix cache type, ...).
    #[serde(default)]
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// Program name and version.
    pub generator: String,
}

/// The hires fix of a run, as upstream's metadata names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct HiresUse {
    /// `--hires-upscaler`.
    pub upscaler: String,
    pub scale: f32,
    /// `--hires-width` × `--hires-height` as given (0 = from the scale).
    pub width: u32,
    pub height: u32,
    pub steps: u32,
    pub strength: f32,
    pub sigmas: Vec<f32>,
}

/// The frames of a video run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct VideoUse {
    pub frames: u32,
    pub fps: u32,
}

/// One LoRA of a run: its prompt name, summed weight and A1111 short hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LoraUse {
    pub name: String,
    pub weight: f32,
    pub hash: String,
}

/// C++ `std::to_string(float)`: fixed six decimals; inf/nan as glibc prints them.
pub fn cpp_float(v: f32) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else {
        format!("{v:.6}")
    }
}

impl GenerationParams {
    /// A record with upstream's defaults and this program as generator.
    pub fn new() -> GenerationParams {
        GenerationParams {
            schema: "sd-cli.image.params/v1".into(),
            mode: "img_gen".into(),
            steps: 20,
            cfg_scale: 7.0,
            guidance: 3.5,
            skip_layers: vec![7, 8, 9],
            skip_layer_start: 0.01,
            skip_layer_end: 0.2,
            width: 512,
            height: 512,
            rng: "cuda".into(),
            generator: format!("sd-cli {}", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        }
    }

    /// The A1111-style `parameters` text.
    pub fn to_a1111(&self) -> String {
        let mut s = String::new();
        s.push_str(&self.prompt);
        s.push('\n');
        if !self.negative_prompt.is_empty() {
            s.push_str("Negative prompt: ");
            s.push_str(&self.negative_prompt);
            s.push('\n');
        }
        let mut kv: Vec<String> = Vec::new();
        kv.push(format!("Steps: {}", self.steps));
        kv.push(format!("CFG scale: {}", cpp_float(self.cfg_scale)));
        if self.slg_scale != 0.0 && !self.skip_layers.is_empty() {
            kv.push(format!("SLG scale: {}", cpp_float(self.slg_scale)));
            let layers: Vec<String> = self.skip_layers.iter().map(|l| l.to_string()).collect();
            kv.push(format!("Skip layers: [{}]", layers.join(", ")));
            kv.push(format!(
                "Skip layer start: {}",
                cpp_float(self.skip_layer_start)
            ));
            kv.push(format!(
                "Skip layer end: {}",
                cpp_float(self.skip_layer_end)
            ));
        }
        kv.push(format!("Guidance: {}", cpp_float(self.guidance)));
        kv.push(format!(
            "Eta: {}",
            cpp_float(self.eta.unwrap_or(f32::INFINITY))
        ));
        if !self.extra_sample_args.is_empty() {
            kv.push(format!("Extra sample args: {}", self.extra_sample_args));
        }
        kv.push(format!("Seed: {}", self.seed));
        kv.push(format!("Size: {}x{}", self.width, self.height));
        if let Some(v) = &self.video {
            kv.push(format!("Frames: {}", v.frames));
            kv.push(format!("FPS: {}", v.fps));
        }
        // Upstream prints the -m name (possibly empty); without -m the diffusion model is
        // the most useful thing to show here.
        let model = self
            .model
            .as_deref()
            .or(self.diffusion_model.as_deref())
            .unwrap_or("");
        kv.push(format!("Model: {model}"));
        kv.push(format!("RNG: {}", self.rng));
        if let Some(r) = &self.sampler_rng {
            kv.push(format!("Sampler RNG: {r}"));
        }
        let mut sampler = format!("Sampler: {}", self.sampler);
        if !self.custom_sigmas.is_empty() {
            let sig: Vec<String> = self
                .custom_sigmas
                .iter()
                .map(|v| format!("{v:.4}"))
                .collect();
            sampler.push_str(&format!(", Custom Sigmas: [{}]", sig.join(", ")));
        } else if let Some(sch) = &self.scheduler {
            sampler.push(' ');
            sampler.push_str(sch);
        }
        kv.push(sampler);
        for te in &self.text_encoders {
            kv.push(format!("TE: {te}"));
        }
        if let Some(d) = &self.diffusion_model {
            kv.push(format!("Unet: {d}"));
        }
        if let Some(v) = &self.vae {
            kv.push(format!("VAE: {v}"));
        }
        if let Some(c) = self.clip_skip {
            kv.push(format!("Clip skip: {c}"));
        }
        if let Some(h) = &self.hires {
            kv.push(format!("Hires upscale: {}", h.upscaler));
            kv.push(format!("Hires scale: {}", cpp_float(h.scale)));
            kv.push(format!("Hires resize: {}x{}", h.width, h.height));
            kv.push(format!("Hires steps: {}", h.steps));
            kv.push(format!("Denoising strength: {}", cpp_float(h.strength)));
            if !h.sigmas.is_empty() {
                let sig: Vec<String> = h.sigmas.iter().map(|v| v.to_string()).collect();
                kv.push(format!("Hires custom sigmas: [{}]", sig.join(", ")));
            }
        }
        if let Some(st) = self.strength {
            kv.push(format!("Denoising strength: {}", cpp_float(st)));
        }
        if !self.loras.is_empty() {
            let hashes: Vec<String> = self
                .loras
                .iter()
                .map(|l| format!("{}: {}", l.name, l.hash))
                .collect();
            kv.push(format!("Lora hashes: \"{}\"", hashes.join(", ")));
        }
        for (key, value) in &self.model_settings {
            kv.push(format!("{key}: {value}"));
        }
        kv.push(format!("Version: {}", self.generator));
        s.push_str(&kv.join(", "));
        s
    }

    /// The JSON text stored under [`JSON_KEYWORD`].
    pub fn to_json(&self) -> String {
        // Serialization of plain data with string keys cannot fail; keep a fallback anyway.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Parses the JSON written by [`GenerationParams::to_json`].
    pub fn from_json(s: &str) -> Result<GenerationParams, serde_json::Error> {
        serde_json::from_str(s)
    }
}

/// File name of a path, for metadata (directories are private).
pub fn base_name(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.to_string_lossy().into_owned())
}
