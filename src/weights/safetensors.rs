//! safetensors: a validating header parser, the sharded `*.safetensors.index.json` parser, and a
//! small writer (used by tests and tools to make tiny models).
//!
//! Layout: `u64 LE n`, then `n` bytes of JSON, then the data section. The JSON object maps tensor
//! names to `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the data section)
//! and may hold `__metadata__`, a string → string map. The parser works on the file's bytes (a
//! memory map) and trusts nothing in them: lengths are checked against the file before use.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Component, Path};

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::dtype::SourceDType;
use super::error::{Result, WeightsError};
use super::write_atomic;

/// Largest JSON header accepted (the limit of the reference `safetensors` crate).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct SafetensorsEntry {
    pub name: String,
    pub dtype: SourceDType,
    /// PyTorch order (outermost first), as written in the file.
    pub shape: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte length of the data.
    pub len: u64,
}

/// A parsed and validated safetensors header.
#[derive(Debug, Clone, Default)]
pub struct SafetensorsHeader {
    /// `__metadata__` (string values only; other values are skipped with a warning).
    pub metadata: BTreeMap<String, String>,
    /// Tensors in header order.
    pub tensors: Vec<SafetensorsEntry>,
    /// Absolute offset of the data section.
    pub data_start: u64,
}

/// A JSON object with its keys in file order, duplicates kept (serde_json's `Map` would silently
/// keep only the last of a duplicated key, which hides a corrupt or hostile header).
pub(crate) struct OrderedObject(pub Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedObject;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                // The size hint comes from the input; cap it so it cannot drive allocation.
                let mut items = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    items.push((k, v));
                }
                Ok(OrderedObject(items))
            }
        }
        d.deserialize_map(V)
    }
}

