//! Hostile safetensors files, by class, each with the `WeightsError` variant it must produce.

use sd_cli::weights::WeightsError as E;

use super::{Case, Field};

/// A weights case and the variant it must produce.
pub struct WCase {
    pub case: Case,
    /// Name of the expected variant (for messages).
    pub variant: &'static str,
    pub expect: fn(&E) -> bool,
}

macro_rules! wcase {
    ($class:expr, $name:expr, $bytes:expr, $pat:pat) => {
        WCase {
            case: Case::new($class, $name, $bytes),
            variant: stringify!($pat),
            expect: |e| matches!(e, $pat),
        }
    };
}
pub(crate) use wcase;

/// `u64 LE len` + header + data.
pub fn st_raw(len: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = len.to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

pub fn st(header: &str, data: &[u8]) -> Vec<u8> {
    st_raw(header.len() as u64, header.as_bytes(), data)
}

fn f32s(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i as u32 * 7 + seed) as f32 / 13.0 - 1.0).to_le_bytes())
        .collect()
}

/// Valid tiny models: (header JSON, data).
pub fn valid_models() -> Vec<(String, Vec<u8>)> {
    let a = r#"{"__metadata__":{"format":"pt"},"blocks.0.weight":{"dtype":"F32","shape":[4,2],"data_offsets":[0,32]},"blocks.0.bias":{"dtype":"F16","shape":[4],"data_offsets":[32,40]}}"#;
    let b = r#"{"x":{"dtype":"BF16","shape":[2,2,2],"data_offsets":[0,16]},"y":{"dtype":"I64","shape":[2],"data_offsets":[16,32]},"z":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[32,36]},"u":{"dtype":"U8","shape":[3],"data_offsets":[36,39]}}"#;
    let c = r#"{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},"f":{"dtype":"F64","shape":[1,1,1,1,1,2],"data_offsets":[4,20]}}"#;
    vec![
        (a.to_string(), f32s(10, 1)),
        (b.to_string(), f32s(10, 2)[..39].to_vec()),
        (c.to_string(), f32s(5, 3)),
    ]
}

/// The header-length field of every safetensors file.
pub fn fields() -> Vec<Field> {
    vec![Field { at: 0, width: 8 }]
}

/// One tensor `w` with the given dtype, shape text and offsets.
fn one(dtype: &str, shape: &str, begin: &str, end: &str) -> String {
    format!(r#"{{"w":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}}}"#)
}

/// Replaces the `k`-th run of ASCII digits in `text` with `with`.
fn replace_number(text: &str, k: usize, with: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let s = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            runs.push((s, i));
        } else {
            i += 1;
        }
    }
    let (s, e) = *runs.get(k)?;
    Some(format!("{}{}{}", &text[..s], with, &text[e..]))
}

