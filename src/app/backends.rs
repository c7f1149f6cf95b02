//! Which device each model component runs on: `--backend` (a device for all, or
//! `diffusion=CUDA0,te=cpu,vae=cpu`), plus the upstream placement flags `--clip-on-cpu` and
//! `--vae-on-cpu`. Backends are opened once and shared by components on the same device.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::cli::RunConfig;
use crate::error::{Error, Result};
use crate::ggml::{list_devices, Backend, BackendChoice};

/// A model component that owns a runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    Diffusion,
    TextEncoder,
    Vae,
}

impl Module {
    fn from_key(key: &str) -> Option<Self> {
        match key.trim().to_ascii_lowercase().as_str() {
            "diffusion" | "dit" | "unet" => Some(Module::Diffusion),
            "te" | "clip" | "text_encoder" | "text-encoder" | "cond_stage" => {
                Some(Module::TextEncoder)
            }
            "vae" | "first_stage" => Some(Module::Vae),
            _ => None,
        }
    }
}

fn parse_device(name: &str) -> Result<BackendChoice> {
    let name = name.trim();
    if name.eq_ignore_ascii_case("auto") || name.is_empty() {
        return Ok(BackendChoice::Auto);
    }
    if name.eq_ignore_ascii_case("cpu") {
        return Ok(BackendChoice::Cpu);
    }
    let known = list_devices();
    if known.iter().any(|d| d.name.eq_ignore_ascii_case(name)) {
        Ok(BackendChoice::Named(name.to_string()))
    } else {
        let names: Vec<String> = known.iter().map(|d| d.name.clone()).collect();
        Err(Error::Flag {
            flag: "--backend".into(),
            reason: format!(
                "no device named '{name}' in this build (available: auto, cpu, {})",
                names.join(", ")
            ),
        })
    }
}

pub struct BackendPlan {
    default: BackendChoice,
    per_module: HashMap<Module, BackendChoice>,
    threads: usize,
    opened: RefCell<Vec<(BackendChoice, Rc<Backend>)>>,
}

impl BackendPlan {
    pub fn resolve(cfg: &RunConfig) -> Result<Self> {
        let mut default = BackendChoice::Auto;
        let mut per_module = HashMap::new();
        for entry in cfg
            .runtime
            .backend
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            match entry.split_once('=') {
                Some((key, dev)) => {
                    let module = Module::from_key(key).ok_or_else(|| Error::Flag {
                        flag: "--backend".into(),
                        reason: format!("unknown component '{key}' (use diffusion, te or vae)"),
                    })?;
                    per_module.insert(module, parse_device(dev)?);
                }
                None => default = parse_device(entry)?,
            }
        }
        if cfg.runtime.clip_on_cpu {
            per_module.insert(Module::TextEncoder, BackendChoice::Cpu);
        }
        if cfg.runtime.vae_on_cpu {
            per_module.insert(Module::Vae, BackendChoice::Cpu);
        }
        Ok(Self {
            default,
            per_module,
            threads: cfg.runtime.threads.max(1) as usize,
            opened: RefCell::new(Vec::new()),
        })
    }

    /// A plan that puts everything on the CPU (tests, demo).
    pub fn cpu(threads: usize) -> Self {
        Self {
            default: BackendChoice::Cpu,
            per_module: HashMap::new(),
            threads,
            opened: RefCell::new(Vec::new()),
        }
    }

    pub fn choice(&self, module: Module) -> &BackendChoice {
        self.per_module.get(&module).unwrap_or(&self.default)
    }

    /// The backend for `module`, opened on first use and shared afterwards.
    pub fn backend(&self, module: Module) -> Result<Rc<Backend>> {
        let choice = self.choice(module).clone();
        if let Some((_, b)) = self.opened.borrow().iter().find(|(c, _)| *c == choice) {
            return Ok(b.clone());
        }
        let backend = Rc::new(Backend::new(&choice, self.threads)?);
        log::debug!(
            "{module:?} runs on {} ({})",
            backend.name(),
            backend.info().description
        );
        self.opened.borrow_mut().push((choice, backend.clone()));
        Ok(backend)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }
}
