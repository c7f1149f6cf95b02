//! `-M convert`: rewrite model files as one GGUF, optionally converting weight types
//! (`sd-cli -M convert -m in.safetensors -o out.gguf --type q8_0`).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use super::RunConfig;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ggml::dequantize_rows;
use crate::runner::convert_f32;
use crate::weights::{Component, GgufValue, GgufWriter, TensorInfo, TensorStore};

/// The model files of this run with the prefix each goes in under (as upstream's convert). A
/// diffusers pipeline folder given as `-m` contributes each component folder under its
/// component's prefix, so the GGUF reads back as a single-file checkpoint.
fn inputs(cfg: &RunConfig) -> Result<Vec<(PathBuf, &'static str)>> {
    let m = &cfg.models;
    let mut v = Vec::new();
    if let Some(p) = &m.model {
        match pipeline_components(p)? {
            Some(parts) => v.extend(parts),
            None => v.push((p.clone(), "")),
        }
    }
    let parts = [
        (&m.diffusion_model, Component::Diffusion.prefix()),
        (&m.vae, Component::Vae.prefix()),
        (&m.t5xxl, Component::T5.prefix()),
        (&m.llm, Component::Llm.prefix()),
        (&m.clip_l, "text_encoders.clip_l.transformer."),
        (&m.clip_g, "text_encoders.clip_g.transformer."),
    ];
    for (path, prefix) in parts {
        if let Some(p) = path {
            v.push((p.clone(), prefix));
        }
    }
    Ok(v)
}

/// The component folders of a diffusers pipeline folder (one with `model_index.json`) and the
/// prefix each goes under, by folder and class: the denoiser, the VAE, CLIP text encoders in
/// upstream's first/second slots, T5 and LLM encoders in theirs. `None` for anything else.
fn pipeline_components(root: &Path) -> Result<Option<Vec<(PathBuf, &'static str)>>> {
    let index_path = root.join("model_index.json");
    if !root.is_dir() || !index_path.is_file() {
        return Ok(None);
    }
    let bad = |reason: String| Error::Model {
        path: index_path.clone(),
        reason,
    };
    let index = crate::pipeline::components::read_model_index(root)?;
    let mut parts = Vec::new();
    let Some(entries) = index.as_object() else {
        return Err(bad("not a JSON object".into()));
    };
    for (folder, value) in entries {
        // [library, class]; null classes mark absent components (the SDXL refiner's CLIP-L).
        let class = value
            .as_array()
            .and_then(|a| a.get(1))
            .and_then(|c| c.as_str())
            .unwrap_or("");
        let clip = class.starts_with("CLIPTextModel");
        let prefix = match folder.as_str() {
            "unet" | "transformer" => Component::Diffusion.prefix(),
            "vae" => Component::Vae.prefix(),
            "text_encoder" if clip => Component::TextEncoder.prefix(),
            "text_encoder_2" if clip => Component::TextEncoder2.prefix(),
            "text_encoder" | "text_encoder_2" | "text_encoder_3" if class.starts_with("T5") => {
                Component::T5.prefix()
            }
            "text_encoder" if !class.is_empty() => Component::Llm.prefix(),
            _ => continue,
        };
        let dir = root.join(folder);
        if dir.is_dir() {
            parts.push((dir, prefix));
        }
    }
    if parts.is_empty() {
        return Err(bad("lists no component folder this program can read".into()));
    }
    Ok(Some(parts))
}

/// The type a tensor is written as: `--type` for matrices whose rows split into whole blocks,
/// f16 for matrices that cannot take a quantized type (as upstream), else the loaded type.
fn target_type(info: &TensorInfo, wtype: Option<DType>) -> DType {
    let loaded = info.dtype;
    let Some(w) = wtype else { return loaded };
    if info.n_dims < 2 {
        return loaded;
    }
    if w.row_bytes(info.ne[0]).is_some() && w.can_quantize_from_f32() {
        w
    } else if w.is_quantized() {
        DType::F16
    } else {
        loaded
    }
}

fn tensor_bytes<'s>(store: &'s TensorStore, info: &TensorInfo, to: DType) -> Result<Cow<'s, [u8]>> {
    let from = info.dtype;
    if from == to {
        return Ok(store.load_bytes(info)?);
    }
    let values = if from.is_quantized() {
        let raw = store.load_bytes(info)?;
        dequantize_rows(from, &raw, info.ne[0]).map_err(|e| Error::Convert {
            key: info.name.clone(),
            reason: e.to_string(),
        })?
    } else {
        store.to_f32(info)?
    };
    convert_f32(&values, to, info.ne[0])
        .map(Cow::Owned)
        .map_err(|reason| Error::Convert {
            key: info.name.clone(),
            reason,
        })
}

pub fn run(cfg: &RunConfig) -> Result<()> {
    let wtype = cfg.weight_type;
    let mut store = TensorStore::new();
    for (path, prefix) in inputs(cfg)? {
        log::info!("loading {}", path.display());
        store.add_file(&path, prefix)?;
    }
    // Convert writes exactly the path given (no image-style extension handling).
    let out = std::path::PathBuf::from(&cfg.output.pattern);
    let mut writer = GgufWriter::new();
    // Keep the inputs' own metadata (tokenizers in GGUF files, for instance).
    for file in store.files() {
        for (k, v) in file.gguf.iter() {
            if k != "general.alignment" {
                writer.add_kv(k, v.clone())?;
            }
        }
    }
    writer.add_kv(
        "general.converted_by",
        GgufValue::String(format!("sd-cli {}", env!("CARGO_PKG_VERSION"))),
    )?;
    let infos: Vec<&TensorInfo> = store.iter().collect();
    let mut types = Vec::with_capacity(infos.len());
    for info in &infos {
        let ty = target_type(info, wtype);
        let ne: Vec<u64> = info.shape().iter().map(|&d| d as u64).collect();
        writer.add_tensor(&info.name, ty, &ne)?;
        types.push(ty);
    }
    let total = infos.len();
    let mut failure: Option<Error> = None;
    let result = writer.write_with(&out, |i| {
        if i % 64 == 0 || i + 1 == total {
            log::debug!("converting tensor {}/{total}", i + 1);
        }
        tensor_bytes(&store, infos[i], types[i]).map_err(|e| {
            let msg = e.to_string();
            failure = Some(e);
            crate::weights::WeightsError::BadValue {
                path: out.clone(),
                key: infos[i].name.clone(),
                reason: msg,
            }
        })
    });
    if let Some(e) = failure {
        return Err(e);
    }
    result?;
    log::info!("wrote {} tensors to {}", total, out.display());
    Ok(())
}
