//! `-M img_gen`: load the model files, detect the family, run its pipeline.

use crate::cli::RunConfig;
use crate::error::{Error, Result};
use crate::weights::{detect_family, Component, ModelFamily, TensorStore};

pub fn run(cfg: &RunConfig) -> Result<()> {
    // Flags first: a typo fails before any model file is read.
    let _sampling = super::SamplingSetup::resolve(cfg)?;
    let _backends = super::BackendPlan::resolve(cfg)?;
    let m = &cfg.models;
    let mut store = TensorStore::new();
    if let Some(p) = &m.model {
        store.add_file(p, "")?;
    }
    if let Some(p) = &m.diffusion_model {
        store.add_file(p, Component::Diffusion.prefix())?;
    }
    let family = detect_family(&store);
    match family {
        ModelFamily::Unknown => Err(Error::Unsupported(
            "could not recognise the diffusion model from its tensor names; supported families: PixArt-α/Σ, Qwen Image 2.1".into(),
        )),
        other => Err(Error::Unsupported(format!(
            "model family {other:?} was recognised, but its pipeline is not implemented in this build yet"
        ))),
    }
}
