//! Loading one model component: declare its weights, load them, wrap them in a runner.

use std::rc::Rc;

use super::{
    RunOptions, Runner, RunnerError, WeightAdapters, WeightBuilder, WeightLoader, WeightSource,
};
use crate::dtype::DType;
use crate::ggml::Backend;

/// Where and how a component is loaded.
#[derive(Clone)]
pub struct LoadOptions {
    pub backend: Rc<Backend>,
    /// `--type`: conversion target of matmul weights.
    pub wtype: Option<DType>,
    /// The runner's options; `run.memory.offload_to_cpu` keeps the weights in host memory.
    pub run: RunOptions,
    /// Weight adapters (LoRA) of this component.
    pub adapters: Option<Rc<dyn WeightAdapters>>,
}

/// A model with the runner that owns its weights.
pub struct Loaded<M> {
    pub model: M,
    pub runner: Runner,
}

impl Runner {
    /// Loads one component named `name`: `build` reads the configuration from the declared
    /// source and constructs the model (declaring its weights); the weights are then loaded on
    /// the backend (or into host memory with `--offload-to-cpu`) and handed to a new runner.
    pub fn load<M, E>(
        name: &str,
        source: &dyn WeightSource,
        opts: LoadOptions,
        build: impl FnOnce(&WeightBuilder<'_, '_>) -> Result<M, E>,
    ) -> Result<Loaded<M>, E>
    where
        E: From<RunnerError>,
    {
        let loader = WeightLoader::new(source, opts.wtype).with_adapters(opts.adapters.as_deref());
        let model = build(&loader.root(""))?;
        let weights = loader.finish_for(&opts.backend, name, &opts.run.memory)?;
        Ok(Loaded {
            model,
            runner: Runner::new(name, opts.backend, Some(weights), opts.run),
        })
    }
}
