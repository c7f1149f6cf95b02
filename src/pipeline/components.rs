//! Model components and the files each reads.
//!
//! A family lists its components ([`ComponentSpec`]): what each is, which flags may name its
//! file, when it is needed. Each component is opened into a store of its own
//! ([`ComponentFiles`]), from the first of its flags that was given, else from the `-m`
//! checkpoint (the tensors under the component's prefix there). So a component's weights,
//! its `config.json` and its GGUF metadata come from its own files only.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::runner::Role;
use crate::weights::{Component, TensorStore};

/// The model-file flags of sd-cli that name a component's weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelFlag {
    /// `-m/--model`: a checkpoint holding several components under their prefixes.
    Model,
    DiffusionModel,
    /// `--high-noise-diffusion-model`: Wan 2.2 A14B's high-noise expert.
    HighNoiseDiffusionModel,
    ClipL,
    ClipG,
    ClipVision,
    T5xxl,
    Llm,
    LlmVision,
    Vae,
    /// `--taesd`: the tiny autoencoder that replaces the VAE.
    Taesd,
    /// `--audio-vae`: MiniMax-H3's audio autoencoder.
    AudioVae,
}

impl ModelFlag {
    /// The flag as users type it.
    pub fn flag(self) -> &'static str {
        match self {
            ModelFlag::Model => "-m/--model",
            ModelFlag::DiffusionModel => "--diffusion-model",
            ModelFlag::HighNoiseDiffusionModel => "--high-noise-diffusion-model",
            ModelFlag::ClipL => "--clip_l",
            ModelFlag::ClipG => "--clip_g",
            ModelFlag::ClipVision => "--clip_vision",
            ModelFlag::T5xxl => "--t5xxl",
            ModelFlag::Llm => "--llm",
            ModelFlag::LlmVision => "--llm_vision",
            ModelFlag::Vae => "--vae",
            ModelFlag::Taesd => "--taesd",
            ModelFlag::AudioVae => "--audio-vae",
        }
    }
}

/// Paths of the model files given on the command line (existence checked by the CLI).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelFiles {
    pub model: Option<PathBuf>,
    pub diffusion_model: Option<PathBuf>,
    pub high_noise_diffusion_model: Option<PathBuf>,
    pub uncond_diffusion_model: Option<PathBuf>,
    pub clip_l: Option<PathBuf>,
    pub clip_g: Option<PathBuf>,
    pub clip_vision: Option<PathBuf>,
    pub t5xxl: Option<PathBuf>,
    pub t5xxl_tokenizer: Option<PathBuf>,
    pub llm: Option<PathBuf>,
    pub llm_vision: Option<PathBuf>,
    pub vae: Option<PathBuf>,
    pub taesd: Option<PathBuf>,
    pub audio_vae: Option<PathBuf>,
    pub control_net: Option<PathBuf>,
    pub upscale_model: Option<PathBuf>,
    pub embd_dir: Option<PathBuf>,
    pub lora_model_dir: PathBuf,
}

impl ModelFiles {
    /// The path given with `flag`, if any.
    pub fn get(&self, flag: ModelFlag) -> Option<&Path> {
        match flag {
            ModelFlag::Model => self.model.as_deref(),
            ModelFlag::DiffusionModel => self.diffusion_model.as_deref(),
            ModelFlag::HighNoiseDiffusionModel => self.high_noise_diffusion_model.as_deref(),
            ModelFlag::ClipL => self.clip_l.as_deref(),
            ModelFlag::ClipG => self.clip_g.as_deref(),
            ModelFlag::ClipVision => self.clip_vision.as_deref(),
            ModelFlag::T5xxl => self.t5xxl.as_deref(),
            ModelFlag::Llm => self.llm.as_deref(),
            ModelFlag::LlmVision => self.llm_vision.as_deref(),
            ModelFlag::Vae => self.vae.as_deref(),
            ModelFlag::Taesd => self.taesd.as_deref(),
            ModelFlag::AudioVae => self.audio_vae.as_deref(),
        }
    }
}

