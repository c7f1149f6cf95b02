//! Writes a `torch.save` checkpoint from a recipe: torch's own `data.pkl`, the list of the
//! archive's records (as torch wrote them) and, for each storage, the single-file tensor whose
//! bytes it holds. The ZIP is what torch writes: stored entries, data aligned to 64 bytes
//! through a padding extra field, CRC-32 of each entry.

use std::path::Path;

use sd_cli::weights::TensorStore;

/// Data offsets are multiples of this (torch's `.storage_alignment`).
const ALIGN: usize = 64;

fn crc32(data: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (i, t) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *t = c;
    }
    !data.iter().fold(!0u32, |c, &b| {
        table[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8)
    })
}

/// A stored-only ZIP writer.
struct ZipOut {
    bytes: Vec<u8>,
    central: Vec<u8>,
    count: u16,
}

impl ZipOut {
    fn add(&mut self, name: &str, data: &[u8]) {
        let offset = self.bytes.len() as u32;
        let crc = crc32(data);
        // Extra field "FB" (torch's id) padding the data start to ALIGN.
        let fixed = self.bytes.len() + 30 + name.len() + 4;
        let pad = (ALIGN - fixed % ALIGN) % ALIGN;
        let mut extra = b"FB".to_vec();
        extra.extend((pad as u16).to_le_bytes());
        extra.extend(std::iter::repeat_n(b'Z', pad));
        let header = |sig: u32, central: bool| {
            let mut h = sig.to_le_bytes().to_vec();
            if central {
                h.extend(20u16.to_le_bytes()); // made by
            }
            h.extend(20u16.to_le_bytes()); // version needed
            h.extend([0u8; 4]); // flags, method (stored)
            h.extend([0u8; 4]); // time, date
            h.extend(crc.to_le_bytes());
            h.extend((data.len() as u32).to_le_bytes());
            h.extend((data.len() as u32).to_le_bytes());
            h.extend((name.len() as u16).to_le_bytes());
            h
        };
        let mut local = header(0x0403_4b50, false);
        local.extend((extra.len() as u16).to_le_bytes());
        local.extend(name.as_bytes());
        local.extend(&extra);
        self.bytes.extend(local);
        assert_eq!(self.bytes.len() % ALIGN, 0);
        self.bytes.extend(data);

        let mut c = header(0x0201_4b50, true);
        c.extend(0u16.to_le_bytes()); // extra
        c.extend([0u8; 6]); // comment, disk, internal attributes
        c.extend(0u32.to_le_bytes()); // external attributes
        c.extend(offset.to_le_bytes());
        c.extend(name.as_bytes());
        self.central.extend(c);
        self.count += 1;
    }

    fn finish(mut self) -> Vec<u8> {
        let at = self.bytes.len() as u32;
        let size = self.central.len() as u32;
        self.bytes.extend(std::mem::take(&mut self.central));
        self.bytes.extend(0x0605_4b50u32.to_le_bytes());
        self.bytes.extend([0u8; 4]); // disk numbers
        self.bytes.extend(self.count.to_le_bytes());
        self.bytes.extend(self.count.to_le_bytes());
        self.bytes.extend(size.to_le_bytes());
        self.bytes.extend(at.to_le_bytes());
        self.bytes.extend(0u16.to_le_bytes());
        self.bytes
    }
}

/// Writes the checkpoint of `recipe` (sd_extras_fixtures.py's `.ckpt.json`) with the pickle at
/// `pickle` and storages from the safetensors file `weights` (tensors by their stored names).
pub fn write_ckpt(recipe: &Path, pickle: &Path, weights: &Path, out: &Path) {
    let recipe: serde_json::Value =
        serde_json::from_slice(&std::fs::read(recipe).unwrap()).unwrap();
    let pkl = std::fs::read(pickle).unwrap();
    let bytes = std::fs::read(weights).unwrap();
    let header = sd_cli::weights::safetensors::parse_safetensors(&bytes, weights).unwrap();
    let tensor = |name: &str| {
        let t = header
            .tensors
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{} has no {name}", weights.display()));
        &bytes[t.offset as usize..(t.offset + t.len) as usize]
    };
    let archive = recipe["archive"].as_str().unwrap();
    let storages = &recipe["storages"];
    let mut zip = ZipOut {
        bytes: Vec::new(),
        central: Vec::new(),
        count: 0,
    };
    for record in recipe["records"].as_array().unwrap() {
        let rel = record[0].as_str().unwrap();
        let what = &record[1];
        let name = format!("{archive}/{rel}");
        if what.get("pickle").is_some() {
            zip.add(&name, &pkl);
        } else if let Some(key) = what.get("storage").and_then(|k| k.as_str()) {
            zip.add(&name, tensor(storages[key].as_str().unwrap()));
        } else {
            // Latin-1 text (ASCII in practice): one byte per char.
            let text: Vec<u8> = what["text"]
                .as_str()
                .unwrap()
                .chars()
                .map(|c| c as u8)
                .collect();
            zip.add(&name, &text);
        }
    }
    std::fs::write(out, zip.finish()).unwrap();
    // The result is a checkpoint the reader takes (checked tensor by tensor by the caller).
    TensorStore::open(out).unwrap();
}
