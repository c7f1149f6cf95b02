//! A validating reader of ZIP central directories (what `torch.save` writes since PyTorch 1.6):
//! entry names, compression methods, sizes and where each entry's data starts. ZIP64 end
//! records and extra fields are read, since real checkpoints pass 4 GB. Nothing is inflated:
//! stored (uncompressed) entries are served straight from the memory map.
//!
//! Every offset and length comes from the file and is checked against the file's size with
//! overflow-safe arithmetic before it is used. Multi-disk archives and encrypted entries are
//! refused.

use std::collections::HashMap;
use std::path::Path;

use super::error::{Result, WeightsError};

/// `PK\x03\x04`: a local file header, and the first bytes of every ZIP `torch.save` writes.
pub const LOCAL_MAGIC: [u8; 4] = *b"PK\x03\x04";
const CENTRAL_MAGIC: [u8; 4] = *b"PK\x01\x02";
const EOCD_MAGIC: [u8; 4] = *b"PK\x05\x06";
const ZIP64_LOCATOR_MAGIC: [u8; 4] = *b"PK\x06\x07";
const ZIP64_EOCD_MAGIC: [u8; 4] = *b"PK\x06\x06";

const EOCD_LEN: usize = 22;
const ZIP64_LOCATOR_LEN: usize = 20;
const ZIP64_EOCD_LEN: usize = 56;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: usize = 30;
/// The EOCD comment is at most this long, so the record lies in the file's last 64 KiB + 22.
const MAX_COMMENT: usize = 0xffff;

/// Compression method of a stored (uncompressed) entry.
pub const STORED: u16 = 0;

/// One entry of the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipEntry {
    pub name: String,
    /// 0 = stored, 8 = deflate, ...
    pub method: u16,
    pub compressed_size: u64,
    pub size: u64,
    /// Absolute offset of the entry's (possibly compressed) data in the file.
    pub data_offset: u64,
}

impl ZipEntry {
    /// The entry's bytes when it is stored uncompressed.
    pub fn stored_bytes<'a>(&self, file: &'a [u8], path: &Path) -> Result<&'a [u8]> {
        if self.method != STORED || self.compressed_size != self.size {
            return Err(WeightsError::UnsupportedTorch {
                path: path.to_path_buf(),
                reason: format!(
                    "zip entry '{}' is compressed (method {}); torch.save writes stored entries, \
                     so re-save the checkpoint with torch.save",
                    self.name, self.method
                ),
            });
        }
        // Checked against the file when the directory was read; `get` keeps a call with
        // another file from panicking.
        let range = usize::try_from(self.data_offset)
            .ok()
            .zip(usize::try_from(self.size).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        range
            .and_then(|r| file.get(r))
            .ok_or_else(|| WeightsError::OffsetOutOfBounds {
                path: path.to_path_buf(),
                key: self.name.clone(),
                begin: self.data_offset,
                end: self.data_offset.saturating_add(self.size),
                limit: file.len() as u64,
            })
    }
}

/// The archive's entries, in central-directory order.
#[derive(Debug, Clone, Default)]
pub struct ZipDirectory {
    pub entries: Vec<ZipEntry>,
    by_name: HashMap<String, usize>,
}

impl ZipDirectory {
    pub fn get(&self, name: &str) -> Option<&ZipEntry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }
}

fn le(bytes: &[u8], at: usize, width: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(width)?)?;
    let mut a = [0u8; 8];
    a[..width].copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

struct Reader<'a> {
    bytes: &'a [u8],
    path: &'a Path,
}