/// A component a family can load (its store is keyed by this).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ComponentId {
    Diffusion,
    /// Wan 2.2 A14B's high-noise expert.
    HighNoiseDiffusion,
    T5,
    Llm,
    /// The LLM's vision tower (a separate file, or vision weights inside the LLM's).
    LlmVision,
    /// The first CLIP text encoder: CLIP ViT-L (SD1, SDXL) or OpenCLIP ViT-H (SD2).
    ClipL,
    /// SDXL's OpenCLIP ViT-bigG.
    ClipG,
    /// A CLIP vision tower (`--clip_vision`: Wan 2.1 I2V / FLF2V's image tokens).
    ClipVision,
    Vae,
    /// The tiny autoencoder (`--taesd`), decoding instead of the VAE.
    Taesd,
    /// MiniMax-H3's audio autoencoder (`--audio-vae`).
    AudioVae,
}

impl ComponentId {
    /// The canonical name prefix of its tensors in its store (and in a `-m` checkpoint).
    pub fn prefix(self) -> &'static str {
        match self {
            ComponentId::Diffusion => Component::Diffusion.prefix(),
            // Upstream's prefix for `--high-noise-diffusion-model` files.
            ComponentId::HighNoiseDiffusion => "model.high_noise_diffusion_model.",
            ComponentId::T5 => Component::T5.prefix(),
            ComponentId::Llm | ComponentId::LlmVision => Component::Llm.prefix(),
            ComponentId::ClipL => Component::TextEncoder.prefix(),
            ComponentId::ClipG => Component::TextEncoder2.prefix(),
            // Each VAE has a store of its own: the audio one shares the VAE's canonical prefix.
            ComponentId::Vae | ComponentId::AudioVae => Component::Vae.prefix(),
            ComponentId::ClipVision => "clip_vision.",
            // Upstream's prefix for `--taesd` files.
            ComponentId::Taesd => "tae.",
        }
    }

    /// The `--backend` role it runs under.
    pub fn role(self) -> Role {
        match self {
            ComponentId::Diffusion | ComponentId::HighNoiseDiffusion => Role::Diffusion,
            ComponentId::T5
            | ComponentId::Llm
            | ComponentId::LlmVision
            | ComponentId::ClipL
            | ComponentId::ClipG
            | ComponentId::ClipVision => Role::TextEncoder,
            ComponentId::Vae | ComponentId::Taesd | ComponentId::AudioVae => Role::Vae,
        }
    }
}

/// When a family needs a component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Required {
    Always,
    /// Only when the run has reference images (`-r`).
    WithReferences,
    /// Only when the run has condition images (`--init-img`, `--end-img`, `-r`).
    WithImages,
    /// Loaded when a file provides it (the SDXL refiner has no CLIP-L).
    Optional,
}

/// Which PNG metadata field a component's file name goes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaSlot {
    TextEncoder,
}

/// One component of a family.
#[derive(Clone, Copy, Debug)]
pub struct ComponentSpec {
    pub id: ComponentId,
    /// For messages: "a T5 text encoder".
    pub what: &'static str,
    /// Flags that may name its file, in order of preference; the first is the one to ask for.
    pub flags: &'static [ModelFlag],
    pub required: Required,
    pub metadata: Option<MetaSlot>,
}

impl ComponentSpec {
    /// The diffusion model (`--diffusion-model`, or its part of `-m`), always needed.
    pub const fn diffusion(what: &'static str) -> Self {
        Self {
            id: ComponentId::Diffusion,
            what,
            flags: &[ModelFlag::DiffusionModel],
            required: Required::Always,
            metadata: None,
        }
    }

    /// The VAE (`--vae`, or its part of `-m`), always needed.
    pub const fn vae() -> Self {
        Self {
            id: ComponentId::Vae,
            what: "a VAE",
            flags: &[ModelFlag::Vae],
            required: Required::Always,
            metadata: None,
        }
    }

    /// A text encoder from `flag`, always needed, named in the image metadata.
    pub const fn text_encoder(
        id: ComponentId,
        what: &'static str,
        flags: &'static [ModelFlag],
    ) -> Self {
        Self {
            id,
            what,
            flags,
            required: Required::Always,
            metadata: Some(MetaSlot::TextEncoder),
        }
    }
}

