//! Hostile GGUF files, by class, each with the `WeightsError` variant it must produce.

use sd_cli::weights::WeightsError as E;

use super::safetensors::{wcase, WCase};
use super::{Case, Field};

/// GGUF byte builder that records where its length and count fields are.
#[derive(Default, Clone)]
pub struct G {
    pub b: Vec<u8>,
    pub fields: Vec<Field>,
}

impl G {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> G {
        let mut g = G {
            b: b"GGUF".to_vec(),
            fields: Vec::new(),
        };
        g.u32(version).len64(n_tensors).len64(n_kv);
        g
    }
    pub fn u32(&mut self, v: u32) -> &mut G {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut G {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A u32 that is a count/type field worth mutating.
    pub fn len32(&mut self, v: u32) -> &mut G {
        self.fields.push(Field {
            at: self.b.len(),
            width: 4,
        });
        self.u32(v)
    }
    /// A u64 that is a length/count/offset field worth mutating.
    pub fn len64(&mut self, v: u64) -> &mut G {
        self.fields.push(Field {
            at: self.b.len(),
            width: 8,
        });
        self.u64(v)
    }
    pub fn raw_s(&mut self, v: &[u8]) -> &mut G {
        self.len64(v.len() as u64);
        self.b.extend_from_slice(v);
        self
    }
    pub fn s(&mut self, v: &str) -> &mut G {
        self.raw_s(v.as_bytes())
    }
    pub fn kv_u32(&mut self, k: &str, v: u32) -> &mut G {
        self.s(k).len32(4).u32(v)
    }
    pub fn kv_str(&mut self, k: &str, v: &str) -> &mut G {
        self.s(k).len32(8).s(v)
    }
    pub fn kv_str_arr(&mut self, k: &str, items: &[&str]) -> &mut G {
        self.s(k).len32(9).len32(8).len64(items.len() as u64);
        for i in items {
            self.s(i);
        }
        self
    }
    pub fn kv_f32_arr(&mut self, k: &str, items: &[f32]) -> &mut G {
        self.s(k).len32(9).len32(6).len64(items.len() as u64);
        for i in items {
            self.b.extend_from_slice(&i.to_le_bytes());
        }
        self
    }
    pub fn info(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut G {
        self.s(name).len32(ne.len() as u32);
        for &d in ne {
            self.len64(d);
        }
        self.len32(ty).len64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    pub fn data(&self, align: usize, n: usize) -> Vec<u8> {
        let mut v = self.b.clone();
        v.resize(v.len().div_ceil(align) * align, 0);
        v.extend((0..n).map(|i| (i * 31 % 251) as u8 & 0x3f));
        v
    }
}

/// Valid tiny GGUF models with their mutable fields.
pub fn valid_models() -> Vec<(Vec<u8>, Vec<Field>)> {
    let mut out = Vec::new();
    // f32 + f16 with string, array and number metadata.
    let mut g = G::header(3, 2, 3);
    g.kv_str("general.name", "tiny")
        .kv_str_arr("tokenizer.ggml.tokens", &["<unk>", "</s>", "a"])
        .kv_f32_arr("tokenizer.ggml.scores", &[0.0, 0.0, -1.0]);
    g.info("blk.0.w", &[4, 2], 0, 0)
        .info("blk.0.b", &[16], 1, 32);
    out.push((g.data(32, 64), g.fields.clone()));
    // Quantized tensors and a custom alignment.
    let mut g = G::header(3, 2, 1);
    g.kv_u32("general.alignment", 64);
    g.info("q8", &[32, 2], 8, 0).info("q4", &[32], 2, 128);
    out.push((g.data(64, 128 + 18), g.fields.clone()));
    // Version 2, 4-d tensor, no metadata.
    let mut g = G::header(2, 1, 0);
    g.info("conv.weight", &[1, 2, 2, 2], 0, 0);
    out.push((g.data(32, 32), g.fields.clone()));
    // No tensors at all (a tokenizer-only file).
    let mut g = G::header(3, 0, 1);
    g.kv_str_arr("tokenizer.ggml.tokens", &["<unk>", "</s>", "▁a"]);
    out.push((g.b.clone(), g.fields.clone()));
    out
}

fn one(name: &str, ne: &[u64], ty: u32, off: u64, n: usize) -> Vec<u8> {
    let mut g = G::header(3, 1, 0);
    g.info(name, ne, ty, off);
    g.data(32, n)
}

fn kv_raw(f: impl FnOnce(&mut G)) -> Vec<u8> {
    let mut g = G::header(3, 0, 1);
    f(&mut g);
    g.b
}

/// Corpus of hostile GGUF files for `parse_gguf`.
pub fn cases() -> Vec<WCase> {
    let mut v = Vec::new();
    let (good, _) = valid_models().remove(0);
    for m in [
        &b"GGUX"[..],
        b"gguf",
        b"FUGG",
        b"GGML",
        b"GGJT",
        b"\0\0\0\0",
        b"\x89PNG",
        b"PK\x03\x04",
        b"GGU\xc6",
    ] {
        let mut b = good.clone();
        b[..4].copy_from_slice(m);
        v.push(wcase!("bad_magic", format!("{m:?}"), b, E::BadMagic { .. }));
    }
    for ver in [0u32, 1, 4, 5, 0x0300_0000, 0x0200_0000, u32::MAX, 1 << 31] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&ver.to_le_bytes());
        v.push(wcase!(
            "bad_version",
            format!("v{ver}"),
            b,
            E::UnsupportedVersion { .. }
        ));
    }
    // Tensor and kv counts negative (as i64) or huge.
    let huge = [
        u64::MAX,
        (-2i64) as u64,
        i64::MIN as u64,
        i64::MAX as u64,
        1 << 32,
        2_000_000,
        65_537,
        1_000,
        11,
    ];
    for n in huge {
        v.push(wcase!(
            "n_tensors_huge",
            format!("n_tensors {n}"),
            G::header(3, n, 0).data(32, 64),
            E::TooMany { .. }
        ));
        v.push(wcase!(
            "n_kv_huge",
            format!("n_kv {n}"),
            G::header(3, 0, n).data(32, 64),
            E::TooMany { .. }
        ));
    }
    // String lengths past the end (keys, string values, tensor names, array items).
    for len in [
        1u64 << 40,
        u32::MAX as u64,
        u64::MAX,
        i64::MAX as u64,
        1 << 63,
        200,
    ] {
        v.push(wcase!(
            "string_len_huge",
            format!("key len {len}"),
            kv_raw(|g| {
                g.u64(len).u32(8).u64(0);
            }),
            E::StringTooLong { .. }
        ));
        v.push(wcase!(
            "string_len_huge",
            format!("value len {len}"),
            kv_raw(|g| {
                g.s("k").u32(8).u64(len);
            }),
            E::StringTooLong { .. }
        ));
        v.push(wcase!(
            "string_len_huge",
            format!("array item len {len}"),
            kv_raw(|g| {
                g.s("k").u32(9).u32(8).u64(1).u64(len);
            }),
            E::StringTooLong { .. }
        ));
        let mut g = G::header(3, 1, 0);
        g.u64(len).u32(1).u64(1).u32(0).u64(0);
        v.push(wcase!(
            "string_len_huge",
            format!("tensor name len {len}"),
            g.data(32, 64),
            E::StringTooLong { .. }
        ));
    }
    // Array counts the file cannot hold.
    for (elem, count) in [
        (8u32, u64::MAX / 2),
        (12, 1 << 30),
        (0, 1 << 20),
        (6, u64::MAX),
        (10, 1 << 61),
        (7, 100),
    ] {
        v.push(wcase!(
            "array_count_huge",
            format!("type {elem} x {count}"),
            kv_raw(|g| {
                g.s("a").u32(9).u32(elem).u64(count).u64(0);
            }),
            E::TooMany { .. }
        ));
    }
    // Bad values: unknown types, nested arrays, bool bytes, key not UTF-8, alignment not an integer.
    for ty in [13u32, 14, 255, u32::MAX] {
        v.push(wcase!(
            "bad_value",
            format!("value type {ty}"),
            kv_raw(|g| {
                g.s("t").u32(ty).u64(0);
            }),
            E::BadValue { .. }
        ));
        v.push(wcase!(
            "bad_value",
            format!("array elem type {ty}"),
            kv_raw(|g| {
                g.s("t").u32(9).u32(ty).u64(0);
            }),
            E::BadValue { .. }
        ));
    }
    v.push(wcase!(
        "bad_value",
        "nested array",
        kv_raw(|g| {
            g.s("n").u32(9).u32(9).u64(1).u32(0).u64(0);
        }),
        E::BadValue { .. }
    ));
    for byte in [2u8, 0x80, 0xff] {
        v.push(wcase!(
            "bad_value",
            format!("bool {byte}"),
            kv_raw(|g| {
                g.s("b").u32(7);
                g.b.push(byte);
            }),
            E::BadValue { .. }
        ));
    }
    for key in [&[0xffu8, 0xfe][..], b"\xc3", b"a\xed\xa0\x80"] {
        v.push(wcase!(
            "bad_value",
            format!("key {key:?}"),
            kv_raw(|g| {
                g.raw_s(key).u32(4).u32(0);
            }),
            E::BadValue { .. }
        ));
    }
    v.push(wcase!(
        "bad_value",
        "alignment as string",
        kv_raw(|g| {
            g.kv_str("general.alignment", "32");
        }),
        E::BadValue { .. }
    ));
    v.push(wcase!(
        "bad_value",
        "alignment as f32",
        kv_raw(|g| {
            g.s("general.alignment").u32(6).u32(32f32.to_bits());
        }),
        E::BadValue { .. }
    ));
    v.push(wcase!(
        "bad_value",
        "alignment negative",
        kv_raw(|g| {
            g.s("general.alignment").u32(5).u32((-32i32) as u32);
        }),
        E::BadValue { .. }
    ));
    // Bad alignment values.
    for a in [0u32, 3, 5, 6, 48, 100, u32::MAX, 0x8000_0001] {
        v.push(wcase!(
            "bad_alignment",
            format!("alignment {a}"),
            kv_raw(|g| {
                g.kv_u32("general.alignment", a);
            }),
            E::BadAlignment { .. }
        ));
    }
    v.push(wcase!(
        "bad_alignment",
        "alignment u64::MAX",
        kv_raw(|g| {
            g.s("general.alignment").u32(10).u64(u64::MAX);
        }),
        E::BadAlignment { .. }
    ));
    // Dimensions: count, zero, huge, overflowing products, rows not whole blocks.
    for ne in [
        &[][..],
        &[1, 1, 1, 1, 1],
        &[2, 0],
        &[0],
        &[u64::MAX],
        &[1 << 63],
        &[1 << 32, 1 << 32],
        &[1 << 62, 4],
        &[1 << 21, 1 << 21, 1 << 21, 1 << 21],
    ] {
        v.push(wcase!(
            "dims_overflow",
            format!("ne {ne:?}"),
            one("a", ne, 0, 0, 64),
            E::BadShape { .. }
        ));
    }
    for n_dims in [0u32, 5, 64, u32::MAX] {
        let mut g = G::header(3, 1, 0);
        g.s("a")
            .u32(n_dims)
            .u64(2)
            .u64(2)
            .u64(2)
            .u64(2)
            .u64(2)
            .u32(0)
            .u64(0);
        v.push(wcase!(
            "dims_overflow",
            format!("n_dims {n_dims}"),
            g.data(32, 64),
            E::BadShape { .. }
        ));
    }
    for (ty, ne0) in [(8u32, 16u64), (2, 33), (12, 32), (14, 255), (3, 1)] {
        v.push(wcase!(
            "dims_overflow",
            format!("type {ty} row {ne0}"),
            one("a", &[ne0], ty, 0, 1024),
            E::BadShape { .. }
        ));
    }
    // Unknown ggml types.
    for ty in [4u32, 5, 31, 32, 33, 36, 37, 38, 43, 100, 1 << 16, u32::MAX] {
        v.push(wcase!(
            "unknown_dtype",
            format!("type {ty}"),
            one("a", &[32], ty, 0, 256),
            E::UnknownDType { .. }
        ));
    }
    // Misaligned offsets.
    for off in [1u64, 4, 16, 31, 33, u64::MAX] {
        v.push(wcase!(
            "misaligned",
            format!("offset {off}"),
            one("a", &[2], 0, off, 64),
            E::Misaligned { .. }
        ));
    }
    // Offsets past the end of the data section.
    for (ne, ty, off, n) in [
        (2u64, 0u32, 64u64, 8usize),
        (2, 0, 0, 7),
        (4, 0, 0, 15),
        (256, 12, 0, 143),
        (2, 0, u64::MAX - 31, 8),
        (2, 0, 1 << 62, 64),
        (32, 8, 32, 34),
        (1, 0, 0, 0),
    ] {
        v.push(wcase!(
            "offset_past_end",
            format!("ne {ne} type {ty} @{off} in {n}"),
            one("a", &[ne], ty, off, n),
            E::OffsetOutOfBounds { .. }
        ));
    }
    // Truncations: inside the header the cursor runs out; inside the data section a tensor does.
    let mut g = G::header(3, 2, 3);
    g.kv_str("general.name", "tiny")
        .kv_str_arr("tokenizer.ggml.tokens", &["<unk>", "</s>", "a"])
        .kv_f32_arr("tokenizer.ggml.scores", &[0.0, 0.0, -1.0]);
    g.info("blk.0.w", &[4, 2], 0, 0)
        .info("blk.0.b", &[16], 1, 32);
    let header_end = g.b.len();
    let data_start = header_end.div_ceil(32) * 32;
    for cut in 0..header_end {
        v.push(wcase!(
            "truncated_header",
            format!("cut at {cut}"),
            good[..cut].to_vec(),
            E::Truncated { .. } | E::StringTooLong { .. } | E::TooMany { .. }
        ));
    }
    for cut in data_start..good.len() {
        v.push(wcase!(
            "truncated_data",
            format!("cut at {cut}"),
            good[..cut].to_vec(),
            E::OffsetOutOfBounds { .. }
        ));
    }
    // Overlapping tensors; duplicate names and keys; bad names.
    for (ne_a, off_b) in [(16u64, 32u64), (9, 32), (8, 0), (64, 128)] {
        let mut g = G::header(3, 2, 0);
        g.info("a", &[ne_a], 0, 0).info("b", &[4], 0, off_b);
        v.push(wcase!(
            "overlap",
            format!("a[{ne_a}] b@{off_b}"),
            g.data(32, 512),
            E::Overlap { .. }
        ));
    }
    let mut g = G::header(3, 2, 0);
    g.info("a", &[2], 0, 0).info("a", &[2], 0, 32);
    v.push(wcase!(
        "duplicate_keys",
        "tensor name",
        g.data(32, 64),
        E::Duplicate { .. }
    ));
    let mut g = G::header(3, 0, 2);
    g.kv_u32("k", 1).kv_u32("k", 2);
    v.push(wcase!("duplicate_keys", "kv key", g.b, E::Duplicate { .. }));
    let mut g = G::header(3, 0, 2);
    g.kv_str("general.name", "a").kv_u32("general.name", 2);
    v.push(wcase!(
        "duplicate_keys",
        "kv key, other type",
        g.b,
        E::Duplicate { .. }
    ));
    for name in ["", &"n".repeat(128), &"é".repeat(64)] {
        v.push(wcase!(
            "bad_name",
            format!("name len {}", name.len()),
            one(name, &[2], 0, 0, 8),
            E::BadName { .. }
        ));
    }
    for raw in [&[0xffu8][..], b"a\xc3", b"\xed\xa0\x80"] {
        let mut g = G::header(3, 1, 0);
        g.raw_s(raw).u32(1).u64(2).u32(0).u64(0);
        v.push(wcase!(
            "bad_name",
            format!("name bytes {raw:?}"),
            g.data(32, 8),
            E::BadName { .. }
        ));
    }
    v
}
