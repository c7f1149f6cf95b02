//! The ZIP checkpoint `torch.save` writes since PyTorch 1.6: `<dir>/data.pkl` (the pickle),
//! `<dir>/data/<key>` (one stored entry per storage), `<dir>/version`, `<dir>/byteorder`
//! (since 2.1), under one top-level folder of any name.

use std::path::Path;

use super::state_dict::{find_tensors, layout};
use super::{pickle_error, TorchTensor};
use crate::weights::error::{Result, WeightsError};
use crate::weights::pickle::unpickle;
use crate::weights::zip::{read_zip_directory, ZipDirectory, ZipEntry};

/// The `data.pkl` entry and its folder prefix (`"archive/"`, or `""` at the top level).
fn find_pickle<'d>(dir: &'d ZipDirectory, path: &Path) -> Result<(&'d ZipEntry, &'d str)> {
    let mut hits = dir.entries.iter().filter_map(|e| {
        let prefix = e.name.strip_suffix("data.pkl")?;
        let top_level = prefix.is_empty()
            || prefix
                .strip_suffix('/')
                .is_some_and(|d| !d.is_empty() && !d.contains('/'));
        top_level.then_some((e, prefix))
    });
    let first = hits.next().ok_or_else(|| WeightsError::UnsupportedTorch {
        path: path.to_path_buf(),
        reason: "the zip archive holds no data.pkl (it is not a torch.save checkpoint)".into(),
    })?;
    if let Some((other, _)) = hits.next() {
        return Err(WeightsError::UnsupportedTorch {
            path: path.to_path_buf(),
            reason: format!(
                "the zip archive holds two checkpoints ('{}' and '{}')",
                first.0.name, other.name
            ),
        });
    }
    Ok(first)
}

/// Reads a ZIP checkpoint whose whole file is `bytes`.
pub(super) fn parse_zip(bytes: &[u8], path: &Path) -> Result<Vec<TorchTensor>> {
    let dir = read_zip_directory(bytes, path)?;
    let (pkl_entry, prefix) = find_pickle(&dir, path)?;
    if let Some(order) = dir.get(&format!("{prefix}byteorder")) {
        let order = order.stored_bytes(bytes, path)?;
        if order != b"little" {
            return Err(WeightsError::UnsupportedTorch {
                path: path.to_path_buf(),
                reason: format!(
                    "byte order '{}' (only little-endian checkpoints are read)",
                    String::from_utf8_lossy(order).escape_debug()
                ),
            });
        }
    }
    let pkl = pkl_entry.stored_bytes(bytes, path)?;
    let u = unpickle(pkl).map_err(|e| pickle_error(e, path, &pkl_entry.name, 0))?;
    let mut out = Vec::new();
    for found in find_tensors(&u, path)? {
        let Some(l) = layout(&found.name, found.tensor, path)? else {
            continue;
        };
        let entry_name = format!("{prefix}data/{}", found.tensor.storage.key);
        let entry = dir.get(&entry_name).ok_or_else(|| WeightsError::BadZip {
            path: path.to_path_buf(),
            reason: format!(
                "storage entry '{entry_name}' of tensor '{}' is missing",
                found.name
            ),
        })?;
        let data = entry.stored_bytes(bytes, path)?;
        if (data.len() as u64) < l.storage_len {
            return Err(WeightsError::BadZip {
                path: path.to_path_buf(),
                reason: format!(
                    "storage entry '{entry_name}' holds {} bytes but tensor '{}' declares a \
                     storage of {}",
                    data.len(),
                    found.name,
                    l.storage_len
                ),
            });
        }
        out.push(TorchTensor {
            name: found.name,
            dtype: l.dtype,
            shape: l.shape,
            // In bounds: offset + len <= storage_len <= the entry's length, inside the file.
            offset: entry.data_offset + l.offset,
            len: l.len,
        });
    }
    Ok(out)
}