impl OrderedObject {
    /// Parses `text` as an object, rejecting duplicate keys.
    pub(crate) fn parse(text: &[u8], path: &Path) -> Result<OrderedObject> {
        let obj: OrderedObject =
            serde_json::from_slice(text).map_err(|e| WeightsError::BadJson {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        let mut seen = HashSet::with_capacity(obj.0.len());
        for (k, _) in &obj.0 {
            if !seen.insert(k.as_str()) {
                return Err(WeightsError::Duplicate {
                    path: path.to_path_buf(),
                    key: k.clone(),
                });
            }
        }
        Ok(obj)
    }
}

fn read_u64_le(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

/// Parses and validates the header of a safetensors file whose full contents are `bytes`.
pub fn parse_safetensors(bytes: &[u8], path: &Path) -> Result<SafetensorsHeader> {
    let p = || path.to_path_buf();
    let file_len = bytes.len() as u64;
    let header_len = read_u64_le(bytes, 0).ok_or_else(|| WeightsError::Truncated {
        path: p(),
        what: "the 8-byte header length".into(),
    })?;
    if header_len > MAX_HEADER_LEN {
        return Err(WeightsError::HeaderTooLarge {
            path: p(),
            len: header_len,
            limit: MAX_HEADER_LEN,
        });
    }
    if header_len > file_len - 8 {
        return Err(WeightsError::Truncated {
            path: p(),
            what: format!(
                "the JSON header (it declares {header_len} bytes, {} remain)",
                file_len - 8
            ),
        });
    }
    let data_start = 8 + header_len;
    let data_len = file_len - data_start;
    // header_len <= file_len fits in usize because `bytes` exists.
    let json = &bytes[8..data_start as usize];
    let obj = OrderedObject::parse(json, path)?;

    let mut header = SafetensorsHeader {
        data_start,
        ..Default::default()
    };
    for (key, value) in obj.0 {
        if key == "__metadata__" {
            header.metadata = parse_metadata(value, path)?;
            continue;
        }
        let entry = parse_entry(&key, &value, path, data_start, data_len)?;
        header.tensors.push(entry);
    }
    check_overlaps(&header.tensors, path)?;
    Ok(header)
}

fn parse_metadata(value: Value, path: &Path) -> Result<BTreeMap<String, String>> {
    let Value::Object(map) = value else {
        return Err(WeightsError::BadHeader {
            path: path.to_path_buf(),
            key: "__metadata__".into(),
            reason: "expected an object of strings".into(),
        });
    };
    let mut out = BTreeMap::new();
    for (k, v) in map {
        match v {
            Value::String(s) => {
                out.insert(k, s);
            }
            // stable-diffusion.cpp ignores such values too; they carry nothing we use.
            other => log::warn!(
                "{}: skipping non-string __metadata__ value '{k}' ({})",
                path.display(),
                json_kind(&other)
            ),
        }
    }
    Ok(out)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn parse_entry(
    key: &str,
    value: &Value,
    path: &Path,
    data_start: u64,
    data_len: u64,
) -> Result<SafetensorsEntry> {
    let bad = |reason: &str| WeightsError::BadHeader {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: reason.to_string(),
    };
    let obj = value
        .as_object()
        .ok_or_else(|| bad("expected an object with dtype, shape and data_offsets"))?;
    let dtype_str = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing or non-string 'dtype'"))?;
    let dtype =
        SourceDType::from_safetensors(dtype_str).ok_or_else(|| WeightsError::UnknownDType {
            path: path.to_path_buf(),
            key: key.to_string(),
            dtype: dtype_str.to_string(),
        })?;
    let shape_val = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing or non-array 'shape'"))?;
    let mut shape = Vec::with_capacity(shape_val.len().min(16));
    for d in shape_val {
        let n = d.as_u64().ok_or_else(|| WeightsError::BadShape {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: format!("dimension {d} is not a non-negative integer"),
        })?;
        shape.push(n);
    }
    let offsets = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("missing or non-array 'data_offsets'"))?;
    let (begin, end) = match offsets.as_slice() {
        [b, e] => (
            b.as_u64()
                .ok_or_else(|| bad("data_offsets must be non-negative integers"))?,
            e.as_u64()
                .ok_or_else(|| bad("data_offsets must be non-negative integers"))?,
        ),
        _ => return Err(bad("data_offsets must have exactly two entries")),
    };
    if begin > end || end > data_len {
        return Err(WeightsError::OffsetOutOfBounds {
            path: path.to_path_buf(),
            key: key.to_string(),
            begin,
            end,
            limit: data_len,
        });
    }
    let numel = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| WeightsError::BadShape {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: format!("element count of {shape:?} overflows"),
        })?;
    let elem = u64::from(dtype.elem_size().unwrap_or(1));
    let want = numel
        .checked_mul(elem)
        .ok_or_else(|| WeightsError::BadShape {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: format!("byte size of {shape:?} x {elem} overflows"),
        })?;
    // ggml keeps sizes in int64 and strides in size_t: an empty tensor's other dimensions must
    // keep the byte strides in range too (e.g. shape [0, 2^62] holds no data but is not loadable).
    let strided = shape
        .iter()
        .try_fold(elem, |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&n| n <= i64::MAX as u64);
    if strided.is_none() {
        return Err(WeightsError::BadShape {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: format!("dimensions {shape:?} exceed ggml's limits"),
        });
    }
    if want != end - begin {
        return Err(WeightsError::ShapeMismatch {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: format!(
                "shape {shape:?} of {} needs {want} bytes but data_offsets span {}",
                dtype.name(),
                end - begin
            ),
        });
    }
    Ok(SafetensorsEntry {
        name: key.to_string(),
        dtype,
        shape,
        offset: data_start + begin,
        len: end - begin,
    })
}

/// Rejects overlapping byte ranges (empty tensors overlap nothing).
pub(crate) fn check_overlaps(entries: &[SafetensorsEntry], path: &Path) -> Result<()> {
    let ranges: Vec<(u64, u64, &str)> = entries
        .iter()
        .map(|e| (e.offset, e.len, e.name.as_str()))
        .collect();
    check_ranges(ranges, path)
}

/// Shared by the GGUF reader: `(offset, len, name)` ranges must not overlap.
pub(crate) fn check_ranges(mut ranges: Vec<(u64, u64, &str)>, path: &Path) -> Result<()> {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable_by_key(|r| r.0);
    for pair in ranges.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // a.0 + a.1 was bounds-checked against the file size, so it does not overflow.
        if a.0 + a.1 > b.0 {
            return Err(WeightsError::Overlap {
                path: path.to_path_buf(),
                key: a.2.to_string(),
                other: b.2.to_string(),
            });
        }
    }
    Ok(())
}

/// A parsed `model.safetensors.index.json`.
#[derive(Debug, Clone)]
pub struct SafetensorsIndex {
    /// The index's `metadata` object (often `{"total_size": N}`), `Null` when absent.
    pub metadata: Value,
    /// Tensor name → shard file name, in file order.
    pub weight_map: Vec<(String, String)>,
}

impl SafetensorsIndex {
    /// Distinct shard file names in first-seen order.
    pub fn shards(&self) -> Vec<&str> {
        let mut seen = HashSet::new();
        self.weight_map
            .iter()
            .map(|(_, f)| f.as_str())
            .filter(|f| seen.insert(*f))
            .collect()
    }
}

/// Largest index file read (real ones are well under 1 MB).
pub const MAX_INDEX_LEN: u64 = 64 << 20;

/// Parses an index file's bytes. Shard names must be plain relative paths inside the index's
/// folder (no `..`, no absolute paths), so a hostile index cannot point outside it.
pub fn parse_index(bytes: &[u8], path: &Path) -> Result<SafetensorsIndex> {
    let bad = |reason: String| WeightsError::BadIndex {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() as u64 > MAX_INDEX_LEN {
        return Err(WeightsError::HeaderTooLarge {
            path: path.to_path_buf(),
            len: bytes.len() as u64,
            limit: MAX_INDEX_LEN,
        });
    }
    #[derive(Deserialize)]
    struct RawIndex {
        #[serde(default)]
        metadata: Value,
        weight_map: OrderedObject,
    }
    let raw: RawIndex = serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => bad(e.to_string()),
        _ => WeightsError::BadJson {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    })?;
    let (metadata, map) = (raw.metadata, raw.weight_map);
    let mut seen = HashSet::with_capacity(map.0.len());
    if let Some((dup, _)) = map.0.iter().find(|(k, _)| !seen.insert(k.as_str())) {
        return Err(WeightsError::Duplicate {
            path: path.to_path_buf(),
            key: dup.clone(),
        });
    }
    let mut out = Vec::with_capacity(map.0.len());
    for (name, file) in map.0 {
        let Value::String(file) = file else {
            return Err(bad(format!("shard of '{name}' is not a string")));
        };
        let rel = Path::new(&file);
        let plain = !file.is_empty() && rel.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(bad(format!(
                "shard path '{file}' of '{name}' must stay inside the index's folder"
            )));
        }
        out.push((name, file));
    }
    Ok(SafetensorsIndex {
        metadata,
        weight_map: out,
    })
}