impl Reader<'_> {
    fn bad(&self, reason: impl Into<String>) -> WeightsError {
        WeightsError::BadZip {
            path: self.path.to_path_buf(),
            reason: reason.into(),
        }
    }

    fn field(&self, at: usize, width: usize, what: &str) -> Result<u64> {
        le(self.bytes, at, width).ok_or_else(|| WeightsError::Truncated {
            path: self.path.to_path_buf(),
            what: format!("the zip {what}"),
        })
    }

    fn at(&self, offset: u64, what: &str) -> Result<usize> {
        usize::try_from(offset)
            .ok()
            .filter(|&o| o <= self.bytes.len())
            .ok_or_else(|| {
                self.bad(format!(
                    "{what} at offset {offset} lies past the end of the file ({} bytes)",
                    self.bytes.len()
                ))
            })
    }

    /// The last end-of-central-directory record whose comment ends inside the file.
    fn find_eocd(&self) -> Result<usize> {
        let len = self.bytes.len();
        if len < EOCD_LEN {
            return Err(self.bad("the file is too short to hold a zip directory"));
        }
        let lowest = len.saturating_sub(EOCD_LEN + MAX_COMMENT);
        (lowest..=len - EOCD_LEN)
            .rev()
            .find(|&at| {
                self.bytes[at..at + 4] == EOCD_MAGIC
                    && le(self.bytes, at + 20, 2).is_some_and(|c| at + EOCD_LEN + c as usize <= len)
            })
            .ok_or_else(|| self.bad("no end-of-central-directory record"))
    }

    /// `(entry count, directory size, directory offset)`, from the ZIP64 record when the
    /// classic one says so (or has a ZIP64 locator in front of it).
    fn directory_bounds(&self, eocd: usize) -> Result<(u64, u64, u64)> {
        let disk = self.field(eocd + 4, 2, "end record")?;
        let cd_disk = self.field(eocd + 6, 2, "end record")?;
        let mut count = self.field(eocd + 10, 2, "end record")?;
        let mut size = self.field(eocd + 12, 4, "end record")?;
        let mut offset = self.field(eocd + 16, 4, "end record")?;
        let has_locator = eocd >= ZIP64_LOCATOR_LEN
            && self.bytes[eocd - ZIP64_LOCATOR_LEN..eocd - ZIP64_LOCATOR_LEN + 4]
                == ZIP64_LOCATOR_MAGIC;
        if has_locator {
            let loc = eocd - ZIP64_LOCATOR_LEN;
            let z_offset = self.field(loc + 8, 8, "ZIP64 locator")?;
            let z = self.at(z_offset, "the ZIP64 end record")?;
            if z.checked_add(ZIP64_EOCD_LEN).is_none_or(|end| end > loc) {
                return Err(self.bad(format!(
                    "the ZIP64 end record at offset {z_offset} overlaps its locator"
                )));
            }
            if self.bytes[z..z + 4] != ZIP64_EOCD_MAGIC {
                return Err(self.bad(format!("no ZIP64 end record at offset {z_offset}")));
            }
            let z_disk = self.field(z + 16, 4, "ZIP64 end record")?;
            let z_cd_disk = self.field(z + 20, 4, "ZIP64 end record")?;
            if z_disk != 0 || z_cd_disk != 0 {
                return Err(self.bad("multi-disk archives are not supported"));
            }
            count = self.field(z + 32, 8, "ZIP64 end record")?;
            size = self.field(z + 40, 8, "ZIP64 end record")?;
            offset = self.field(z + 48, 8, "ZIP64 end record")?;
        } else if disk != 0 || cd_disk != 0 {
            return Err(self.bad("multi-disk archives are not supported"));
        }
        Ok((count, size, offset))
    }

    /// The ZIP64 extended-information extra field replaces each of `fields` that is all ones,
    /// in order (size, compressed size, local header offset).
    fn zip64_extra(&self, extra: &[u8], fields: &mut [&mut u64; 3], name: &str) -> Result<()> {
        let wanted = fields
            .iter()
            .filter(|f| ***f == u64::from(u32::MAX))
            .count();
        if wanted == 0 {
            return Ok(());
        }
        let mut at = 0usize;
        while at + 4 <= extra.len() {
            let id = le(extra, at, 2).unwrap_or(0);
            let len = le(extra, at + 2, 2).unwrap_or(0) as usize;
            let body = extra.get(at + 4..at + 4 + len).ok_or_else(|| {
                self.bad(format!("entry '{name}': an extra field runs past its end"))
            })?;
            if id == 1 {
                let mut pos = 0usize;
                for f in fields.iter_mut() {
                    if **f == u64::from(u32::MAX) {
                        **f = le(body, pos, 8).ok_or_else(|| {
                            self.bad(format!(
                                "entry '{name}': the ZIP64 extra field is too short"
                            ))
                        })?;
                        pos += 8;
                    }
                }
                return Ok(());
            }
            at += 4 + len;
        }
        Err(self.bad(format!(
            "entry '{name}' needs a ZIP64 extra field but has none"
        )))
    }

    fn entry(&self, at: usize, dir_end: usize) -> Result<(ZipEntry, usize)> {
        if at.checked_add(CENTRAL_LEN).is_none_or(|e| e > dir_end)
            || self.bytes[at..at + 4] != CENTRAL_MAGIC
        {
            return Err(self.bad(format!("no central directory header at offset {at}")));
        }
        let f = |off: usize, w: usize| self.field(at + off, w, "central directory");
        let flags = f(8, 2)?;
        let method = f(10, 2)? as u16;
        let mut compressed_size = f(20, 4)?;
        let mut size = f(24, 4)?;
        let name_len = f(28, 2)? as usize;
        let extra_len = f(30, 2)? as usize;
        let comment_len = f(32, 2)? as usize;
        let disk = f(34, 2)?;
        let mut local = f(42, 4)?;
        let name_at = at + CENTRAL_LEN;
        let next = name_at + name_len + extra_len + comment_len;
        if next > dir_end {
            return Err(self.bad(format!(
                "the central directory header at offset {at} runs past the directory"
            )));
        }
        let name = String::from_utf8(self.bytes[name_at..name_at + name_len].to_vec())
            .map_err(|_| self.bad(format!("the entry name at offset {name_at} is not UTF-8")))?;
        let extra = &self.bytes[name_at + name_len..name_at + name_len + extra_len];
        self.zip64_extra(
            extra,
            &mut [&mut size, &mut compressed_size, &mut local],
            &name,
        )?;
        if disk != 0 && disk != 0xffff {
            return Err(self.bad("multi-disk archives are not supported"));
        }
        if flags & 1 != 0 {
            return Err(self.bad(format!("entry '{name}' is encrypted")));
        }
        let data_offset = self.local_data(local, &name, compressed_size)?;
        let entry = ZipEntry {
            name,
            method,
            compressed_size,
            size,
            data_offset,
        };
        Ok((entry, next))
    }

    /// Checks the local header at `offset` and returns where the entry's data starts.
    fn local_data(&self, offset: u64, name: &str, compressed_size: u64) -> Result<u64> {
        let at = self.at(offset, &format!("the local header of '{name}'"))?;
        if at
            .checked_add(LOCAL_LEN)
            .is_none_or(|e| e > self.bytes.len())
            || self.bytes[at..at + 4] != LOCAL_MAGIC
        {
            return Err(self.bad(format!("no local header for '{name}' at offset {offset}")));
        }
        let name_len = self.field(at + 26, 2, "local header")?;
        let extra_len = self.field(at + 28, 2, "local header")?;
        let local_name = self
            .bytes
            .get(at + LOCAL_LEN..at + LOCAL_LEN + name_len as usize)
            .ok_or_else(|| self.bad(format!("the local header of '{name}' is cut off")))?;
        if local_name != name.as_bytes() {
            return Err(self.bad(format!(
                "the local header at offset {offset} names '{}', the directory '{name}'",
                String::from_utf8_lossy(local_name)
            )));
        }
        let data = offset + LOCAL_LEN as u64 + name_len + extra_len;
        let end = data.checked_add(compressed_size);
        if end.is_none_or(|e| e > self.bytes.len() as u64) {
            return Err(WeightsError::OffsetOutOfBounds {
                path: self.path.to_path_buf(),
                key: name.to_string(),
                begin: data,
                end: end.unwrap_or(u64::MAX),
                limit: self.bytes.len() as u64,
            });
        }
        Ok(data)
    }
}

