//! The legacy (pre-1.6, non-zip) `torch.save` format, still written with
//! `_use_new_zipfile_serialization=False`: five pickles back to back (the magic number, the
//! protocol version 1001, a `sys_info` dict, the object, the sorted list of storage keys), then
//! each storage in that list's order as an 8-byte little-endian element count followed by its
//! raw bytes. Upstream reads it in `model_io/torch_legacy_io.cpp`.

use std::collections::HashMap;
use std::path::Path;

use super::state_dict::{find_tensors, layout};
use super::{pickle_error, TorchTensor};
use crate::weights::error::{Result, WeightsError};
use crate::weights::pickle::{unpickle, Object, Unpickled, Value};

/// torch's `MAGIC_NUMBER` (0x1950a86a20f9469cfc6c), as LONG1 stores it: little-endian bytes.
const MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];
/// torch's legacy `PROTOCOL_VERSION`.
const PROTOCOL_VERSION: i64 = 1001;
const COUNT_LEN: u64 = 8;

/// True when `bytes` starts with the pickled legacy magic number: PROTO (2–5), an optional
/// FRAME, then `LONG1 10 <magic>`.
pub fn is_torch_legacy(bytes: &[u8]) -> bool {
    let [0x80, proto, rest @ ..] = bytes else {
        return false;
    };
    if !(2..=5).contains(proto) {
        return false;
    }
    let rest = match rest {
        [0x95, tail @ ..] if tail.len() >= 8 => &tail[8..],
        _ => rest,
    };
    rest.len() > 12 && rest[..2] == [0x8a, 10] && rest[2..12] == MAGIC
}

/// One pickle of the sequence, starting at `*pos`; advances `*pos` past it.
fn next_pickle(bytes: &[u8], pos: &mut usize, part: &str, path: &Path) -> Result<Unpickled> {
    let rest = bytes.get(*pos..).unwrap_or(&[]);
    let u = unpickle(rest).map_err(|e| pickle_error(e, path, part, *pos as u64))?;
    *pos += u.len;
    Ok(u)
}

fn unsupported(path: &Path, reason: String) -> WeightsError {
    WeightsError::UnsupportedTorch {
        path: path.to_path_buf(),
        reason,
    }
}

/// Reads a legacy checkpoint whose whole file is `bytes`.
pub(super) fn parse_legacy(bytes: &[u8], path: &Path) -> Result<Vec<TorchTensor>> {
    let mut pos = 0usize;
    let magic = next_pickle(bytes, &mut pos, "the legacy magic number", path)?;
    if !matches!(magic.get(magic.root), Some(Object::BigInt(b)) if b[..] == MAGIC) {
        return Err(unsupported(path, "the legacy magic number is wrong".into()));
    }
    let version = next_pickle(bytes, &mut pos, "the legacy protocol version", path)?;
    if version.root != Value::Int(PROTOCOL_VERSION) {
        return Err(unsupported(
            path,
            format!("legacy protocol version {:?} (expected 1001)", version.root),
        ));
    }
    let sys_info = next_pickle(bytes, &mut pos, "the legacy sys_info", path)?;
    if let Some(Object::Dict(items)) = sys_info.get(sys_info.root) {
        let big_endian = items
            .iter()
            .any(|&(k, v)| sys_info.str(k) == Some("little_endian") && v == Value::Bool(false));
        if big_endian {
            return Err(unsupported(
                path,
                "a big-endian checkpoint (only little-endian ones are read)".into(),
            ));
        }
    }
    let main = next_pickle(bytes, &mut pos, "the legacy object pickle", path)?;
    let keys = next_pickle(bytes, &mut pos, "the legacy storage key list", path)?;
    let storages = place_storages(bytes, pos, &main, &keys, path)?;

    let mut out = Vec::new();
    for found in find_tensors(&main, path)? {
        let Some(l) = layout(&found.name, found.tensor, path)? else {
            continue;
        };
        let key = &found.tensor.storage.key;
        let &(start, len) = storages.get(key.as_str()).ok_or_else(|| {
            unsupported(
                path,
                format!(
                    "storage '{key}' of tensor '{}' is not in the storage key list",
                    found.name
                ),
            )
        })?;
        if len < l.storage_len {
            return Err(unsupported(
                path,
                format!(
                    "storage '{key}' holds {len} bytes but tensor '{}' declares {}",
                    found.name, l.storage_len
                ),
            ));
        }
        out.push(TorchTensor {
            name: found.name,
            dtype: l.dtype,
            shape: l.shape,
            offset: start + l.offset,
            len: l.len,
        });
    }
    Ok(out)
}

/// Walks the storages after the key list: key → (absolute data offset, bytes).
fn place_storages<'k>(
    bytes: &[u8],
    start: usize,
    main: &Unpickled,
    keys: &'k Unpickled,
    path: &Path,
) -> Result<HashMap<&'k str, (u64, u64)>> {
    let Some(Object::List(list)) = keys.get(keys.root) else {
        return Err(unsupported(
            path,
            "the storage key list is not a list".into(),
        ));
    };
    let file_len = bytes.len() as u64;
    let mut at = start as u64;
    let mut out = HashMap::with_capacity(list.len().min(1 << 16));
    for &k in list {
        let key = keys
            .str(k)
            .ok_or_else(|| unsupported(path, "a storage key is not a string".into()))?;
        let decl = main.storages().get(key).ok_or_else(|| {
            unsupported(
                path,
                format!("storage '{key}' is listed but no tensor declares its type"),
            )
        })?;
        let count_at = at as usize;
        let count = bytes
            .get(count_at..count_at.saturating_add(COUNT_LEN as usize))
            .map(|b| {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                u64::from_le_bytes(a)
            })
            .ok_or_else(|| WeightsError::Truncated {
                path: path.to_path_buf(),
                what: format!("the element count of storage '{key}'"),
            })?;
        if count != decl.numel {
            return Err(unsupported(
                path,
                format!(
                    "storage '{key}' holds {count} elements but the pickle declares {}",
                    decl.numel
                ),
            ));
        }
        let data = at + COUNT_LEN;
        let end = count
            .checked_mul(decl.elem_size())
            .and_then(|n| data.checked_add(n));
        let end = match end {
            Some(e) if e <= file_len => e,
            _ => {
                return Err(WeightsError::OffsetOutOfBounds {
                    path: path.to_path_buf(),
                    key: format!("storage {key}"),
                    begin: data,
                    end: end.unwrap_or(u64::MAX),
                    limit: file_len,
                })
            }
        };
        if out.insert(key, (data, end - data)).is_some() {
            return Err(WeightsError::Duplicate {
                path: path.to_path_buf(),
                key: format!("storage {key}"),
            });
        }
        at = end;
    }
    Ok(out)
}
