//! GGUF v3 writer (used by `-M convert` and by tests to make tiny models): metadata, tensor
//! infos, then the data, each tensor padded to the alignment. The file is written to a temporary
//! name in the same folder and renamed into place, so a failed write never leaves a partial file.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::Path;

use super::error::{Result, WeightsError};
use super::gguf::{
    align_up, GgufMetadata, GgufType, GgufValue, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS,
    MAX_NAME_BYTES,
};
use super::write_atomic;
use crate::dtype::DType;

/// One tensor declared in a [`GgufWriter`].
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorSpec {
    pub name: String,
    pub dtype: DType,
    /// ggml order (innermost first).
    pub ne: Vec<u64>,
    /// Data length in bytes.
    pub len: u64,
}

/// Builds a GGUF v3 file: metadata, tensor infos, aligned data. Used by `-M convert`.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    metadata: GgufMetadata,
    tensors: Vec<GgufTensorSpec>,
    names: HashSet<String>,
    alignment: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter {
            metadata: GgufMetadata::default(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
        }
    }

    fn err(key: &str, reason: String) -> WeightsError {
        WeightsError::Convert {
            key: key.to_string(),
            reason,
        }
    }

    /// Adds a metadata pair. `general.alignment` must be a power-of-two U32 and sets the
    /// alignment of the data written.
    pub fn add_kv(&mut self, key: impl Into<String>, value: GgufValue) -> Result<()> {
        let key = key.into();
        if let GgufValue::Array(elem, items) = &value {
            if *elem == GgufType::Array || items.iter().any(|v| v.ty() != *elem) {
                return Err(Self::err(
                    &key,
                    "array items must all have the element type and not be arrays".into(),
                ));
            }
        }
        if key == "general.alignment" {
            match value {
                GgufValue::U32(a) if a.is_power_of_two() => self.alignment = u64::from(a),
                _ => {
                    return Err(Self::err(
                        &key,
                        "alignment must be a power-of-two U32".into(),
                    ))
                }
            }
        }
        if !self.metadata.insert(key.clone(), value) {
            return Err(Self::err(&key, "duplicate metadata key".into()));
        }
        Ok(())
    }

    /// Declares a tensor (`ne` in ggml order); returns its index for the data callback.
    pub fn add_tensor(&mut self, name: &str, dtype: DType, ne: &[u64]) -> Result<usize> {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(Self::err(
                name,
                format!("name must have 1..={MAX_NAME_BYTES} bytes"),
            ));
        }
        if ne.is_empty() || ne.len() > MAX_DIMS || ne.iter().any(|&d| d == 0 || d > i64::MAX as u64)
        {
            return Err(Self::err(name, format!("invalid shape {ne:?}")));
        }
        let len = dtype
            .nbytes(ne)
            .ok_or_else(|| Self::err(name, format!("shape {ne:?} does not fit {dtype}")))?;
        if !self.names.insert(name.to_string()) {
            return Err(Self::err(name, "duplicate tensor name".into()));
        }
        self.tensors.push(GgufTensorSpec {
            name: name.to_string(),
            dtype,
            ne: ne.to_vec(),
            len,
        });
        Ok(self.tensors.len() - 1)
    }

    pub fn tensors(&self) -> &[GgufTensorSpec] {
        &self.tensors
    }

    /// Writes the file atomically (temp file in the same folder, then rename). `data(i)` returns
    /// the bytes of tensor `i`, which must be exactly its declared length.
    pub fn write_with<'d, F>(&self, path: &Path, mut data: F) -> Result<()>
    where
        F: FnMut(usize) -> Result<Cow<'d, [u8]>>,
    {
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_str(&mut head, k);
            head.extend_from_slice(&(v.ty() as u32).to_le_bytes());
            put_value(&mut head, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &d in &t.ne {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.dtype.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = align_up(offset + t.len, self.alignment)
                .ok_or_else(|| Self::err(&t.name, "file too large".into()))?;
        }
        let pad = |n: u64| (align_up(n, self.alignment).unwrap_or(n) - n) as usize;
        head.resize(head.len() + pad(head.len() as u64), 0);
        write_atomic(path, |w| {
            w.put(&head)?;
            for (i, t) in self.tensors.iter().enumerate() {
                let bytes = data(i)?;
                if bytes.len() as u64 != t.len {
                    return Err(WeightsError::ShapeMismatch {
                        path: path.to_path_buf(),
                        key: t.name.clone(),
                        reason: format!(
                            "{} bytes given, {} {:?} needs {}",
                            bytes.len(),
                            t.dtype,
                            t.ne,
                            t.len
                        ),
                    });
                }
                w.put(&bytes)?;
                w.put(&vec![0u8; pad(t.len)])?;
            }
            Ok(())
        })
    }

    /// Writes with data already in memory: `data[i]` belongs to the i-th declared tensor.
    pub fn write(&self, path: &Path, data: &[&[u8]]) -> Result<()> {
        if data.len() != self.tensors.len() {
            return Err(Self::err(
                "",
                format!(
                    "{} data buffers for {} tensors",
                    data.len(),
                    self.tensors.len()
                ),
            ));
        }
        self.write_with(path, |i| Ok(Cow::Borrowed(data[i])))
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    use GgufValue as V;
    match v {
        V::U8(x) => out.push(*x),
        V::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::Bool(x) => out.push(u8::from(*x)),
        V::String(s) => put_str(out, s),
        V::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::Array(elem, items) => {
            out.extend_from_slice(&(*elem as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