/// What the run needs beyond text-to-image (decides the optional components and parts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// The VAE encoder (`--init-img`, `-r`).
    pub encoder: bool,
    /// Reference images (`-r`): vision towers and other reference components.
    pub references: bool,
    /// Reference soundtracks (`--ref-audio`): the audio VAE's encoder.
    pub audio_references: bool,
}

/// One component's files in a store of their own.
#[derive(Debug)]
pub struct ComponentStore {
    pub store: TensorStore,
    /// The file or folder given for it (the `-m` checkpoint when it came from there).
    pub path: PathBuf,
}

impl ComponentStore {
    /// Opens `path` as component `id` (only its own tensors when `path` is a `-m` checkpoint;
    /// its subfolder when `path` is a diffusers pipeline folder).
    pub fn open(id: ComponentId, path: &Path, bundle: bool) -> Result<Self> {
        let mut store = TensorStore::new();
        if bundle && path.join(MODEL_INDEX).is_file() {
            return match pipeline_subfolder(id, path)? {
                Some(sub) => Self::open(id, &sub, false),
                None => Ok(Self {
                    store,
                    path: path.to_path_buf(),
                }),
            };
        }
        if bundle {
            store.add_part(path, "", id.prefix())?;
        } else {
            store.add_file(path, id.prefix())?;
        }
        Ok(Self {
            store,
            path: path.to_path_buf(),
        })
    }

    /// Where its tensors' names start: the component's prefix, or for a diffusion model one
    /// `model.diffusion_model.` deeper when its names are single-file names under the prefix.
    pub fn root(&self, id: ComponentId) -> String {
        let p = id.prefix();
        if matches!(id, ComponentId::Diffusion | ComponentId::HighNoiseDiffusion) {
            let nested = format!("{p}model.diffusion_model.");
            if self.has_prefix(&nested) {
                return nested;
            }
        }
        p.to_string()
    }

    /// Whether any tensor's name starts with `prefix`.
    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.store.with_prefix(prefix).next().is_some()
    }

    /// The `config.json` of its diffusers folder (or beside its weights file), if any.
    pub fn config(&self) -> Option<&serde_json::Value> {
        self.store.files().iter().find_map(|f| f.config.as_ref())
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }
}

/// The components of one run, each with its own store.
#[derive(Default)]
pub struct ComponentFiles {
    family: &'static str,
    parts: Vec<(ComponentId, ComponentStore)>,
}

impl ComponentFiles {
    /// Components given directly (tests, and callers that opened them themselves).
    pub fn new(family: &'static str) -> Self {
        Self {
            family,
            parts: Vec::new(),
        }
    }

    pub fn with(mut self, id: ComponentId, store: ComponentStore) -> Self {
        self.insert(id, store);
        self
    }

    /// Whether any component's file holds a quantized tensor.
    pub fn any_quantized(&self) -> bool {
        self.parts
            .iter()
            .any(|(_, s)| s.store.iter().any(|t| t.dtype.is_quantized()))
    }

    pub fn insert(&mut self, id: ComponentId, store: ComponentStore) {
        self.parts.retain(|(i, _)| *i != id);
        self.parts.push((id, store));
    }

    /// Opens every component of `specs` the run needs and does not have yet from `files`; a
    /// needed component that no file provides is an error naming the flag to pass.
    pub fn open_missing(
        &mut self,
        specs: &[ComponentSpec],
        files: &ModelFiles,
        needs: Needs,
    ) -> Result<()> {
        for spec in specs {
            let needed = match spec.required {
                Required::Always | Required::Optional => true,
                Required::WithReferences => needs.references,
                Required::WithImages => needs.encoder,
            };
            if !needed || self.get(spec.id).is_some() {
                continue;
            }
            let given = spec.flags.iter().find_map(|&f| files.get(f));
            let store = match (given, files.get(ModelFlag::Model)) {
                (Some(path), _) => Some(ComponentStore::open(spec.id, path, false)?),
                (None, Some(bundle)) => Some(ComponentStore::open(spec.id, bundle, true)?),
                (None, None) => None,
            };
            match store.filter(|s| !s.is_empty()) {
                Some(s) => self.insert(spec.id, s),
                None if spec.required == Required::Optional => {}
                None => return Err(missing(self.family, spec)),
            }
        }
        Ok(())
    }

