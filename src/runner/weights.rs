//! Declaring a model's weights by name and loading them onto a backend.
//!
//! A model's constructor walks its key tree with a [`WeightBuilder`] (`wb.pp("blocks").pp(3)`)
//! and declares each leaf with the shape it expects (ggml order). Declaration checks the name
//! and shape against the source; [`WeightLoader::finish`] then allocates one backend buffer and
//! copies (or converts) every declared tensor into it. The result, [`ModelWeights`], hands out
//! tensors by [`Param`] index while building graphs.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::time::Instant;

use super::adapters::{
    merge_patches, runtime_factors, AdapterMode, DeclaredWeight, RuntimeAdapter, RuntimeFactors,
    WeightAdapters, WeightPatch, WeightRole,
};
use super::error::RunnerError;
use super::source::{SourceTensor, WeightSource};
use crate::dtype::DType;
use crate::ggml::{quantize_rows, Arena, Backend, Tensor};
use crate::tensor::Ne;

/// Index of a declared weight inside its [`ModelWeights`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param(usize);

/// Which storage types a weight may have on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Matmul weights: any ggml type; the file's type is kept and `--type` may convert it.
    Any,
    /// Weights of ops that need a float kernel (convolutions): f32 or f16.
    Float,
    /// Small tensors used in element-wise ops (biases, norm scales, embeddings tables): f32.
    F32,
    /// A convolution kernel declared as the matrix [IC·KW·KH, OC] of
    /// `Context::conv_2d_matrix` (channel fastest); a file's [KW, KH, IC, OC] kernel is
    /// reordered into it on loading. Otherwise as [`Storage::Any`].
    Matrix,
}

struct Decl {
    name: String,
    ne: Ne,
    ty: DType,
    /// The file's [KW, KH, IC, OC] shape of a [`Storage::Matrix`] kernel whose rows are
    /// reordered channel-first on loading.
    conv_file_ne: Option<Ne>,
    role: WeightRole,
}

/// Collects weight declarations for one model from one source.
pub struct WeightLoader<'s> {
    source: &'s dyn WeightSource,
    wtype: Option<DType>,
    decls: RefCell<Vec<Decl>>,
    adapters: Option<&'s dyn WeightAdapters>,
}

impl<'s> WeightLoader<'s> {
    /// `wtype` is the `--type` conversion target for matmul weights, if any.
    pub fn new(source: &'s dyn WeightSource, wtype: Option<DType>) -> Self {
        Self {
            source,
            wtype,
            decls: RefCell::new(Vec::new()),
            adapters: None,
        }
    }

    /// Patches the declared weights with `adapters` (LoRA): merged while loading, or kept as
    /// run-time factors beside them, as the adapters' mode says.
    pub fn with_adapters(mut self, adapters: Option<&'s dyn WeightAdapters>) -> Self {
        self.adapters = adapters;
        self
    }

    /// A builder at the root of the key tree (or at `prefix`, when non-empty).
    pub fn root(&self, prefix: &str) -> WeightBuilder<'_, 's> {
        WeightBuilder {
            loader: self,
            path: prefix.trim_end_matches('.').to_string(),
        }
    }

    /// Allocates the declared weights on `backend` and copies their data in.
    pub fn finish(self, backend: &Backend, what: &str) -> Result<ModelWeights, RunnerError> {
        self.finish_placed(backend, what, false)
    }

    /// Like [`WeightLoader::finish`], but the weights live in host memory (pinned when the
    /// device offers it) and the runner copies them to `backend` segment by segment as
    /// graphs need them (`--offload-to-cpu`).
    pub fn finish_offloaded(
        self,
        backend: &Backend,
        what: &str,
    ) -> Result<ModelWeights, RunnerError> {
        self.finish_placed(backend, what, true)
    }

    /// [`WeightLoader::finish`] or [`WeightLoader::finish_offloaded`] as `memory` says.
    pub fn finish_for(
        self,
        backend: &Backend,
        what: &str,
        memory: &super::MemoryOptions,
    ) -> Result<ModelWeights, RunnerError> {
        self.finish_placed(backend, what, memory.offload_to_cpu)
    }