/// Corpus of hostile safetensors files for `parse_safetensors` (every class of the issue).
pub fn cases() -> Vec<WCase> {
    let mut v = Vec::new();
    let (good_h, good_d) = valid_models().remove(0);
    let good = st(&good_h, &good_d);
    let flen = good.len() as u64;

    // Header length past the end of the file (but under the cap).
    for len in [
        good_h.len() as u64 + good_d.len() as u64 + 1,
        flen,
        flen + 1,
        1 << 20,
        99_999_999,
        100_000_000,
    ] {
        v.push(wcase!(
            "header_len_past_end",
            format!("len {len}"),
            st_raw(len, good_h.as_bytes(), &good_d),
            E::Truncated { .. }
        ));
    }
    for n in 0..8 {
        v.push(wcase!(
            "header_len_past_end",
            format!("{n}-byte file"),
            good[..n].to_vec(),
            E::Truncated { .. }
        ));
    }
    // Header length over the cap.
    for len in [
        100_000_001u64,
        1 << 32,
        1 << 40,
        i64::MAX as u64,
        1 << 63,
        u64::MAX,
        (-1i64 - 7) as u64,
    ] {
        v.push(wcase!(
            "header_len_huge",
            format!("len {len}"),
            st_raw(len, good_h.as_bytes(), &good_d),
            E::HeaderTooLarge { .. }
        ));
    }
    // Invalid JSON: every strict prefix of a valid header, plus hand-made breakage.
    for cut in 0..good_h.len() {
        v.push(wcase!(
            "invalid_json",
            format!("header prefix {cut}"),
            st(&good_h[..cut], &[]),
            E::BadJson { .. }
        ));
    }
    let broken: &[&[u8]] = &[
        b"",
        b" ",
        b"null",
        b"[]",
        b"[1,2]",
        b"\"str\"",
        b"42",
        b"true",
        b"{,}",
        b"{\"w\"}",
        b"{\"w\":}",
        b"{'w':1}",
        b"{\"w\":1,}",
        b"{\"w\":1}x",
        b"{\"w\":1}\x00",
        b"{/*c*/}",
        b"{\"w\":NaN}",
        b"{\"w\":1e999}",
        b"{\"\xff\xfe\":1}",
        b"{\"w\":\"\xc3\"}",
        b"{\"w\":\"\\ud800\"}",
        b"\xef\xbb\xbf{}",
        b"{\"a\":1 \"b\":2}",
        b"{\"w\":[1,2}",
        b"{\"w\":-}",
    ];
    for (i, h) in broken.iter().enumerate() {
        v.push(wcase!(
            "invalid_json",
            format!("broken #{i}"),
            st_raw(h.len() as u64, h, &[]),
            E::BadJson { .. }
        ));
    }
    for depth in [129usize, 1_000, 100_000] {
        let h = format!("{{\"w\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        v.push(wcase!(
            "invalid_json",
            format!("nesting {depth}"),
            st(&h, &[]),
            E::BadJson { .. }
        ));
    }
    // Duplicate keys.
    let t = |n: &str, b: u64| {
        format!(
            r#""{n}":{{"dtype":"F32","shape":[1],"data_offsets":[{b},{}]}}"#,
            b + 4
        )
    };
    for (i, h) in [
        format!("{{{},{}}}", t("w", 0), t("w", 4)),
        format!("{{{},{},{}}}", t("a", 0), t("b", 4), t("a", 8)),
        format!(
            r#"{{"__metadata__":{{}},{},"__metadata__":{{}}}}"#,
            t("w", 0)
        ),
        format!(
            "{{{},{}}}",
            t("blocks.0.weight", 0),
            t("blocks.0.weight", 0)
        ),
        format!("{{{},{}}}", t("\u{e9}", 0), t("\u{e9}", 4)),
        format!("{{{},{}}}", t("e\\u0301", 0), t("e\u{301}", 4)),
    ]
    .iter()
    .enumerate()
    {
        v.push(wcase!(
            "duplicate_keys",
            format!("dup #{i}"),
            st(h, &[0; 12]),
            E::Duplicate { .. }
        ));
    }
    // Unknown dtype.
    for d in [
        "F7",
        "f32",
        "",
        "Q8_0",
        "F4",
        "INT8",
        "F32 ",
        "\u{1F600}",
        "F8_E4M3FN",
        "C64",
        "STRING",
        &"X".repeat(5000),
    ] {
        v.push(wcase!(
            "unknown_dtype",
            format!("dtype {d:.20}"),
            st(&one(d, "[1]", "0", "4"), &[0; 4]),
            E::UnknownDType { .. }
        ));
    }
    // Malformed entries.
    for (i, h) in [
        r#"{"w":1}"#,
        r#"{"w":[]}"#,
        r#"{"w":null}"#,
        r#"{"w":{}}"#,
        r#"{"w":{"dtype":3,"shape":[1],"data_offsets":[0,4]}}"#,
        r#"{"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":"0-4"}}"#,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0.0,4.0]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,1e3]}}"#,
        r#"{"__metadata__":[1]}"#,
        r#"{"__metadata__":"x"}"#,
        r#"{"__metadata__":null}"#,
    ]
    .iter()
    .enumerate()
    {
        v.push(wcase!(
            "malformed_entry",
            format!("entry #{i}"),
            st(h, &[0; 8]),
            E::BadHeader { .. }
        ));
    }
    // Dimensions: negative, fractional, non-numbers, overflowing element or byte counts.
    for shape in [
        "[-1]",
        "[1.5]",
        "[\"2\"]",
        "[[1]]",
        "[null]",
        "[1e3]",
        "[2,-2]",
        "[4294967296,4294967296,4294967296]",
        "[4611686018427387904]",
        "[18446744073709551615]",
        "[9223372036854775807,3]",
        "[65536,65536,65536,65536]",
        "[18446744073709551616]",
        "[0,4611686018427387904]",
        "[0,9223372036854775807,2]",
        "[2305843009213693952,0]",
    ] {
        v.push(wcase!(
            "dims_overflow",
            format!("shape {shape}"),
            st(&one("F32", shape, "0", "4"), &[0; 4]),
            E::BadShape { .. }
        ));
    }
    // Offsets past the end or reversed.
    let u = u64::MAX.to_string();
    for (b, e, n) in [
        ("0", "8", 4usize),
        ("4", "8", 4),
        ("0", "5", 4),
        ("8", "4", 8),
        ("9", "5", 16),
        ("18446744073709551614", &u, 8),
        ("0", &u, 8),
        ("4294967296", "4294967300", 8),
        ("0", "4", 0),
        ("4", "4", 3),
        ("100", "104", 99),
    ] {
        v.push(wcase!(
            "offset_past_end",
            format!("[{b},{e}] of {n}"),
            st(&one("F32", "[1]", b, e), &vec![0; n]),
            E::OffsetOutOfBounds { .. }
        ));
    }
    // Truncated data: a valid file cut inside its data section.
    let data_start = 8 + good_h.len();
    for cut in data_start..good.len() {
        v.push(wcase!(
            "truncated_data",
            format!("cut at {cut}"),
            good[..cut].to_vec(),
            E::OffsetOutOfBounds { .. }
        ));
    }
    // Truncated header: cut inside the JSON text (the length field then points past the end).
    for cut in 8..data_start {
        v.push(wcase!(
            "truncated_header",
            format!("cut at {cut}"),
            good[..cut].to_vec(),
            E::Truncated { .. }
        ));
    }
    // Shape / size mismatch.
    for (d, shape, end) in [
        ("F32", "[3]", 8),
        ("F32", "[2]", 16),
        ("F32", "[2,2]", 12),
        ("F16", "[4]", 4),
        ("BF16", "[1]", 4),
        ("F32", "[]", 8),
        ("F32", "[0]", 4),
        ("I64", "[1]", 4),
        ("F8_E4M3", "[4]", 8),
        ("F64", "[2]", 8),
        ("F32", "[1,1,1,1,1,3]", 8),
    ] {
        v.push(wcase!(
            "shape_size_mismatch",
            format!("{d} {shape} in {end}"),
            st(&one(d, shape, "0", &end.to_string()), &[0; 16]),
            E::ShapeMismatch { .. }
        ));
    }
    // Overlapping data ranges.
    for (b1, e1, b2, e2) in [
        (0, 8, 4, 12),
        (0, 8, 0, 8),
        (4, 12, 0, 8),
        (0, 16, 4, 8),
        (8, 12, 0, 12),
    ] {
        let h = format!(
            r#"{{"a":{{"dtype":"F32","shape":[{}],"data_offsets":[{b1},{e1}]}},"b":{{"dtype":"F32","shape":[{}],"data_offsets":[{b2},{e2}]}}}}"#,
            (e1 - b1) / 4,
            (e2 - b2) / 4
        );
        v.push(wcase!(
            "overlap",
            format!("[{b1},{e1}] [{b2},{e2}]"),
            st(&h, &[0; 16]),
            E::Overlap { .. }
        ));
    }
    v
}

/// Every numeric token of each valid header replaced with hostile numbers (header length
/// kept consistent). Any error or success is acceptable; panics are not.
pub fn number_edits() -> Vec<Case> {
    let mut out = Vec::new();
    for (m, (h, d)) in valid_models().iter().enumerate() {
        for k in 0.. {
            let mut any = false;
            for with in [
                "0",
                "1",
                "3",
                "4294967295",
                "4294967296",
                "9223372036854775807",
                "18446744073709551615",
                "18446744073709551616",
                "-1",
                "1.0",
                "99999999999999999999999",
            ] {
                if let Some(h2) = replace_number(h, k, with) {
                    any = true;
                    out.push(Case::new(
                        "number_edit",
                        format!("model {m} number {k} = {with}"),
                        st(&h2, d),
                    ));
                }
            }
            if !any {
                break;
            }
        }
    }
    out
}
