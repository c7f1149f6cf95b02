//! Runners: a model's weights on a backend, and graph-at-a-time execution.
//!
//! A runner builds a fresh graph for each call from a pure `forward`, binds host inputs,
//! allocates intermediates with ggml's graph allocator (reused across calls), computes,
//! and copies the outputs back to the host.

pub mod adapters;
mod cache;
mod error;
mod graph_ctx;
pub mod graph_cut;
mod load;
mod placement;

mod profile;
mod source;
mod weights;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

pub use cache::NamedCache;
pub use error::RunnerError;
pub use graph_ctx::{CutMark, GraphCtx};
pub use graph_cut::{MaxVram, MemoryOptions, RunReport, SegmentReport, VramLimit};
pub use load::{LoadOptions, Loaded};
pub use placement::{BackendPlan, BackendSpec, Role};

pub use adapters::{AdapterMode, WeightAdapters, WeightRole};
pub use source::{MemorySource, SourceTensor, StoreSource, WeightSource};
pub use weights::{convert_f32, ModelWeights, Param, Storage, WeightBuilder, WeightLoader};

use crate::dtype::DType;
use crate::ggml::{Backend, Context, Gallocr, Graph, Tensor};
use crate::tensor::HostTensor;
use crate::tensor::Ne;
use cache::CacheStores;
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
    /// compute buffer), overriding `memory.max_vram`. Graphs that do not fit run segment by
    /// segment at their cut marks; when even that does not fit, compute fails like a device
    /// out-of-memory, which lets the CPU backend exercise the same paths a GPU would.
    pub memory_budget: Option<usize>,
    /// Budget source, weight offload, prefetch and segmentation switches.
    pub memory: MemoryOptions,
    /// On the CPU backend, run linears, f32 convolutions and attention through the blocked
    /// AVX-512 kernels where the CPU has them (`ggml::gemm`); off = ggml's own kernels
    /// everywhere (also `SD_CLI_GEMM=ggml`).
    pub blocked_kernels: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            flash_attn: false,
            graph_size: DEFAULT_GRAPH_SIZE,
            memory_budget: None,
            memory: MemoryOptions::default(),
            blocked_kernels: true,
        }
    }
}

/// One model component resident on a backend.
pub struct Runner {
    name: String,
    backend: Rc<Backend>,
    weights: Option<ModelWeights>,
    options: RunOptions,
    /// Compute buffer of monolithic runs.
    gallocr: RefCell<Option<Gallocr>>,
    /// Compute buffer shared by the segments of segmented runs.
    seg_gallocr: RefCell<Option<Gallocr>>,
    /// Sizes graphs without allocating (holds no buffer).
    measure: RefCell<Option<Gallocr>>,
    cache: RefCell<NamedCache>,
    /// Device copies of offloaded weights.
    residency: RefCell<graph_cut::Residency>,
    /// Second queue on the device for async weight uploads (Some(None): none available).
    stream: RefCell<Option<Option<Backend>>>,
    /// The managed budget in bytes, resolved at creation.
    budget: Option<usize>,
    report: RefCell<Option<RunReport>>,
    /// Segment count of the last plan logged at debug level (later identical plans log at
    /// trace level).
    logged_segments: Cell<usize>,
    /// Compute-buffer bytes of the last graph (largest segment's when segmented).
    last_compute_bytes: Cell<usize>,
}

impl Runner {
    pub fn new(
        name: &str,
        backend: Rc<Backend>,
        weights: Option<ModelWeights>,
        options: RunOptions,
    ) -> Self {
        let budget =
            options
                .memory_budget
                .or(match options.memory.max_vram.for_device(backend.name()) {
                    VramLimit::Budget(b) => Some(b),
                    VramLimit::FreeMinus(spare) => Some(backend.memory().0.saturating_sub(spare)),
                    VramLimit::DeviceFree => None,
                });
        if let Some(b) = budget {
            log::debug!("{name}: device budget {:.1} MiB", graph_cut::mib(b));
        }
        Self {
            name: name.to_string(),
            backend,
            weights,
            options,
            gallocr: RefCell::new(None),
            seg_gallocr: RefCell::new(None),
            measure: RefCell::new(None),
            cache: RefCell::new(NamedCache::default()),
            residency: RefCell::new(graph_cut::Residency::default()),
            stream: RefCell::new(None),
            budget,
            report: RefCell::new(None),
            logged_segments: Cell::new(0),
            last_compute_bytes: Cell::new(0),
        }
    }

    /// What the last call did: monolithic or segmented, per-segment bytes, peak memory.
    /// Only calls that planned against a budget (a budget, a GPU, offloaded weights) report.
    pub fn last_report(&self) -> Option<RunReport> {
        self.report.borrow().clone()
    }

    /// Frees the device copies of offloaded weights (they are re-uploaded on demand).
    pub fn release_weights(&self) {
        if let Some(w) = &self.weights {
            self.residency.borrow_mut().clear(w);
        }
    }

    /// Device bytes held by copies of offloaded weights.
    pub fn resident_weight_bytes(&self) -> usize {
        self.residency.borrow().bytes()
    }

