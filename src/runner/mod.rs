//! Runners: a model's weights on a backend, and graph-at-a-time execution.
//!
//! A runner builds a fresh graph for each call from a pure `forward`, binds host inputs,
//! allocates intermediates with ggml's graph allocator (reused across calls), computes,
//! and copies the outputs back to the host.

mod cache;
mod error;
mod graph_ctx;
mod host;
mod source;
mod weights;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

pub use cache::NamedCache;
pub use error::RunnerError;
pub use graph_ctx::{CutMark, GraphCtx};
pub use host::HostTensor;
pub use source::{MemorySource, SourceTensor, StoreSource, WeightSource};
pub use weights::{convert_f32, ModelWeights, Param, Storage, WeightBuilder, WeightLoader};

use crate::ggml::{Backend, Context, Gallocr, GgmlType, Graph, Ne, Tensor};
use graph_ctx::InputData;

/// Nodes a graph may hold; generous enough for a whole DiT or VAE decoder.
pub const DEFAULT_GRAPH_SIZE: usize = 1 << 16;

/// Per-runner execution options.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Use ggml's fused flash attention where a model supports it (`--fa`).
    pub flash_attn: bool,
    pub graph_size: usize,
    /// A device-memory budget in bytes this runner must stay within (weights + cache +
    /// compute buffer). Exceeding it fails like a device out-of-memory, which lets the CPU
    /// backend exercise the same fallbacks a GPU would (`--max-vram`, tests).
    pub memory_budget: Option<usize>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            flash_attn: false,
            graph_size: DEFAULT_GRAPH_SIZE,
            memory_budget: None,
        }
    }
}

/// One model component resident on a backend.
pub struct Runner {
    name: String,
    backend: Rc<Backend>,
    weights: Option<ModelWeights>,
    options: RunOptions,
    gallocr: RefCell<Option<Gallocr>>,
    cache: RefCell<NamedCache>,
    last_compute_bytes: std::cell::Cell<usize>,
}

