//! GGUF v2/v3: a validating reader (our own, not ggml's) and an atomic writer.
//!
//! Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv
//! key/value pairs (string key, u32 type, value), then n_tensors infos (string name, u32 n_dims,
//! u64 ne[n_dims], u32 ggml type, u64 offset relative to the data section), padding to
//! `general.alignment` (default 32), and the data section. Every count and length read from the
//! file is checked against the bytes that remain before anything is allocated for it.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::error::{Result, WeightsError};
pub use super::gguf_writer::{GgufTensorSpec, GgufWriter};
use super::safetensors::check_ranges;
use crate::dtype::DType;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Upper bound on tensors per file (real models have < 10^4).
pub const MAX_TENSORS: u64 = 1 << 20;
/// Upper bound on key/value pairs per file.
pub const MAX_KV: u64 = 1 << 16;
/// ggml's `GGML_MAX_NAME` (64, including the NUL): names may have at most 63 bytes.
/// Longest tensor name accepted. The GGUF spec says 64 bytes, but stable-diffusion.cpp builds
/// ggml with 128-byte names and writes files with longer names (T5 keys under their
/// component prefix); we keep names on the Rust side, so we read and write up to its limit.
pub const MAX_NAME_BYTES: usize = 127;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;

/// GGUF metadata value types (ids as in `enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgufType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufType {
    pub fn from_id(id: u32) -> Option<GgufType> {
        use GgufType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Smallest encoded size of one value (a string is at least its 8-byte length).
    fn min_size(self) -> u64 {
        use GgufType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// Strings are decoded lossily: invalid UTF-8 becomes U+FFFD (tokenizer vocabularies in the
    /// wild occasionally hold raw bytes).
    String(String),
    /// Element type and items (nested arrays are rejected by the reader).
    Array(GgufType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn ty(&self) -> GgufType {
        use GgufValue::*;
        match self {
            U8(_) => GgufType::U8,
            I8(_) => GgufType::I8,
            U16(_) => GgufType::U16,
            I16(_) => GgufType::I16,
            U32(_) => GgufType::U32,
            I32(_) => GgufType::I32,
            F32(_) => GgufType::F32,
            Bool(_) => GgufType::Bool,
            String(_) => GgufType::String,
            Array(..) => GgufType::Array,
            U64(_) => GgufType::U64,
            I64(_) => GgufType::I64,
            F64(_) => GgufType::F64,
        }
    }

    /// Any integer value as i128 (so every integer type converts losslessly).
    fn as_int(&self) -> Option<i128> {
        use GgufValue::*;
        Some(match *self {
            U8(v) => v.into(),
            I8(v) => v.into(),
            U16(v) => v.into(),
            I16(v) => v.into(),
            U32(v) => v.into(),
            I32(v) => v.into(),
            U64(v) => v.into(),
            I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Integer value converted to u32 when it fits (any integer type).
    pub fn as_u32(&self) -> Option<u32> {
        self.as_int().and_then(|v| u32::try_from(v).ok())
    }
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }
    pub fn as_i32(&self) -> Option<i32> {
        self.as_int().and_then(|v| i32::try_from(v).ok())
    }
    pub fn as_i64(&self) -> Option<i64> {
        self.as_int().and_then(|v| i64::try_from(v).ok())
    }
    /// F32 or F64 (narrowed) values.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(_, items) => Some(items),
            _ => None,
        }
    }
}

/// Ordered GGUF key/value metadata with typed getters.
#[derive(Debug, Clone, Default)]
pub struct GgufMetadata {
    entries: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
}

impl GgufMetadata {
    /// Adds a pair; `false` (and nothing added) when the key already exists.
    pub fn insert(&mut self, key: String, value: GgufValue) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }
    /// Pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }
    pub fn get_i32(&self, key: &str) -> Option<i32> {
        self.get(key)?.as_i32()
    }
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }
    /// A string array (`None` if absent, not an array, or any item is not a string).
    pub fn get_arr_str(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(GgufValue::as_str)
            .collect()
    }
    pub fn get_arr_f32(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(GgufValue::as_f32)
            .collect()
    }
    pub fn get_arr_i32(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(GgufValue::as_i32)
            .collect()
    }
    pub fn get_arr_u32(&self, key: &str) -> Option<Vec<u32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(GgufValue::as_u32)
            .collect()
    }
}

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    pub dtype: DType,
    /// ggml order (innermost first), 1..=4 entries, each > 0.
    pub ne: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub len: u64,
}

/// A parsed and validated GGUF header.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    pub version: u32,
    pub alignment: u64,
    pub metadata: GgufMetadata,
    /// Tensors in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// Absolute offset of the data section.
    pub data_start: u64,
}

