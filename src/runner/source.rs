//! Where weight bytes come from: anything that maps a tensor name to a typed, shaped blob.
//!
//! Model files implement this through the weights store; tests and the demo model use the
//! in-memory [`MemorySource`].

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::dtype::DType;
use crate::ggml::dequantize_rows;
use crate::tensor::Ne;
use crate::weights::{SourceDType, TensorStore};

/// Converts a tensor's raw bytes to f32 values (or says why it cannot).
pub type ToF32<'a> = Box<dyn Fn(&[u8]) -> Result<Vec<f32>, String> + 'a>;

/// One tensor as a source sees it.
pub struct SourceTensor<'a> {
    /// Shape in ggml order.
    pub ne: Ne,
    /// Number of meaningful dimensions (1..=4).
    pub n_dims: usize,
    /// The ggml type of `bytes`, when the bytes are already in a ggml layout.
    pub ggml_type: Option<DType>,
    /// Raw bytes (ggml layout when `ggml_type` is set).
    pub bytes: Cow<'a, [u8]>,
    /// Converts the bytes to f32 (needed for conversions and for non-ggml source types).
    pub to_f32: ToF32<'a>,
    /// Human-readable origin for error messages ("vae.safetensors").
    pub origin: String,
}

/// A named collection of tensors.
pub trait WeightSource {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>>;
    fn contains(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }
    /// Short description of the source for errors.
    fn describe(&self) -> String;
    /// Called with a tensor's borrowed bytes once they were copied out; sources backed by a
    /// file map drop those pages from memory.
    fn release(&self, _bytes: &[u8]) {}
}

/// f32 tensors held in memory (tests, demo models).
#[derive(Default, Clone)]
pub struct MemorySource {
    tensors: BTreeMap<String, (Ne, usize, Vec<f32>)>,
}

fn f32_from_le(bytes: &[u8]) -> Result<Vec<f32>, String> {
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

impl MemorySource {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `data` under `name` with ggml-order shape `ne` (rank = count of leading dims
    /// up to the last non-1 one, at least 1).
    pub fn insert(&mut self, name: impl Into<String>, ne: Ne, data: Vec<f32>) {
        let n_dims = ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        self.tensors.insert(name.into(), (ne, n_dims, data));
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

impl WeightSource for MemorySource {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        let (ne, n_dims, data) = self.tensors.get(name)?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Some(SourceTensor {
            ne: *ne,
            n_dims: *n_dims,
            ggml_type: Some(DType::F32),
            bytes: Cow::Owned(bytes),
            to_f32: Box::new(f32_from_le),
            origin: "memory".into(),
        })
    }

    fn describe(&self) -> String {
        "in-memory weights".into()
    }
}

/// Tensors of a [`TensorStore`] under one name prefix (a model component).
pub struct StoreSource<'s> {
    store: &'s TensorStore,
    prefix: String,
}

impl<'s> StoreSource<'s> {
    /// Looks names up as `prefix + name`.
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        Self {
            store,
            prefix: prefix.to_string(),
        }
    }
}

impl WeightSource for StoreSource<'_> {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        let full = format!("{}{}", self.prefix, name);
        let info = self.store.get(&full)?;
        let origin = self.store.files().get(info.file).map_or_else(
            || "model file".to_string(),
            |f| f.path.display().to_string(),
        );
        let (bytes, ggml_type) = match self.store.load_bytes(info) {
            Ok(b) => (b, DType::from_id(info.dtype.id())),
            Err(_) => (Cow::Borrowed(self.store.get_bytes(info).ok()?), None),
        };
        let source = info.source;
        let dtype = info.dtype;
        let n_per_row = info.ne[0];
        let to_f32 = move |b: &[u8]| -> Result<Vec<f32>, String> {
            match (dtype.is_quantized(), DType::from_id(dtype.id())) {
                (true, Some(t)) => dequantize_rows(t, b, n_per_row).map_err(|e| e.to_string()),
                _ => crate::weights::to_f32(SourceDType::Ggml(dtype), b)
                    .or_else(|_| crate::weights::to_f32(source, b))
                    .map_err(|e| e.to_string()),
            }
        };
        Some(SourceTensor {
            ne: info.ne,
            n_dims: info.n_dims,
            ggml_type,
            bytes,
            to_f32: Box::new(to_f32),
            origin,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.store.contains(&format!("{}{}", self.prefix, name))
    }

    fn describe(&self) -> String {
        let files: Vec<String> = self
            .store
            .files()
            .iter()
            .map(|f| f.path.display().to_string())
            .collect();
        files.join(", ")
    }

    fn release(&self, bytes: &[u8]) {
        self.store.release_mapped(bytes);
    }
}