impl Runner {
    pub fn new(
        name: &str,
        backend: Rc<Backend>,
        weights: Option<ModelWeights>,
        options: RunOptions,
    ) -> Self {
        Self {
            name: name.to_string(),
            backend,
            weights,
            options,
            gallocr: RefCell::new(None),
            cache: RefCell::new(NamedCache::default()),
            last_compute_bytes: std::cell::Cell::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    pub fn weights(&self) -> Option<&ModelWeights> {
        self.weights.as_ref()
    }

    pub fn options(&self) -> &RunOptions {
        &self.options
    }

    /// Frees cache entries whose names start with `prefix` ("" frees all).
    pub fn clear_cache(&self, prefix: &str) {
        self.cache.borrow_mut().clear_prefix(prefix);
    }

    /// Compute-buffer bytes the last graph needed (for memory reports and budget tests).
    pub fn last_compute_bytes(&self) -> usize {
        self.last_compute_bytes.get()
    }

    pub fn cache_bytes(&self) -> usize {
        self.cache.borrow().bytes()
    }

    /// Whether the named cache holds an entry `name`.
    pub fn has_cache(&self, name: &str) -> bool {
        self.cache.borrow().contains(name)
    }

    /// The storage type and shape (ggml order) of cache entry `name`, if present.
    pub fn cache_info(&self, name: &str) -> Option<(GgmlType, Ne)> {
        self.cache.borrow().info(name)
    }

    /// Builds a graph with `build`, runs it, and returns its outputs in order as f32.
    pub fn compute<F>(&self, build: F) -> Result<Vec<HostTensor>, RunnerError>
    where
        F: for<'g> FnOnce(&'g GraphCtx<'g>) -> Vec<Tensor<'g>>,
    {
        let start = Instant::now();
        let size = self.options.graph_size;
        let ctx = Context::new(size * 2 + 64, size)?;
        let (results, pending) = self.run_graph(&ctx, build)?;
        let mut cache = self.cache.borrow_mut();
        for (ty, ne, bytes, name) in pending {
            cache.put(&self.backend, &name, ty, ne, &bytes)?;
        }
        log::trace!(
            "{}: computed in {:.3}s",
            self.name,
            start.elapsed().as_secs_f64()
        );
        Ok(results)
    }

    #[allow(clippy::type_complexity)]
    fn run_graph<F>(
        &self,
        ctx: &Context,
        build: F,
    ) -> Result<(Vec<HostTensor>, Vec<(GgmlType, Ne, Vec<u8>, String)>), RunnerError>
    where
        F: for<'g> FnOnce(&'g GraphCtx<'g>) -> Vec<Tensor<'g>>,
    {
        let size = self.options.graph_size;
        let cache = self.cache.borrow();
        let g = GraphCtx::new(ctx, self.weights.as_ref(), &cache, self.options.flash_attn);
        let outputs = build(&g);
        let graph = Graph::new(ctx, size);
        // Outputs are made contiguous f32 so they read back in one copy.
        let outputs: Vec<Tensor<'_>> = outputs
            .into_iter()
            .map(|t| {
                let t = if t.ty() != GgmlType::F32 {
                    ctx.cast(t, GgmlType::F32)
                } else {
                    t
                };
                // A view's memory belongs to its source, which the allocator may reuse for
                // later nodes: outputs get their own contiguous copy.
                let t = if t.is_contiguous() && !t.is_view() {
                    t
                } else {
                    ctx.cont(t)
                };
                t.mark_output()
            })
            .collect();
        for &t in &outputs {
            graph.expand(t);
        }
        let stores: Vec<(Tensor<'_>, String)> = g.stores.borrow().clone();
        for (t, _) in &stores {
            graph.expand(*t);
        }

        let mut galloc_slot = self.gallocr.borrow_mut();
        if galloc_slot.is_none() {
            *galloc_slot = Some(Gallocr::new(&self.backend)?);
        }
        // Measure with a throwaway allocator: measuring marks an allocator as reserved
        // without giving it memory, so the one that allocates must not be the one measured.
        let needed = Gallocr::new(&self.backend)?.measure(&graph);
        let mut galloc = galloc_slot.as_mut().expect("allocator just created");
        if galloc.buffer_size() > needed.saturating_mul(2) {
            // A much smaller graph than before (e.g. after a retry with smaller tiles): start
            // over so the oversized buffer is released.
            *galloc_slot = Some(Gallocr::new(&self.backend)?);
            galloc = galloc_slot.as_mut().expect("allocator just created");
        }
        if let Some(budget) = self.options.memory_budget {
            let compute = needed;
            let resident = self.weights.as_ref().map_or(0, ModelWeights::bytes) + cache.bytes();
            if resident + compute > budget {
                return Err(RunnerError::Ggml(crate::ggml::GgmlError::OutOfMemory {
                    device: format!(
                        "{} (budget {:.1} MiB)",
                        self.backend.name(),
                        budget as f64 / 1048576.0
                    ),
                    what: format!("{} compute buffer", self.name),
                    bytes: compute,
                }));
            }
        }
        galloc.alloc(&graph)?;
        self.last_compute_bytes.set(galloc.buffer_size());
        for (t, name, data) in g.inputs.borrow().iter() {
            if !t.is_allocated() {
                // Declared but not reachable from any output: nothing to fill.
                continue;
            }
            let n = t.n_elements();
            let got = match data {
                InputData::F32(v) | InputData::F16(v) => v.len(),
                InputData::I32(v) => v.len(),
            };
            if got != n {
                return Err(RunnerError::InputSize {
                    name: name.clone(),
                    ne: t.ne(),
                    got,
                });
            }
            match data {
                InputData::F32(v) => t.write_f32(v)?,
                InputData::I32(v) => t.write_i32(v)?,
                InputData::F16(v) => {
                    let bytes: Vec<u8> = v
                        .iter()
                        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                        .collect();
                    t.write_bytes(&bytes)?
                }
            }
        }
        self.backend.compute(&graph)?;

        let mut results = Vec::with_capacity(outputs.len());
        for t in &outputs {
            results.push(HostTensor {
                ne: t.ne(),
                data: t.read_f32()?,
            });
        }
        let pending = stores
            .iter()
            .map(|(t, name)| Ok((t.ty(), t.ne(), t.read_bytes()?, name.clone())))
            .collect::<Result<Vec<_>, crate::ggml::GgmlError>>()?;
        log::trace!(
            "{}: graph of {} nodes, compute buffer {:.1} MiB",
            self.name,
            graph.n_nodes(),
            galloc.buffer_size() as f64 / (1024.0 * 1024.0)
        );
        Ok((results, pending))
    }
}