/// Bounds-checked little-endian cursor over the file bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(WeightsError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
            });
        }
        let start = self.pos;
        self.pos += n as usize; // n <= remaining, so it fits in usize
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then bytes. The length is checked before anything is read.
    fn string_bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(WeightsError::StringTooLong {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                len,
            });
        }
        self.take(len, what)
    }

    fn value(&mut self, ty: GgufType, key: &str, in_array: bool) -> Result<GgufValue> {
        use GgufValue as V;
        Ok(match ty {
            GgufType::U8 => V::U8(self.array::<1>(key)?[0]),
            GgufType::I8 => V::I8(i8::from_le_bytes(self.array::<1>(key)?)),
            GgufType::U16 => V::U16(u16::from_le_bytes(self.array::<2>(key)?)),
            GgufType::I16 => V::I16(i16::from_le_bytes(self.array::<2>(key)?)),
            GgufType::U32 => V::U32(self.u32(key)?),
            GgufType::I32 => V::I32(i32::from_le_bytes(self.array::<4>(key)?)),
            GgufType::F32 => V::F32(f32::from_le_bytes(self.array::<4>(key)?)),
            GgufType::Bool => {
                let b = self.array::<1>(key)?[0];
                if b > 1 {
                    return Err(self.bad_value(key, format!("bool byte {b} is neither 0 nor 1")));
                }
                V::Bool(b == 1)
            }
            GgufType::String => {
                V::String(String::from_utf8_lossy(self.string_bytes(key)?).into_owned())
            }
            GgufType::U64 => V::U64(self.u64(key)?),
            GgufType::I64 => V::I64(i64::from_le_bytes(self.array::<8>(key)?)),
            GgufType::F64 => V::F64(f64::from_le_bytes(self.array::<8>(key)?)),
            GgufType::Array => {
                if in_array {
                    return Err(self.bad_value(key, "nested arrays are not supported".into()));
                }
                let id = self.u32(key)?;
                let elem = GgufType::from_id(id).ok_or_else(|| {
                    self.bad_value(key, format!("unknown array element type {id}"))
                })?;
                if elem == GgufType::Array {
                    return Err(self.bad_value(key, "nested arrays are not supported".into()));
                }
                let count = self.u64(key)?;
                // Each element needs at least min_size bytes, so the file bounds the count.
                let fits = count
                    .checked_mul(elem.min_size())
                    .is_some_and(|n| n <= self.remaining());
                if !fits {
                    return Err(WeightsError::TooMany {
                        path: self.path.to_path_buf(),
                        what: format!("array '{key}' element"),
                        count,
                        limit: self.remaining() / elem.min_size(),
                    });
                }
                // A value takes more memory than its encoding (up to ~32x for u8 items), so the
                // reservation may fail on a big file: report it instead of aborting.
                let mut items = Vec::new();
                items.try_reserve_exact(count as usize).map_err(|e| {
                    self.bad_value(key, format!("cannot allocate {count} array items: {e}"))
                })?;
                for _ in 0..count {
                    items.push(self.value(elem, key, true)?);
                }
                V::Array(elem, items)
            }
        })
    }

    fn bad_value(&self, key: &str, reason: String) -> WeightsError {
        WeightsError::BadValue {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            reason,
        }
    }
}

pub(crate) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1).map(|v| v & !(alignment - 1))
}