/// Reads and validates the central directory of the ZIP archive `bytes`.
pub fn read_zip_directory(bytes: &[u8], path: &Path) -> Result<ZipDirectory> {
    let r = Reader { bytes, path };
    let eocd = r.find_eocd()?;
    let (count, size, offset) = r.directory_bounds(eocd)?;
    let start = r.at(offset, "the central directory")?;
    let end = offset
        .checked_add(size)
        .filter(|&e| e <= bytes.len() as u64)
        .ok_or_else(|| {
            r.bad(format!(
                "the central directory (offset {offset}, {size} bytes) runs past the end of the file"
            ))
        })? as usize;
    if count > (size / CENTRAL_LEN as u64) {
        return Err(WeightsError::TooMany {
            path: path.to_path_buf(),
            what: "zip entry".into(),
            count,
            limit: size / CENTRAL_LEN as u64,
        });
    }
    let mut dir = ZipDirectory::default();
    let mut at = start;
    for _ in 0..count {
        let (entry, next) = r.entry(at, end)?;
        if dir
            .by_name
            .insert(entry.name.clone(), dir.entries.len())
            .is_some()
        {
            return Err(WeightsError::Duplicate {
                path: path.to_path_buf(),
                key: entry.name,
            });
        }
        dir.entries.push(entry);
        at = next;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-entry stored archive, optionally with ZIP64 records.
    fn archive(name: &str, data: &[u8], zip64: bool) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&LOCAL_MAGIC);
        out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        let cd = out.len();
        out.extend_from_slice(&CENTRAL_MAGIC);
        out.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let (sz, extra): (u32, Vec<u8>) = if zip64 {
            let mut e = vec![1, 0, 24, 0];
            for v in [data.len() as u64, data.len() as u64, 0] {
                e.extend_from_slice(&v.to_le_bytes());
            }
            (u32::MAX, e)
        } else {
            (data.len() as u32, Vec::new())
        };
        out.extend_from_slice(&sz.to_le_bytes());
        out.extend_from_slice(&sz.to_le_bytes());
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0; 10]);
        out.extend_from_slice(&(if zip64 { u32::MAX } else { 0 }).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&extra);
        let cd_len = out.len() - cd;
        if zip64 {
            let z = out.len();
            out.extend_from_slice(&ZIP64_EOCD_MAGIC);
            out.extend_from_slice(&44u64.to_le_bytes());
            out.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&1u64.to_le_bytes());
            out.extend_from_slice(&1u64.to_le_bytes());
            out.extend_from_slice(&(cd_len as u64).to_le_bytes());
            out.extend_from_slice(&(cd as u64).to_le_bytes());
            out.extend_from_slice(&ZIP64_LOCATOR_MAGIC);
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(z as u64).to_le_bytes());
            out.extend_from_slice(&1u32.to_le_bytes());
        }
        out.extend_from_slice(&EOCD_MAGIC);
        out.extend_from_slice(&[0, 0, 0, 0, 1, 0, 1, 0]);
        let (cl, co) = if zip64 {
            (u32::MAX, u32::MAX)
        } else {
            (cd_len as u32, cd as u32)
        };
        out.extend_from_slice(&cl.to_le_bytes());
        out.extend_from_slice(&co.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    #[test]
    fn reads_classic_and_zip64_directories() {
        for zip64 in [false, true] {
            let a = archive("archive/data.pkl", b"hello", zip64);
            let dir = read_zip_directory(&a, Path::new("t.zip")).unwrap();
            let e = dir.get("archive/data.pkl").unwrap();
            assert_eq!(e.stored_bytes(&a, Path::new("t.zip")).unwrap(), b"hello");
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let a = archive("archive/data.pkl", b"hello", true);
        for n in 0..a.len() {
            assert!(
                read_zip_directory(&a[..n], Path::new("t.zip")).is_err(),
                "{n}"
            );
        }
    }
}
