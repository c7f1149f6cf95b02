//! The LoRAs of a run and their matching against each component's declared weights.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use super::delta::{self, Target};
use super::file::{LoraFile, ModuleKey};
use super::keys::{flatten, LoraTarget};
use super::names::{AliasRule, RowSlice};
use super::LoraError;
use crate::pipeline::components::ComponentId;
use crate::runner::adapters::{DeclaredWeight, WeightPatch, WeightRole};
use crate::runner::{AdapterMode, RunnerError, WeightAdapters};

/// The LoRA files of a run, how they apply, and which of their modules found a weight.
pub struct LoraSet {
    files: Vec<LoraFile>,
    mode: AdapterMode,
    aliases: &'static [AliasRule],
    /// Per file: the modules that matched a weight of a loaded component.
    matched: RefCell<Vec<BTreeSet<ModuleKey>>>,
}

impl LoraSet {
    pub fn new(files: Vec<LoraFile>, mode: AdapterMode, aliases: &'static [AliasRule]) -> Self {
        let matched = RefCell::new(vec![BTreeSet::new(); files.len()]);
        Self {
            files,
            mode,
            aliases,
            matched,
        }
    }

    pub fn files(&self) -> &[LoraFile] {
        &self.files
    }

    pub fn mode(&self) -> AdapterMode {
        self.mode
    }

    /// The adapters of component `id`, if any LoRA module is meant for it. The high-noise
    /// expert takes the `|high_noise|` LoRAs' diffusion modules, every other component the
    /// plain LoRAs' modules of its kind.
    pub fn for_component(self: &Rc<Self>, id: ComponentId) -> Option<Rc<dyn WeightAdapters>> {
        let high_noise = id == ComponentId::HighNoiseDiffusion;
        let targets: &[LoraTarget] = match id {
            ComponentId::Diffusion | ComponentId::HighNoiseDiffusion => &[LoraTarget::Diffusion],
            ComponentId::ClipL | ComponentId::Llm => &[LoraTarget::TextEncoder(1)],
            ComponentId::ClipG => &[LoraTarget::TextEncoder(2)],
            ComponentId::T5 => &[LoraTarget::TextEncoder(3), LoraTarget::TextEncoder(1)],
            _ => return None,
        };
        let wanted = self
            .files
            .iter()
            .filter(|f| f.high_noise == high_noise)
            .any(|f| f.modules.keys().any(|(t, _)| targets.contains(t)));
        wanted.then(|| {
            Rc::new(ComponentLora {
                set: self.clone(),
                targets,
                high_noise,
                matches: RefCell::new(Vec::new()),
            }) as Rc<dyn WeightAdapters>
        })
    }

    /// After loading: an error for a LoRA none of whose modules matched a weight (a LoRA for
    /// another model family, most often); the count of unmatched modules otherwise (`-v`).
    pub fn check_matched(&self, family: &str) -> Result<(), LoraError> {
        let matched = self.matched.borrow();
        for (f, hits) in self.files.iter().zip(matched.iter()) {
            let unmatched: Vec<&ModuleKey> =
                f.modules.keys().filter(|k| !hits.contains(*k)).collect();
            if hits.is_empty() {
                let first = unmatched.first().map_or("", |k| f.first_key(k));
                return Err(LoraError::NoMatch {
                    path: f.path.clone(),
                    family: family.to_string(),
                    first_key: first.to_string(),
                });
            }
            log::info!(
                "LoRA '{}' ×{}: {} of {} modules applied{}",
                f.name,
                f.multiplier,
                hits.len(),
                f.modules.len(),
                if self.mode == AdapterMode::Merge {
                    " (merged)"
                } else {
                    " (at run time)"
                }
            );
            if !unmatched.is_empty() {
                log::debug!(
                    "LoRA '{}': {} modules match no weight of this model, e.g. '{}'",
                    f.name,
                    unmatched.len(),
                    f.first_key(unmatched[0])
                );
            }
            if !f.other.is_empty() {
                log::debug!(
                    "LoRA '{}': {} tensors are no adapter piece, e.g. '{}'",
                    f.name,
                    f.other.len(),
                    f.other[0]
                );
            }
        }
        Ok(())
    }
}

/// One module matched to one weight.
struct Match {
    file: usize,
    module: ModuleKey,
    weight: usize,
    /// The part of the weight's rows it covers.
    part: Option<RowSlice>,
    /// The weight is the module's bias (`.diff_b`).
    bias: bool,
}

/// A run's LoRAs as one component's [`WeightAdapters`].
struct ComponentLora {
    set: Rc<LoraSet>,
    targets: &'static [LoraTarget],
    /// Whether this is the high-noise expert (it takes only the `|high_noise|` LoRAs).
    high_noise: bool,
    matches: RefCell<Vec<Match>>,
}

fn target_of(w: &DeclaredWeight, part: Option<RowSlice>) -> Target {
    let (rows, cols) = w.rows_cols();
    let kernel = match w.role {
        WeightRole::Conv { kernel: (kw, kh) } => kw * kh,
        _ if w.ne[2] > 1 || w.ne[3] > 1 => w.ne[0] * w.ne[1],
        _ => 1,
    };
    let rows = part.map_or(rows, |p| p.rows(rows).1);
    Target { rows, cols, kernel }
}