/// Parses and validates a GGUF file whose full contents are `bytes`.
pub fn parse_gguf(bytes: &[u8], path: &Path) -> Result<GgufHeader> {
    let pb = || path.to_path_buf();
    let mut c = Cursor {
        bytes,
        pos: 0,
        path,
    };
    if c.array::<4>("the magic")? != GGUF_MAGIC {
        return Err(WeightsError::BadMagic { path: pb() });
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(WeightsError::UnsupportedVersion {
            path: pb(),
            version,
        });
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the key/value count")?;
    // Minimal encodings: a KV pair is >= 8 (key len) + 4 (type) + 1 bytes; a tensor info is
    // >= 8 (name len) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes.
    check_count(&c, "key/value", n_kv, MAX_KV, 13)?;
    let mut metadata = GgufMetadata::default();
    for _ in 0..n_kv {
        let key_bytes = c.string_bytes("a metadata key")?;
        let key = std::str::from_utf8(key_bytes)
            .map_err(|_| WeightsError::BadValue {
                path: pb(),
                key: String::from_utf8_lossy(key_bytes).into_owned(),
                reason: "key is not valid UTF-8".into(),
            })?
            .to_string();
        let id = c.u32(&key)?;
        let ty = GgufType::from_id(id)
            .ok_or_else(|| c.bad_value(&key, format!("unknown value type {id}")))?;
        let value = c.value(ty, &key, false)?;
        if !metadata.insert(key.clone(), value) {
            return Err(WeightsError::Duplicate { path: pb(), key });
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = v.as_u64().ok_or_else(|| {
                c.bad_value("general.alignment", "expected an unsigned integer".into())
            })?;
            if !a.is_power_of_two() {
                return Err(WeightsError::BadAlignment {
                    path: pb(),
                    alignment: a,
                });
            }
            a
        }
    };

    check_count(&c, "tensor", n_tensors, MAX_TENSORS, 32)?;
    let mut names = HashSet::new();
    let mut raw = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        raw.push(read_tensor_info(&mut c, alignment, &mut names)?);
    }
    let data_start = align_up(c.pos as u64, alignment).ok_or(WeightsError::BadAlignment {
        path: pb(),
        alignment,
    })?;
    let file_len = bytes.len() as u64;
    let limit = file_len.saturating_sub(data_start);
    let mut tensors = Vec::with_capacity(raw.len());
    for (name, dtype, ne, rel, len) in raw {
        let end = rel.checked_add(len);
        if end.is_none_or(|e| e > limit) {
            return Err(WeightsError::OffsetOutOfBounds {
                path: pb(),
                key: name,
                begin: rel,
                end: end.unwrap_or(u64::MAX),
                limit,
            });
        }
        tensors.push(GgufTensorInfo {
            name,
            dtype,
            ne,
            offset: data_start + rel,
            len,
        });
    }
    check_ranges(
        tensors
            .iter()
            .map(|t| (t.offset, t.len, t.name.as_str()))
            .collect(),
        path,
    )?;
    Ok(GgufHeader {
        version,
        alignment,
        metadata,
        tensors,
        data_start,
    })
}

fn check_count(c: &Cursor, what: &str, count: u64, cap: u64, min_size: u64) -> Result<()> {
    let limit = cap.min(c.remaining() / min_size);
    if count > limit {
        return Err(WeightsError::TooMany {
            path: c.path.to_path_buf(),
            what: what.to_string(),
            count,
            limit,
        });
    }
    Ok(())
}

type RawInfo = (String, DType, Vec<u64>, u64, u64);

fn read_tensor_info(
    c: &mut Cursor,
    alignment: u64,
    names: &mut HashSet<String>,
) -> Result<RawInfo> {
    let path = c.path.to_path_buf();
    let name_bytes = c.string_bytes("a tensor name")?;
    let lossy = String::from_utf8_lossy(name_bytes).into_owned();
    let bad_name = |reason: &str| WeightsError::BadName {
        path: path.clone(),
        key: lossy.clone(),
        reason: reason.to_string(),
    };
    let name = std::str::from_utf8(name_bytes)
        .map_err(|_| bad_name("not valid UTF-8"))?
        .to_string();
    if name.is_empty() {
        return Err(bad_name("empty name"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(bad_name(&format!(
            "{} bytes, at most {MAX_NAME_BYTES} are allowed",
            name.len()
        )));
    }
    let bad_shape = |reason: String| WeightsError::BadShape {
        path: path.clone(),
        key: name.clone(),
        reason,
    };
    let n_dims = c.u32(&name)?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(bad_shape(format!(
            "{n_dims} dimensions (allowed: 1..={MAX_DIMS})"
        )));
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let d = c.u64(&name)?;
        if d == 0 || d > i64::MAX as u64 {
            return Err(bad_shape(format!("dimension {d} is out of range")));
        }
        ne.push(d);
    }
    let type_id = c.u32(&name)?;
    let dtype = DType::from_id(type_id).ok_or_else(|| WeightsError::UnknownDType {
        path: path.clone(),
        key: name.clone(),
        dtype: format!("ggml type id {type_id}"),
    })?;
    let numel_ok = ne
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .is_some_and(|n| n <= i64::MAX as u64);
    if !numel_ok {
        return Err(bad_shape(format!("element count of {ne:?} overflows")));
    }
    if ne[0] % dtype.block_size() as u64 != 0 {
        return Err(bad_shape(format!(
            "row of {} elements is not a multiple of the {} block size {}",
            ne[0],
            dtype.name(),
            dtype.block_size()
        )));
    }
    let len = dtype
        .nbytes(&ne)
        .ok_or_else(|| bad_shape(format!("byte size of {ne:?} overflows")))?;
    let offset = c.u64(&name)?;
    if offset % alignment != 0 {
        return Err(WeightsError::Misaligned {
            path,
            key: name,
            offset,
            alignment,
        });
    }
    if !names.insert(name.clone()) {
        return Err(WeightsError::Duplicate { path, key: name });
    }
    Ok((name, dtype, ne, offset, len))
}
