//! Generators of hostile inputs for `tests/hostile_corpus.rs`: seeded random mutations and
//! builders of tiny valid/corrupt safetensors, GGUF, tokenizer and PNG files. Nothing here is
//! a committed binary: every case is built in memory from a description.

#![allow(dead_code)]

pub mod cli;
pub mod gguf;
pub mod png;
pub mod safetensors;
pub mod tokenizers;

/// A corpus entry: its class (what kind of corruption), a name for messages, and the bytes.
pub struct Case {
    pub class: &'static str,
    pub name: String,
    pub bytes: Vec<u8>,
}

impl Case {
    pub fn new(class: &'static str, name: impl Into<String>, bytes: Vec<u8>) -> Case {
        Case {
            class,
            name: name.into(),
            bytes,
        }
    }
}

/// xorshift64*: tiny, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Values that break length and count fields: zero, off-by-one, sign bits, powers of two.
pub fn interesting_u64(original: u64, file_len: u64) -> Vec<u64> {
    vec![
        0,
        1,
        original.wrapping_add(1),
        original.wrapping_sub(1),
        original.wrapping_mul(2),
        file_len,
        file_len + 1,
        u32::MAX as u64,
        1 << 31,
        1 << 32,
        i64::MAX as u64,
        1 << 63,
        u64::MAX,
        u64::MAX - 1,
        (-2i64) as u64,
    ]
}

/// A length/count field inside a file: byte position and width (4 or 8, little-endian).
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub at: usize,
    pub width: u8,
}

fn write_field(bytes: &mut [u8], f: Field, v: u64) {
    let w = f.width as usize;
    if f.at + w <= bytes.len() {
        bytes[f.at..f.at + w].copy_from_slice(&v.to_le_bytes()[..w]);
    }
}

fn read_field(bytes: &[u8], f: Field) -> u64 {
    let mut a = [0u8; 8];
    let w = f.width as usize;
    if f.at + w <= bytes.len() {
        a[..w].copy_from_slice(&bytes[f.at..f.at + w]);
    }
    u64::from_le_bytes(a)
}

/// One random mutation of `good`: byte flips, byte sets, truncation, splices (a range copied
/// over another, or from `donor`), insertions, deletions, or a length-field edit (when `fields`
/// is not empty). Returns a description and the mutated bytes.
pub fn mutate(rng: &mut Rng, good: &[u8], donor: &[u8], fields: &[Field]) -> (String, Vec<u8>) {
    let mut b = good.to_vec();
    let n = b.len().max(1);
    let kind = rng.below(if fields.is_empty() { 7 } else { 9 });
    let desc = match kind {
        0 => {
            let flips = 1 + rng.below(4);
            for _ in 0..flips {
                let p = rng.below(n.min(b.len()).max(1));
                if p < b.len() {
                    b[p] ^= 1 << rng.below(8);
                }
            }
            format!("flip {flips} bits")
        }
        1 => {
            let p = rng.below(n);
            let v = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'[', b'9', b'-']);
            if p < b.len() {
                b[p] = v;
            }
            format!("set byte {p} = {v:#x}")
        }
        2 => {
            let cut = rng.below(n);
            b.truncate(cut);
            format!("truncate to {cut}")
        }
        3 => {
            let (src, dst, len) = (rng.below(n), rng.below(n), 1 + rng.below(16));
            let chunk: Vec<u8> = good.iter().skip(src).take(len).copied().collect();
            for (i, c) in chunk.iter().enumerate() {
                if let Some(x) = b.get_mut(dst + i) {
                    *x = *c;
                }
            }
            format!("splice {len} bytes {src} -> {dst}")
        }
        4 => {
            let dst = rng.below(n);
            let src = rng.below(donor.len().max(1));
            let len = 1 + rng.below(32);
            let chunk: Vec<u8> = donor.iter().skip(src).take(len).copied().collect();
            for (i, c) in chunk.iter().enumerate() {
                if let Some(x) = b.get_mut(dst + i) {
                    *x = *c;
                }
            }
            format!("splice donor {len} bytes -> {dst}")
        }
        5 => {
            let p = rng.below(n).min(b.len());
            let len = 1 + rng.below(9);
            let fill: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            b.splice(p..p, fill);
            format!("insert {len} at {p}")
        }
        6 => {
            let p = rng.below(n).min(b.len());
            let len = (1 + rng.below(9)).min(b.len() - p);
            b.drain(p..p + len);
            format!("delete {len} at {p}")
        }
        _ => {
            let f = *rng.pick(fields);
            let vals = interesting_u64(read_field(good, f), good.len() as u64);
            let v = *rng.pick(&vals);
            write_field(&mut b, f, v);
            format!("length field @{} (u{}) = {v}", f.at, f.width as u32 * 8)
        }
    };
    (desc, b)
}

/// Runs `f`, turning a panic into a test failure that names the case.
pub fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("PANIC on {what}: {msg}")
        }
    }
}

/// Counts per class, printed by the tests (`cargo test -- --nocapture` shows them).
#[derive(Default)]
pub struct Tally(pub std::collections::BTreeMap<&'static str, usize>);

impl Tally {
    pub fn add(&mut self, class: &'static str) {
        *self.0.entry(class).or_default() += 1;
    }
    pub fn total(&self) -> usize {
        self.0.values().sum()
    }
    pub fn print(&self, title: &str) {
        eprintln!("{title}: {} cases", self.total());
        for (k, v) in &self.0 {
            eprintln!("  {k:<28} {v}");
        }
    }
}
