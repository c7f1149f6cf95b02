//! Which device each model component runs on: `--backend` (a device for all, or
//! `diffusion=CUDA0,te=cpu,vae=cpu`), plus the upstream placement flags `--clip-on-cpu` and
//! `--vae-on-cpu`. Backends are opened once and shared by components on the same device.

use std::cell::RefCell;
use std::rc::Rc;

use crate::ggml::{list_devices, Backend, BackendChoice, GgmlError};

/// The part of a model a runner computes, as `--backend` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Diffusion,
    TextEncoder,
    Vae,
}

impl Role {
    /// The role an upstream `--backend` key names (`diffusion`, `te`, `clip`, `vae`, ...).
    pub fn from_key(key: &str) -> Option<Self> {
        match key.trim().to_ascii_lowercase().as_str() {
            "diffusion" | "dit" | "unet" => Some(Role::Diffusion),
            "te" | "clip" | "text_encoder" | "text-encoder" | "cond_stage" => {
                Some(Role::TextEncoder)
            }
            "vae" | "first_stage" => Some(Role::Vae),
            _ => None,
        }
    }
}

/// A validated `--backend` request: the device for every role, and overrides per role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendSpec {
    pub default: BackendChoice,
    pub per_role: Vec<(Role, BackendChoice)>,
}

impl BackendSpec {
    /// Parses `--backend` entries (`cpu`, `CUDA0`, `diffusion=CUDA0`, ...); device names must
    /// be devices of this build.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut out = BackendSpec::default();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split_once('=') {
                Some((key, dev)) => {
                    let role = Role::from_key(key).ok_or_else(|| {
                        format!("unknown component '{key}' (use diffusion, te or vae)")
                    })?;
                    out.set(role, parse_device(dev)?);
                }
                None => out.default = parse_device(entry)?,
            }
        }
        Ok(out)
    }

    /// Puts `role` on `choice` (later settings win).
    pub fn set(&mut self, role: Role, choice: BackendChoice) {
        self.per_role.retain(|(r, _)| *r != role);
        self.per_role.push((role, choice));
    }

    pub fn choice(&self, role: Role) -> &BackendChoice {
        self.per_role
            .iter()
            .find(|(r, _)| *r == role)
            .map_or(&self.default, |(_, c)| c)
    }
}

fn parse_device(name: &str) -> Result<BackendChoice, String> {
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
        Err(format!(
            "no device named '{name}' in this build (available: auto, cpu, {})",
            names.join(", ")
        ))
    }
}

/// The devices of a run, opened on first use.
pub struct BackendPlan {
    spec: BackendSpec,
    threads: usize,
    opened: RefCell<Vec<(BackendChoice, Rc<Backend>)>>,
}

impl BackendPlan {
    pub fn new(spec: BackendSpec, threads: usize) -> Self {
        Self {
            spec,
            threads: threads.max(1),
            opened: RefCell::new(Vec::new()),
        }
    }

    /// A plan that puts everything on the CPU (tests, demo).
    pub fn cpu(threads: usize) -> Self {
        Self::new(
            BackendSpec {
                default: BackendChoice::Cpu,
                per_role: Vec::new(),
            },
            threads,
        )
    }

    pub fn choice(&self, role: Role) -> &BackendChoice {
        self.spec.choice(role)
    }

    /// The backend for `role`, opened on first use and shared afterwards.
    pub fn backend(&self, role: Role) -> Result<Rc<Backend>, GgmlError> {
        let choice = self.choice(role).clone();
        if let Some((_, b)) = self.opened.borrow().iter().find(|(c, _)| *c == choice) {
            return Ok(b.clone());
        }
        let backend = Rc::new(Backend::new(&choice, self.threads)?);
        log::debug!(
            "{role:?} runs on {} ({})",
            backend.name(),
            backend.info().description
        );
        if backend.is_cpu() {
            log::debug!("CPU {}", crate::cpu_info::cpu_line(self.threads));
        }
        self.opened.borrow_mut().push((choice, backend.clone()));
        Ok(backend)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_spec_parses_roles_and_devices() {
        let s = BackendSpec::parse("cpu, diffusion=auto,te=CPU").unwrap();
        assert_eq!(s.default, BackendChoice::Cpu);
        assert_eq!(s.choice(Role::Diffusion), &BackendChoice::Auto);
        assert_eq!(s.choice(Role::TextEncoder), &BackendChoice::Cpu);
        assert_eq!(s.choice(Role::Vae), &BackendChoice::Cpu);
        assert!(BackendSpec::parse("unet2=cpu")
            .unwrap_err()
            .contains("unet2"));
        assert!(BackendSpec::parse("nosuchdev0")
            .unwrap_err()
            .contains("nosuchdev0"));
    }
}