    fn finish_placed(
        self,
        backend: &Backend,
        what: &str,
        offload: bool,
    ) -> Result<ModelWeights, RunnerError> {
        let start = Instant::now();
        let mut decls = self.decls.into_inner();
        let declared: Vec<DeclaredWeight> = decls
            .iter()
            .map(|d| DeclaredWeight {
                name: d.name.clone(),
                ne: d.conv_file_ne.unwrap_or(d.ne),
                role: d.role,
            })
            .collect();
        // Adapted weights: merged ones load through f32 (their differences are read when the
        // weight loads, one weight's at a time); run-time ones get factor tensors.
        let mut merged = HashSet::new();
        let mut runtime = Vec::new();
        if let Some(adapters) = self.adapters {
            let mode = adapters.mode();
            for i in adapters.targets(&declared)? {
                if mode == AdapterMode::Runtime && declared[i].role != WeightRole::Plain {
                    let patches = adapters.patches(&declared, i)?;
                    if !patches.iter().any(|p| p.delta.needs_weight()) {
                        runtime.push((i, runtime_factors(&declared[i], &patches)));
                        continue;
                    }
                }
                merged.insert(i);
            }
        }
        let n_model = decls.len();
        let mut adapters = HashMap::new();
        let mut factor_data = Vec::new();
        for (i, factors) in runtime {
            let (weight_ty, role) = (decls[i].ty, decls[i].role);
            let mut add = |suffix: &str, ne: Ne, data: Vec<f32>| {
                decls.push(Decl {
                    name: format!("{}.{suffix}", decls[i].name),
                    ne,
                    ty: factor_type(weight_ty, role, ne[0]),
                    conv_file_ne: None,
                    role: WeightRole::Plain,
                });
                factor_data.push(data);
                decls.len() - 1
            };
            let adapter = match factors {
                RuntimeFactors::LowRank { down, up } => RuntimeAdapter::LowRank {
                    down: add("adapter_down", down.0, down.1),
                    up: add("adapter_up", up.0, up.1),
                },
                RuntimeFactors::Full(ne, delta) => RuntimeAdapter::Full {
                    delta: add("adapter_delta", ne, delta),
                },
            };
            adapters.insert(i, adapter);
        }
        let arena = Arena::new(decls.len().max(1))?;
        for d in &decls {
            arena
                .add(d.ty, d.ne, &d.name)
                .ok_or_else(|| RunnerError::Internal("weight arena full".into()))?;
        }
        if offload {
            arena.allocate_host(backend, what)?;
        } else {
            arena.allocate(backend, what)?;
        }
        let mut bytes_total = 0usize;
        for (i, d) in decls[..n_model].iter().enumerate() {
            let t = arena.get(i);
            let patches = match self.adapters {
                Some(a) if merged.contains(&i) => Some(a.patches(&declared, i)?),
                _ => None,
            };
            bytes_total += load_tensor(self.source, d, t, patches.as_deref())?;
        }
        for (k, data) in factor_data.iter().enumerate() {
            let d = &decls[n_model + k];
            let bytes = convert_f32(data, d.ty, d.ne[0]).map_err(RunnerError::Internal)?;
            arena.get(n_model + k).write_bytes(&bytes)?;
            bytes_total += bytes.len();
        }
        if !merged.is_empty() || !adapters.is_empty() {
            log::debug!(
                "{what}: adapters merged into {} weights, applied at run time to {}",
                merged.len(),
                adapters.len()
            );
        }
        let memory = arena.memory().map(|(name, _)| name).unwrap_or_default();
        log::debug!(
            "{what}: loaded {} tensors, {:.1} MiB {} {} ({memory}) in {:.2}s",
            decls.len(),
            bytes_total as f64 / (1024.0 * 1024.0),
            if offload { "in host memory for" } else { "on" },
            backend.name(),
            start.elapsed().as_secs_f64()
        );
        let index = (0..arena.len()).map(|i| (arena.get(i).id(), i)).collect();
        Ok(ModelWeights {
            arena,
            names: decls.into_iter().map(|d| d.name).collect(),
            bytes: bytes_total,
            offloaded: offload,
            index,
            adapters,
        })
    }

    fn declare(
        &self,
        name: String,
        want: Ne,
        storage: Storage,
        role: WeightRole,
    ) -> Result<Param, RunnerError> {
        let src = self
            .source
            .tensor(&name)
            .ok_or_else(|| RunnerError::MissingTensor {
                key: name.clone(),
                origin: self.source.describe(),
            })?;
        let flattened = storage == Storage::Matrix
            && want[2..] == [1, 1]
            && src.ne[0] * src.ne[1] * src.ne[2] == want[0]
            && src.ne[3] == want[1];
        if src.ne != want && !flattened {
            return Err(RunnerError::ShapeMismatch {
                key: name,
                origin: src.origin,
                expected: want,
                found: src.ne,
            });
        }
        let ty = choose_type(src.ggml_type, storage, self.wtype, want, src.n_dims);
        let conv_file_ne = (flattened && src.ne[0] * src.ne[1] > 1).then_some(src.ne);
        let mut decls = self.decls.borrow_mut();
        decls.push(Decl {
            name,
            ne: want,
            ty,
            conv_file_ne,
            role,
        });
        Ok(Param(decls.len() - 1))
    }
}