/// One tensor to write with [`write_safetensors`]. `shape` is PyTorch order (outermost first).
#[derive(Debug, Clone, Copy)]
pub struct SafetensorsItem<'a> {
    pub name: &'a str,
    /// Safetensors dtype string, e.g. "F32", "F16", "BF16", "I64", "F8_E4M3".
    pub dtype: &'a str,
    pub shape: &'a [u64],
    pub data: &'a [u8],
}

/// Writes a safetensors file atomically (temp file + rename). Checks that every item's data
/// length matches its dtype and shape and that names are unique.
pub fn write_safetensors(
    path: &Path,
    metadata: &BTreeMap<String, String>,
    items: &[SafetensorsItem<'_>],
) -> Result<()> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let m: serde_json::Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let mut offset = 0u64;
    for item in items {
        let dtype = SourceDType::from_safetensors(item.dtype).ok_or_else(|| {
            WeightsError::UnknownDType {
                path: path.to_path_buf(),
                key: item.name.to_string(),
                dtype: item.dtype.to_string(),
            }
        })?;
        let want = item
            .shape
            .iter()
            .try_fold(u64::from(dtype.elem_size().unwrap_or(1)), |a, &d| {
                a.checked_mul(d)
            });
        if want != Some(item.data.len() as u64) {
            return Err(WeightsError::ShapeMismatch {
                path: path.to_path_buf(),
                key: item.name.to_string(),
                reason: format!(
                    "{} bytes given for shape {:?} of {}",
                    item.data.len(),
                    item.shape,
                    item.dtype
                ),
            });
        }
        let end = offset + item.data.len() as u64;
        let entry = serde_json::json!({
            "dtype": item.dtype,
            "shape": item.shape,
            "data_offsets": [offset, end],
        });
        if header.insert(item.name.to_string(), entry).is_some() || item.name == "__metadata__" {
            return Err(WeightsError::Duplicate {
                path: path.to_path_buf(),
                key: item.name.to_string(),
            });
        }
        offset = end;
    }
    let mut json =
        serde_json::to_vec(&Value::Object(header)).map_err(|e| WeightsError::BadJson {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    // Pad the header with spaces so the data section starts 8-byte aligned (as the Python
    // writer does).
    while (8 + json.len()) % 8 != 0 {
        json.push(b' ');
    }
    write_atomic(path, |w| {
        w.put(&(json.len() as u64).to_le_bytes())?;
        w.put(&json)?;
        for item in items {
            w.put(item.data)?;
        }
        Ok(())
    })
}