impl ComponentLora {
    /// Flattened module name (and its aliases) → (weight, part); biases separately.
    fn index(&self, weights: &[DeclaredWeight]) -> IndexMaps {
        let mut maps = IndexMaps::default();
        // (weight, module name, is a bias) of every weight and bias.
        let modules: Vec<(usize, &str, bool)> = weights
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                w.name
                    .strip_suffix(".weight")
                    .map(|m| (i, m, false))
                    .or_else(|| w.name.strip_suffix(".bias").map(|m| (i, m, true)))
            })
            .collect();
        for &(i, m, bias) in &modules {
            if bias {
                maps.biases.entry(flatten(m)).or_insert(i);
            } else {
                maps.weights.entry(flatten(m)).or_insert((i, None));
            }
        }
        let names: Vec<&str> = modules.iter().map(|m| m.1).collect();
        for rule in self.set.aliases {
            for (&(i, _, bias), aliases) in modules.iter().zip(rule(&names)) {
                for a in aliases {
                    if bias {
                        if a.part.is_none() {
                            maps.biases.entry(flatten(&a.name)).or_insert(i);
                        }
                    } else {
                        maps.weights.entry(flatten(&a.name)).or_insert((i, a.part));
                    }
                }
            }
        }
        maps
    }

    fn shape_error(
        &self,
        file: &LoraFile,
        key: &ModuleKey,
        w: &DeclaredWeight,
        reason: String,
    ) -> RunnerError {
        RunnerError::BadData {
            key: file.first_key(key).to_string(),
            origin: file.path.display().to_string(),
            reason: format!(
                "does not fit the model weight '{}' (shape {:?}, ggml order): {reason}; is it \
                 a LoRA for another model?",
                w.name, w.ne
            ),
        }
    }
}

#[derive(Default)]
struct IndexMaps {
    weights: HashMap<String, (usize, Option<RowSlice>)>,
    biases: HashMap<String, usize>,
}

impl WeightAdapters for ComponentLora {
    fn mode(&self) -> AdapterMode {
        self.set.mode
    }

    fn targets(&self, weights: &[DeclaredWeight]) -> Result<Vec<usize>, RunnerError> {
        let maps = self.index(weights);
        let mut matches = Vec::new();
        let mut hit = self.set.matched.borrow_mut();
        for (fi, file) in self.set.files.iter().enumerate() {
            if file.high_noise != self.high_noise {
                continue;
            }
            for (key, pieces) in &file.modules {
                if !self.targets.contains(&key.0) {
                    continue;
                }
                let mut found = false;
                if delta::patches_weight(pieces) {
                    if let Some(&(wi, part)) = maps.weights.get(&key.1) {
                        let t = target_of(&weights[wi], part);
                        let (rows, _) = weights[wi].rows_cols();
                        if part.is_some_and(|p| rows % p.of.max(1) != 0) {
                            let reason = format!("its rows do not split into {part:?}");
                            return Err(self.shape_error(file, key, &weights[wi], reason));
                        }
                        check_lora_shapes(file, pieces, t)
                            .map_err(|r| self.shape_error(file, key, &weights[wi], r))?;
                        matches.push(Match {
                            file: fi,
                            module: key.clone(),
                            weight: wi,
                            part,
                            bias: false,
                        });
                        found = true;
                    }
                }
                if pieces.contains_key(&super::keys::Part::DiffBias) {
                    if let Some(&bi) = maps.biases.get(&key.1) {
                        matches.push(Match {
                            file: fi,
                            module: key.clone(),
                            weight: bi,
                            part: None,
                            bias: true,
                        });
                        found = true;
                    }
                }
                if found {
                    hit[fi].insert(key.clone());
                }
            }
        }
        let mut out: Vec<usize> = matches.iter().map(|m| m.weight).collect();
        out.sort_unstable();
        out.dedup();
        *self.matches.borrow_mut() = matches;
        Ok(out)
    }

    fn patches(
        &self,
        weights: &[DeclaredWeight],
        index: usize,
    ) -> Result<Vec<WeightPatch>, RunnerError> {
        let w = &weights[index];
        let mut out = Vec::new();
        for m in self.matches.borrow().iter().filter(|m| m.weight == index) {
            let file = &self.set.files[m.file];
            let pieces = &file.modules[&m.module];
            let t = target_of(w, m.part);
            let delta = if m.bias {
                delta::bias_delta(&file.store, pieces, t.rows, file.multiplier)
                    .and_then(|d| d.ok_or_else(|| "no .diff_b".to_string()))
            } else {
                delta::weight_delta(&file.store, pieces, t, file.multiplier)
            }
            .map_err(|r| self.shape_error(file, &m.module, w, r))?;
            out.push(WeightPatch {
                row0: m.part.map_or(0, |p| p.rows(w.rows_cols().0).0),
                rows: t.rows,
                delta,
            });
        }
        Ok(out)
    }
}

/// The cheap shape checks of a LoRA (down/up) module, from the tensors' shapes alone.
fn check_lora_shapes(file: &LoraFile, pieces: &delta::Pieces, t: Target) -> Result<(), String> {
    use super::keys::Part;
    let shape = |p: Part| {
        pieces.get(&p).and_then(|n| file.store.get(n)).map(|i| {
            (
                i.shape().iter().rev().copied().collect::<Vec<_>>(),
                i.numel(),
            )
        })
    };
    let (Some((down, down_n)), Some((up, up_n))) = (shape(Part::Down), shape(Part::Up)) else {
        if pieces.contains_key(&Part::Down) != pieces.contains_key(&Part::Up) {
            return Err("it has only one of the two LoRA matrices".into());
        }
        return Ok(());
    };
    let rank = down.first().copied().unwrap_or(1).max(1);
    let up_rows = up.first().copied().unwrap_or(1).max(1);
    if up_rows != t.rows || up_n / up_rows != rank {
        return Err(format!(
            "lora_up has shape {up:?}, expected [{}, {rank}]",
            t.rows
        ));
    }
    let mid = pieces.contains_key(&Part::Mid);
    if !mid && down_n / rank != t.cols {
        return Err(format!(
            "lora_down has shape {down:?}, expected [{rank}, {}]",
            t.cols
        ));
    }
    Ok(())
}