/// The storage type of a run-time adapter's factor for a weight of type `weight` (rows of
/// `ne0`): the weight's own float type, q8_0 for a quantized weight (so the factor's products
/// take the same fast kernels as the weight's), f32 for convolution kernels and where the
/// rows do not split into blocks.
fn factor_type(weight: DType, role: WeightRole, ne0: usize) -> DType {
    let ty = match role {
        WeightRole::Conv { .. } | WeightRole::Plain => DType::F32,
        WeightRole::Linear if weight.is_quantized() => DType::Q8_0,
        WeightRole::Linear => weight,
    };
    if ty.row_bytes(ne0).is_some() {
        ty
    } else {
        DType::F32
    }
}

/// Decides the device type of a weight from its file type, its role and `--type`.
fn choose_type(
    file: Option<DType>,
    storage: Storage,
    wtype: Option<DType>,
    ne: Ne,
    n_dims: usize,
) -> DType {
    match storage {
        Storage::F32 => DType::F32,
        Storage::Float => match file {
            Some(t) if t == DType::F32 || t == DType::F16 => t,
            Some(_) => DType::F32,
            None => DType::F16,
        },
        Storage::Any | Storage::Matrix => {
            // `--type` converts only matrices whose rows split into whole blocks.
            if let Some(w) = wtype {
                if n_dims >= 2 && w.row_bytes(ne[0]).is_some() && w.can_quantize_from_f32() {
                    return w;
                }
            }
            file.unwrap_or(DType::F16)
        }
    }
}

fn load_tensor(
    source: &dyn WeightSource,
    d: &Decl,
    t: Tensor<'_>,
    patches: Option<&[WeightPatch]>,
) -> Result<usize, RunnerError> {
    let src = source
        .tensor(&d.name)
        .ok_or_else(|| RunnerError::MissingTensor {
            key: d.name.clone(),
            origin: source.describe(),
        })?;
    if patches.is_none() && d.conv_file_ne.is_none() {
        if let Some(bytes) = load_in_chunks(source, d, t, &src)? {
            return Ok(bytes);
        }
    }
    if src.ggml_type == Some(d.ty) && d.conv_file_ne.is_none() && patches.is_none() {
        if src.bytes.len() != t.n_bytes() {
            return Err(RunnerError::BadData {
                key: d.name.clone(),
                origin: src.origin,
                reason: format!(
                    "{} bytes for a tensor of {} bytes",
                    src.bytes.len(),
                    t.n_bytes()
                ),
            });
        }
        t.write_bytes(&src.bytes)?;
        if let Cow::Borrowed(b) = &src.bytes {
            source.release(b);
        }
        return Ok(src.bytes.len());
    }
    let mut values = (src.to_f32)(&src.bytes).map_err(|reason| RunnerError::BadData {
        key: d.name.clone(),
        origin: src.origin.clone(),
        reason,
    })?;
    if let Some(patches) = patches {
        let rows = d.conv_file_ne.unwrap_or(d.ne);
        let dims = rows.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1);
        let n_rows = rows[dims - 1].max(1);
        if values.len() % n_rows != 0 {
            return Err(RunnerError::BadData {
                key: d.name.clone(),
                origin: src.origin,
                reason: format!("{} values for shape {rows:?}", values.len()),
            });
        }
        let cols = values.len() / n_rows;
        merge_patches(&mut values, cols, patches);
    }
    if let Some(file_ne) = d.conv_file_ne {
        if values.len() != file_ne.iter().product::<usize>() {
            return Err(RunnerError::BadData {
                key: d.name.clone(),
                origin: src.origin,
                reason: format!("{} values for a kernel of shape {file_ne:?}", values.len()),
            });
        }
        values = channels_first_taps(&values, file_ne);
    }
    let bytes = convert_f32(&values, d.ty, d.ne[0]).map_err(|reason| RunnerError::BadData {
        key: d.name.clone(),
        origin: src.origin,
        reason,
    })?;
    t.write_bytes(&bytes)?;
    if let Cow::Borrowed(b) = &src.bytes {
        source.release(b);
    }
    Ok(bytes.len())
}