    /// Whether calls plan against a device budget (else they always run monolithically).
    fn plans(&self) -> bool {
        self.budget.is_some()
            || !self.backend.is_cpu()
            || self.options.memory.force_segmented
            || self
                .weights
                .as_ref()
                .is_some_and(ModelWeights::is_offloaded)
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
    pub fn cache_info(&self, name: &str) -> Option<(DType, Ne)> {
        self.cache.borrow().info(name)
    }

    /// Builds a graph with `build`, runs it, and returns its outputs in order as f32. Cache
    /// stores the graph made become entries of the runner's cache once it has run.
    pub fn compute<F>(&self, build: F) -> Result<Vec<HostTensor>, RunnerError>
    where
        F: for<'g> FnOnce(&'g GraphCtx<'g>) -> Vec<Tensor<'g>>,
    {
        let start = Instant::now();
        let size = self.options.graph_size;
        let ctx = Context::new(size * 2 + 64, size)?;
        let stores = CacheStores::default();
        let results = self.run_graph(&ctx, &stores, build)?;
        if !stores.is_empty() {
            self.cache.borrow_mut().insert(stores);
        }
        log::trace!(
            "{}: computed in {:.3}s",
            self.name,
            start.elapsed().as_secs_f64()
        );
        Ok(results)
    }

    /// [`Runner::compute`] for a graph with one output whose building may fail (a model's
    /// `forward` checking its inputs): the build's error, else the output.
    pub fn compute_one<F, E>(&self, build: F) -> Result<HostTensor, E>
    where
        F: for<'g> FnOnce(&'g GraphCtx<'g>) -> Result<Tensor<'g>, E>,
        E: From<RunnerError>,
    {
        let mut error = None;
        let out = self.compute(|g| match build(g) {
            Ok(t) => vec![t],
            Err(e) => {
                error = Some(e);
                // A graph needs a node; this one is never read.
                vec![g.input_f32("compute_one.unused", [1, 1, 1, 1], vec![0.0])]
            }
        });
        if let Some(e) = error {
            return Err(e);
        }
        out?.into_iter().next().ok_or_else(|| {
            RunnerError::Internal(format!("{}: the graph had no output", self.name)).into()
        })
    }

    fn run_graph<F>(
        &self,
        ctx: &Context,
        stores: &CacheStores,
        build: F,
    ) -> Result<Vec<HostTensor>, RunnerError>
    where
        F: for<'g> FnOnce(&'g GraphCtx<'g>) -> Vec<Tensor<'g>>,
    {
        let size = self.options.graph_size;
        let cache = self.cache.borrow();
        let graph = Graph::new(ctx, size);
        let kernels = if self.options.blocked_kernels && blocked_gemm_wanted() {
            self.backend.cpu_kernels()
        } else {
            None
        };
        let g = GraphCtx::new(
            ctx,
            self.weights.as_ref(),
            &cache,
            stores,
            self.options.flash_attn,
        )
        .with_backend(&self.backend)
        .with_cpu_kernels(kernels)
        .with_graph(&graph);
        let outputs = build(&g);
        // Outputs are made contiguous f32 so they read back in one copy.
        let outputs: Vec<Tensor<'_>> = outputs
            .into_iter()
            .map(|t| {
                let t = if t.ty() != DType::F32 {
                    ctx.cast(t, DType::F32)
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
        stores.check()?;
        // The cache destinations get their memory before the graph is planned, so they count
        // as held memory like the rest of the cache.
        let store_bytes = stores.allocate(&self.backend, &self.name)?;
        let read = || -> Result<Vec<HostTensor>, crate::ggml::GgmlError> {
            outputs
                .iter()
                .map(|t| {
                    Ok(HostTensor {
                        ne: t.ne(),
                        data: t.read_f32()?,
                    })
                })
                .collect()
        };

        let results = if self.plans() {
            let held = cache.bytes() + store_bytes;
            let results = graph_cut::execute(self, &g, &graph, &outputs, held, read)?;
            if let Some(r) = self.report.borrow().as_ref() {
                let c = r
                    .segments
                    .iter()
                    .map(|s| s.compute_bytes)
                    .max()
                    .unwrap_or(0);
                self.last_compute_bytes.set(c);
            }
            results
        } else {
            let mut galloc_slot = self.gallocr.borrow_mut();
            // Measure with a throwaway allocator: measuring marks an allocator as reserved
            // without giving it memory, so the one that allocates must not be the one measured.
            let needed = Gallocr::new(&self.backend)?.measure(&graph);
            let oversized = galloc_slot
                .as_ref()
                .is_some_and(|a| a.buffer_size() > needed.saturating_mul(2));
            if galloc_slot.is_none() || oversized {
                // (A much smaller graph than before, e.g. after a retry with smaller tiles:
                // start over so the oversized buffer is released.)
                *galloc_slot = Some(Gallocr::new(&self.backend)?);
            }
            let galloc = galloc_slot.as_mut().expect("allocator just created");
            let allocation = galloc.alloc(&graph)?;
            self.last_compute_bytes.set(allocation.buffer_size());
            for (t, name, data) in g.inputs.borrow().iter() {
                if t.is_allocated() {
                    write_input(*t, name, data)?;
                }
            }
            if profile::enabled() {
                profile::compute_profiled(&self.name, &self.backend, &graph)?;
            } else {
                self.backend.compute(&graph)?;
            }
            let results = read()?;
            drop(allocation);
            results
        };
        log::trace!("{}: graph of {} nodes", self.name, graph.n_nodes());
        Ok(results)
    }
}

/// Checks an input's length against its tensor and copies it in.
pub(crate) fn write_input(t: Tensor<'_>, name: &str, data: &InputData) -> Result<(), RunnerError> {
    let n = t.n_elements();
    let got = match data {
        InputData::F32(v) | InputData::F16(v) => v.len(),
        InputData::I32(v) => v.len(),
    };
    if got != n {
        return Err(RunnerError::InputSize {
            name: name.to_string(),
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
    Ok(())
}

/// Whether weight products on the CPU may use the blocked kernels: yes unless `SD_CLI_GEMM=ggml`
/// asks for ggml's own `mul_mat` (to compare the two).
fn blocked_gemm_wanted() -> bool {
    std::env::var_os("SD_CLI_GEMM").is_none_or(|v| v != "ggml")
}
