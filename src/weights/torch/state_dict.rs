//! Finding the state dict in an unpickled checkpoint, and checking each tensor's layout
//! against its storage.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::weights::dtype::SourceDType;
use crate::weights::error::{Result, WeightsError};
use crate::weights::pickle::{ObjId, Object, TensorRef, Unpickled, Value};

/// A named tensor of the checkpoint.
pub(super) struct Found<'u> {
    pub name: String,
    pub tensor: &'u TensorRef,
}

/// The tensors of the checkpoint, as upstream's `pickle_io.cpp` finds them: every tensor under
/// a string key of the root dict, and of every dict nested in it at any depth (so a bare state
/// dict, Lightning's `{"state_dict": ...}`, `{"model": ...}`, `{"module": ...}`,
/// `{"params_ema": ...}` all work), named by its own key without the outer keys. Lists are not
/// searched (optimizer states live there). A name seen twice keeps the later tensor, as
/// upstream's name map does. The walk is iterative and visits each dict once.
pub(super) fn find_tensors<'u>(u: &'u Unpickled, path: &Path) -> Result<Vec<Found<'u>>> {
    let mut found: Vec<Found<'u>> = Vec::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut seen: HashSet<ObjId> = HashSet::new();
    let root_items = match (u.root, u.get(u.root)) {
        (Value::Obj(id), Some(Object::Dict(items))) => {
            seen.insert(id);
            items.as_slice()
        }
        (_, other) => {
            return Err(WeightsError::UnsupportedTorch {
                path: path.to_path_buf(),
                reason: format!(
                    "the checkpoint holds a {}, not a dict of tensors",
                    other.map_or("plain value", Object::kind)
                ),
            })
        }
    };
    // (items of a dict, next index): a depth-first walk in file order, like upstream's.
    let mut stack: Vec<(&'u [(Value, Value)], usize)> = vec![(root_items, 0)];
    while let Some((items, i)) = stack.pop() {
        let Some(&(key, value)) = items.get(i) else {
            continue;
        };
        stack.push((items, i + 1));
        match (u.str(key), value, u.get(value)) {
            (Some(name), _, Some(Object::Tensor(tensor))) => {
                let entry = Found {
                    name: name.to_string(),
                    tensor,
                };
                match by_name.get(name) {
                    Some(&at) => {
                        log::warn!(
                            "{}: tensor '{name}' appears twice; the later one is used",
                            path.display()
                        );
                        found[at] = entry;
                    }
                    None => {
                        by_name.insert(name.to_string(), found.len());
                        found.push(entry);
                    }
                }
            }
            (_, Value::Obj(id), Some(Object::Dict(inner))) if seen.insert(id) => {
                stack.push((inner.as_slice(), 0));
            }
            _ => {}
        }
    }
    if found.is_empty() {
        return Err(WeightsError::UnsupportedTorch {
            path: path.to_path_buf(),
            reason: "the checkpoint holds no tensors under string keys of its dicts".into(),
        });
    }
    Ok(found)
}

/// Where a tensor's bytes lie inside its storage.
#[derive(Debug)]
pub(super) struct Layout {
    pub dtype: SourceDType,
    /// PyTorch order.
    pub shape: Vec<u64>,
    /// Byte offset inside the storage.
    pub offset: u64,
    pub len: u64,
    /// Bytes the storage declares (`numel` × its element size).
    pub storage_len: u64,
}

/// Checks a tensor against its storage. A 0-d tensor (a LoRA's `.alpha`, `model_ema.decay`)
/// is one value, as in safetensors files.
/// Non-contiguous tensors (a transposed view saved as is) are refused: the store serves each
/// tensor as one byte range of the file. Strides of size-1 dimensions do not matter.
pub(super) fn layout(name: &str, t: &TensorRef, path: &Path) -> Result<Option<Layout>> {
    let bad_shape = |reason: String| WeightsError::BadShape {
        path: path.to_path_buf(),
        key: name.to_string(),
        reason,
    };
    let Some(dtype) = t.dtype.source else {
        return Err(WeightsError::UnknownDType {
            path: path.to_path_buf(),
            key: name.to_string(),
            dtype: format!("torch.{}", t.dtype.name),
        });
    };
    if t.lazy_bits {
        return Err(WeightsError::UnsupportedTorch {
            path: path.to_path_buf(),
            reason: format!(
                "tensor '{name}' carries a pending negation or conjugation; save it after \
                 .resolve_neg() / .resolve_conj()"
            ),
        });
    }
    let elem = t.dtype.size;
    let numel = t
        .size
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad_shape(format!("element count of {:?} overflows", t.size)))?;
    // ggml keeps sizes in int64 and strides in size_t: every dimension counts, even with no data.
    let strided = t
        .size
        .iter()
        .try_fold(elem, |a, &d| a.checked_mul(d.max(1)))
        .filter(|&n| n <= i64::MAX as u64);
    if strided.is_none() {
        return Err(bad_shape(format!(
            "dimensions {:?} exceed ggml's limits",
            t.size
        )));
    }
    if numel > 0 {
        let mut expected = 1u64;
        for (&size, &stride) in t.size.iter().zip(&t.stride).rev() {
            if size != 1 && stride != expected {
                return Err(bad_shape(format!(
                    "not contiguous (size {:?}, stride {:?}); save it after .contiguous()",
                    t.size, t.stride
                )));
            }
            expected = expected.saturating_mul(size);
        }
    }
    let len = numel * elem; // bounded by the strided check
    let storage_len = t
        .storage
        .numel
        .checked_mul(t.storage.elem_size())
        .ok_or_else(|| bad_shape(format!("storage '{}' size overflows", t.storage.key)))?;
    if numel == 0 {
        // No bytes: an empty range at the storage's start, whatever the offset says.
        return Ok(Some(Layout {
            dtype,
            shape: t.size.clone(),
            offset: 0,
            len: 0,
            storage_len,
        }));
    }
    let offset = t
        .storage_offset
        .checked_mul(elem)
        .ok_or_else(|| bad_shape(format!("storage offset {} overflows", t.storage_offset)))?;
    let end = offset.checked_add(len);
    if end.is_none_or(|e| e > storage_len) {
        return Err(WeightsError::OffsetOutOfBounds {
            path: path.to_path_buf(),
            key: name.to_string(),
            begin: offset,
            end: end.unwrap_or(u64::MAX),
            limit: storage_len,
        });
    }
    Ok(Some(Layout {
        dtype,
        shape: t.size.clone(),
        offset,
        len,
        storage_len,
    }))
}