/// Output bytes converted per piece when a weight loads in pieces.
const LOAD_CHUNK_BYTES: usize = 8 << 20;

/// Copies or converts a weight whose file shape is its own shape a few rows at a time,
/// dropping each piece's mapped file pages once written: a load then holds at most one piece
/// beside the weights (not the file's copy and an f32 copy of the largest tensor, which for
/// SD3's 906 MB position grid was most of the peak). `None` when the file bytes do not split
/// into whole rows (the caller converts the tensor whole and reports what is wrong).
fn load_in_chunks(
    source: &dyn WeightSource,
    d: &Decl,
    t: Tensor<'_>,
    src: &SourceTensor<'_>,
) -> Result<Option<usize>, RunnerError> {
    let ne0 = d.ne[0].max(1);
    let n_rows = d.ne.iter().product::<usize>() / ne0;
    let Some(out_row) = d.ty.row_bytes(ne0) else {
        return Ok(None);
    };
    if src.ne != d.ne
        || n_rows == 0
        || !src.bytes.len().is_multiple_of(n_rows)
        || out_row * n_rows != t.n_bytes()
    {
        return Ok(None);
    }
    let in_row = src.bytes.len() / n_rows;
    let same = src.ggml_type == Some(d.ty);
    if same && in_row != out_row {
        return Ok(None);
    }
    let rows_per_piece = (LOAD_CHUNK_BYTES / (ne0 * 4).max(out_row)).max(1);
    let bad = |reason: String| RunnerError::BadData {
        key: d.name.clone(),
        origin: src.origin.clone(),
        reason,
    };
    let mut row = 0;
    while row < n_rows {
        let rows = rows_per_piece.min(n_rows - row);
        let piece = &src.bytes[row * in_row..(row + rows) * in_row];
        if same {
            t.write_bytes_at(row * out_row, piece)?;
        } else {
            let values = (src.to_f32)(piece).map_err(bad)?;
            if values.len() != rows * ne0 {
                return Err(bad(format!(
                    "{} values in rows {row}..{} of {n_rows} rows of {ne0}",
                    values.len(),
                    row + rows
                )));
            }
            let bytes = convert_f32(&values, d.ty, ne0).map_err(bad)?;
            t.write_bytes_at(row * out_row, &bytes)?;
        }
        if let Cow::Borrowed(b) = &src.bytes {
            source.release(&b[row * in_row..(row + rows) * in_row]);
        }
        row += rows;
    }
    Ok(Some(out_row * n_rows))
}

/// A [KW, KH, IC, OC] kernel (ggml order, KW fastest) as the [IC·KW·KH, OC] matrix whose
/// rows run channel fastest, then column, then row.
fn channels_first_taps(values: &[f32], [kw, kh, ic, oc]: Ne) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for o in 0..oc {
        for c in 0..ic {
            for y in 0..kh {
                for x in 0..kw {
                    let from = x + kw * (y + kh * (c + ic * o));
                    let to = c + ic * (x + kw * (y + kh * o));
                    out[to] = values[from];
                }
            }
        }
    }
    out
}

/// Packs f32 values as `ty` (plain casts for float types, ggml quantization otherwise).
pub fn convert_f32(values: &[f32], ty: DType, ne0: usize) -> Result<Vec<u8>, String> {
    if ty == DType::F32 {
        Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    } else if ty == DType::F16 {
        Ok(values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect())
    } else if ty == DType::BF16 {
        Ok(values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect())
    } else {
        quantize_rows(ty, values, ne0).map_err(|e| e.to_string())
    }
}

/// A cursor into the weight key tree.
#[derive(Clone)]
pub struct WeightBuilder<'l, 's> {
    loader: &'l WeightLoader<'s>,
    path: String,
}

impl<'l, 's> WeightBuilder<'l, 's> {
    /// A child path: `pp("blocks").pp(3)` → `blocks.3`.
    pub fn pp(&self, name: impl Display) -> Self {
        let name = name.to_string();
        Self {
            loader: self.loader,
            path: if self.path.is_empty() {
                name
            } else {
                format!("{}.{}", self.path, name)
            },
        }
    }