    /// The store of component `id`, or an error naming the flag that provides it.
    pub fn require(&self, spec: &ComponentSpec) -> Result<&ComponentStore> {
        self.get(spec.id)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| missing(self.family, spec))
    }

    pub fn get(&self, id: ComponentId) -> Option<&ComponentStore> {
        self.parts.iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }
}

/// The file that makes a folder a diffusers pipeline (one subfolder per component).
const MODEL_INDEX: &str = "model_index.json";

/// Subfolders of a diffusers pipeline that may hold component `id`, in order of preference.
fn pipeline_candidates(id: ComponentId) -> &'static [&'static str] {
    match id {
        ComponentId::Diffusion => &["unet", "transformer"],
        // Only in a Wan 2.2 A14B pipeline ([`pipeline_subfolder`]).
        ComponentId::HighNoiseDiffusion => &[],
        ComponentId::ClipL | ComponentId::Llm | ComponentId::LlmVision => &["text_encoder"],
        ComponentId::ClipG => &["text_encoder_2"],
        // SD3 keeps T5 third; PixArt has it as its only text encoder.
        ComponentId::T5 => &["text_encoder_3", "text_encoder"],
        // MiniMax-H3's pipeline names its VAEs `video_vae` and `audio_vae`.
        ComponentId::Vae => &["vae", "video_vae"],
        ComponentId::AudioVae => &["audio_vae"],
        // WanImageToVideoPipeline's CLIP vision tower.
        ComponentId::ClipVision => &["image_encoder"],
        ComponentId::Taesd => &[],
    }
}

/// The parsed `model_index.json` of diffusers pipeline folder `root` (errors name the file).
pub fn read_model_index(root: &Path) -> Result<serde_json::Value> {
    let index_path = root.join(MODEL_INDEX);
    let bad = |reason: String| Error::Model {
        path: index_path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&index_path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))
}

/// The subfolder of pipeline folder `root` that holds component `id`: one its
/// `model_index.json` lists with a class (the SDXL refiner lists `text_encoder` as
/// `[null, null]`) and that exists.
fn pipeline_subfolder(id: ComponentId, root: &Path) -> Result<Option<PathBuf>> {
    let index = read_model_index(root)?;
    let listed = |name: &str| {
        index
            .get(name)
            .and_then(|v| v.as_array())
            .is_some_and(|a| a.iter().any(|x| !x.is_null()))
            && root.join(name).is_dir()
    };
    // diffusers' Wan 2.2 A14B pipelines hold the MoE pair: `transformer` samples the
    // high-noise steps, `transformer_2` the rest (WanPipeline's switch), so the folder gives
    // both `--diffusion-model` and `--high-noise-diffusion-model`.
    let pair = listed("transformer_2");
    let candidates: &[&str] = match id {
        ComponentId::Diffusion if pair => &["transformer_2"],
        ComponentId::HighNoiseDiffusion if pair => &["transformer"],
        _ => pipeline_candidates(id),
    };
    Ok(candidates
        .iter()
        .find(|name| listed(name))
        .map(|name| root.join(name)))
}

/// The `boundary_ratio` of a diffusers Wan 2.2 A14B pipeline folder (`model_index.json`):
/// the fraction of the 1000 training timesteps above which its high-noise expert samples.
pub fn pipeline_moe_boundary(root: &Path) -> Option<f32> {
    if !root.join(MODEL_INDEX).is_file() {
        return None;
    }
    let index = read_model_index(root).ok()?;
    index.get("transformer_2")?;
    Some(index.get("boundary_ratio")?.as_f64()? as f32)
}

fn missing(family: &str, spec: &ComponentSpec) -> Error {
    Error::Unsupported(format!(
        "{family} needs {}: none was found in the model files (pass {})",
        spec.what,
        spec.flags.first().map_or("-m", |f| f.flag())
    ))
}