    /// The full key of `name` under this path.
    pub fn key(&self, name: &str) -> String {
        self.pp(name).path
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Declares a required weight with shape `ne` (ggml order).
    pub fn get(&self, name: &str, ne: Ne, storage: Storage) -> Result<Param, RunnerError> {
        self.loader
            .declare(self.key(name), ne, storage, WeightRole::Plain)
    }

    /// Like [`WeightBuilder::get`] for a weight the model uses as `role` (a `Linear` or
    /// `Conv2d` weight, which run-time adapters attach to).
    pub fn get_as(
        &self,
        name: &str,
        ne: Ne,
        storage: Storage,
        role: WeightRole,
    ) -> Result<Param, RunnerError> {
        self.loader.declare(self.key(name), ne, storage, role)
    }

    /// Declares a weight that may be absent.
    pub fn maybe(
        &self,
        name: &str,
        ne: Ne,
        storage: Storage,
    ) -> Result<Option<Param>, RunnerError> {
        if self.contains(name) {
            self.get(name, ne, storage).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.loader.source.contains(&self.key(name))
    }

    /// The shape of `name` in the source, for config detection.
    pub fn source_ne(&self, name: &str) -> Option<Ne> {
        self.loader.source.tensor(&self.key(name)).map(|t| t.ne)
    }

    /// The source shape of `name`, or an error naming it as missing from `origin` (what a
    /// config detector reads its sizes from).
    pub fn require_ne(&self, name: &str, origin: &str) -> Result<Ne, RunnerError> {
        self.source_ne(name)
            .ok_or_else(|| RunnerError::MissingTensor {
                key: self.key(name),
                origin: origin.into(),
            })
    }

    /// An error saying why `name` in `origin` cannot be used.
    pub fn bad_data(&self, name: &str, origin: &str, reason: String) -> RunnerError {
        RunnerError::BadData {
            key: self.key(name),
            origin: origin.into(),
            reason,
        }
    }
}

/// A run-time adapter's tensors.
pub(crate) enum AdapterTensors<'a> {
    LowRank { down: Tensor<'a>, up: Tensor<'a> },
    Full(Tensor<'a>),
}

/// A model's weights, in one backend buffer (or one host buffer when offloaded).
pub struct ModelWeights {
    /// The weights and their memory (the arena releases device replicas, re-binding its
    /// tensors to host memory, before its own buffer goes).
    arena: Arena,
    names: Vec<String>,
    bytes: usize,
    offloaded: bool,
    /// Tensor identity → parameter index, for the graph-cut planner.
    index: HashMap<usize, usize>,
    /// Run-time adapters by the index of the weight they adapt.
    adapters: HashMap<usize, RuntimeAdapter>,
}

impl ModelWeights {
    pub fn tensor(&self, p: Param) -> Tensor<'_> {
        self.arena.get(p.0)
    }

    /// The run-time adapter of weight `p`, as (down, up) factors or one full difference.
    pub(crate) fn adapter(&self, p: Param) -> Option<AdapterTensors<'_>> {
        Some(match self.adapters.get(&p.0)? {
            RuntimeAdapter::LowRank { down, up } => AdapterTensors::LowRank {
                down: self.arena.get(*down),
                up: self.arena.get(*up),
            },
            RuntimeAdapter::Full { delta } => AdapterTensors::Full(self.arena.get(*delta)),
        })
    }

    /// The full key a parameter was declared under.
    pub fn name(&self, p: Param) -> &str {
        &self.names[p.0]
    }

    /// Whether some matrix weight is bf16 or quantized: products with it round their
    /// activations to bf16 or 8 bits on the CPU, so attention may round its operands to bf16
    /// under `--fa` without coarsening the model's arithmetic.
    pub fn rounds_products(&self) -> bool {
        (0..self.arena.len()).any(|i| {
            let t = self.arena.get(i);
            t.ne()[1] > 1 && (t.ty() == DType::BF16 || t.ty().is_quantized())
        })
    }

    /// Total bytes of weight data (on the device, or in host memory when offloaded).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the weights live in host memory and are copied to the device on demand.
    pub fn is_offloaded(&self) -> bool {
        self.offloaded
    }

    /// Where the weights live: the memory type's name (`CPU`, `Vulkan0`, `Vulkan_Host`, ...)
    /// and whether it is host memory.
    pub fn memory(&self) -> (String, bool) {
        self.arena.memory().unwrap_or_default()
    }

    /// Bytes the weights occupy on the device for good (0 when offloaded).
    pub fn device_bytes(&self) -> usize {
        if self.offloaded {
            0
        } else {
            self.bytes
        }
    }

    /// The parameter index of a tensor of this set, by identity.
    pub(crate) fn index_of(&self, id: usize) -> Option<usize> {
        self.index.get(&id).copied()
    }

    pub(crate) fn arena(&self) -> &Arena {
        &self.arena
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}
