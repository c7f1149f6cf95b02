//! Hostile and corrupt model files: each case must return its specific `WeightsError` variant,
//! and no mutation or truncation of a valid file may panic.

use std::path::{Path, PathBuf};

use sd_cli::weights::gguf::parse_gguf;
use sd_cli::weights::safetensors::{parse_index, parse_safetensors};
use sd_cli::weights::{TensorStore, WeightsError as E};

fn p() -> PathBuf {
    PathBuf::from("corrupt.bin")
}

/// A safetensors file with the given JSON header text and data bytes.
fn st(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

const OK_HEADER: &str = r#"{"__metadata__":{"a":"b"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F16","shape":[2],"data_offsets":[16,20]}}"#;

fn valid_st() -> Vec<u8> {
    st(OK_HEADER, &[7u8; 20])
}

macro_rules! expect {
    ($res:expr, $pat:pat $(if $guard:expr)?) => {{
        match $res {
            Err(e) => assert!(
                matches!(e, $pat $(if $guard)?),
                "got {e:?}, expected {}",
                stringify!($pat)
            ),
            Ok(_) => panic!("accepted, expected {}", stringify!($pat)),
        }
    }};
}

fn tensor_json(dtype: &str, shape: &str, begin: u64, end: u64) -> String {
    format!(r#"{{"w":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}}}"#)
}

#[test]
fn safetensors_corrupt_table() {
    let path = p();
    let parse = |b: &[u8]| parse_safetensors(b, &path);
    assert!(parse(&valid_st()).is_ok());

    expect!(parse(&[1, 2, 3]), E::Truncated { .. });
    let mut past = 1000u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    expect!(parse(&past), E::Truncated { .. });
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    expect!(parse(&huge), E::HeaderTooLarge { .. });
    let mut big = 200_000_000u64.to_le_bytes().to_vec();
    big.extend_from_slice(b"{}");
    expect!(parse(&big), E::HeaderTooLarge { .. });
    expect!(parse(&st(r#"{"w": "#, &[])), E::BadJson { .. });
    expect!(parse(&st("[1,2]", &[])), E::BadJson { .. });
    expect!(parse(&st("{\"w\":1}\u{0}", &[])), E::BadJson { .. });
    expect!(parse(&st(&"[".repeat(10_000), &[])), E::BadJson { .. });
    let mut bad_utf8 = st(r#"{"w":1}"#, &[]);
    bad_utf8[10] = 0xff;
    expect!(parse(&bad_utf8), E::BadJson { .. });
    let dup = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    expect!(parse(&st(dup, &[0; 8])), E::Duplicate { ref key, .. } if key == "w");
    expect!(parse(&st(&tensor_json("F7", "[1]", 0, 4), &[0; 4])), E::UnknownDType { ref dtype, .. } if dtype == "F7");
    expect!(
        parse(&st(&tensor_json("F4", "[2]", 0, 1), &[0; 1])),
        E::UnknownDType { .. }
    );
    expect!(
        parse(&st(&tensor_json("F32", "[-1]", 0, 4), &[0; 4])),
        E::BadShape { .. }
    );
    expect!(
        parse(&st(&tensor_json("F32", "[1.5]", 0, 4), &[0; 4])),
        E::BadShape { .. }
    );
    let overflow = "[4294967296,4294967296,4294967296]";
    expect!(
        parse(&st(&tensor_json("F32", overflow, 0, 4), &[0; 4])),
        E::BadShape { .. }
    );
    expect!(
        parse(&st(
            &tensor_json("F32", "[4611686018427387904]", 0, 4),
            &[0; 4]
        )),
        E::BadShape { .. }
    );
    expect!(
        parse(&st(&tensor_json("F32", "[2]", 0, 8), &[0; 4])),
        E::OffsetOutOfBounds { .. }
    );
    expect!(
        parse(&st(&tensor_json("F32", "[1]", 8, 4), &[0; 8])),
        E::OffsetOutOfBounds { .. }
    );
    let far = format!(
        r#"{{"w":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}}}"#,
        u64::MAX - 1,
        u64::MAX
    );
    expect!(parse(&st(&far, &[0; 8])), E::OffsetOutOfBounds { .. });
    expect!(
        parse(&st(&tensor_json("F32", "[3]", 0, 8), &[0; 12])),
        E::ShapeMismatch { .. }
    );
    expect!(
        parse(&st(&tensor_json("F32", "[2]", 0, 16), &[0; 16])),
        E::ShapeMismatch { .. }
    );
    let overlap = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    expect!(parse(&st(overlap, &[0; 12])), E::Overlap { .. });
    let no_offsets = r#"{"w":{"dtype":"F32","shape":[1]}}"#;
    expect!(parse(&st(no_offsets, &[0; 4])), E::BadHeader { .. });
    let three = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#;
    expect!(parse(&st(three, &[0; 8])), E::BadHeader { .. });
    expect!(parse(&st(r#"{"w":[1]}"#, &[])), E::BadHeader { .. });
    expect!(parse(&st(r#"{"__metadata__":[1]}"#, &[])), E::BadHeader { ref key, .. } if key == "__metadata__");
    // Truncated data: a valid header whose data was cut short.
    let mut cut = valid_st();
    cut.truncate(cut.len() - 3);
    expect!(parse(&cut), E::OffsetOutOfBounds { ref key, .. } if key == "b");
    // Empty tensors at the same offset are fine; non-string metadata values are skipped.
    let empties = r#"{"__metadata__":{"n":1,"s":"x"},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}}"#;
    let h = parse(&st(empties, &[])).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.metadata.len(), 1);
}

/// Little GGUF builder for corrupt files.
#[derive(Default)]
struct G(Vec<u8>);

impl G {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> G {
        let mut g = G(b"GGUF".to_vec());
        g.u32(version).u64(n_tensors).u64(n_kv);
        g
    }
    fn u32(&mut self, v: u32) -> &mut G {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut G {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn s(&mut self, v: &str) -> &mut G {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v.as_bytes());
        self
    }
    /// A u32 KV pair.
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut G {
        self.s(k).u32(4).u32(v)
    }
    /// A tensor info.
    fn info(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut G {
        self.s(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    fn data(&mut self, align: usize, n: usize) -> Vec<u8> {
        let mut v = self.0.clone();
        v.resize(v.len().div_ceil(align) * align, 0);
        v.extend(std::iter::repeat_n(0x11u8, n));
        v
    }
}

fn valid_gguf() -> Vec<u8> {
    let mut g = G::header(3, 2, 2);
    g.s("general.name").u32(8).s("tiny");
    g.s("tok").u32(9).u32(8).u64(2).s("a").s("b");
    g.info("a", &[4, 2], 0, 0).info("b", &[32], 8, 32);
    g.data(32, 32 + 34)
}

#[test]
fn gguf_corrupt_table() {
    let path = p();
    let parse = |b: &[u8]| parse_gguf(b, &path);
    let h = parse(&valid_gguf()).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.metadata.get_arr_str("tok"), Some(vec!["a", "b"]));

    expect!(parse(b"GGUX\x03\0\0\0"), E::BadMagic { .. });
    expect!(parse(b"GG"), E::Truncated { .. });
    expect!(
        parse(&G::header(1, 0, 0).0),
        E::UnsupportedVersion { version: 1, .. }
    );
    expect!(
        parse(&G::header(4, 0, 0).0),
        E::UnsupportedVersion { version: 4, .. }
    );
    expect!(
        parse(&G::header(0x0300_0000, 0, 0).0),
        E::UnsupportedVersion { .. }
    );
    expect!(parse(&b"GGUF\x03\0\0\0\x01"[..]), E::Truncated { .. });
    expect!(parse(&G::header(3, u64::MAX, 0).0), E::TooMany { .. });
    expect!(parse(&G::header(3, 2_000_000, 0).0), E::TooMany { .. });
    expect!(parse(&G::header(3, 0, u64::MAX).0), E::TooMany { .. });
    expect!(parse(&G::header(3, 10, 0).data(32, 64)), E::TooMany { .. });
    // Key and value string lengths past the end of the file.
    let mut g = G::header(3, 0, 1);
    g.u64(u64::MAX).u32(0).u64(0);
    expect!(parse(&g.0), E::StringTooLong { .. });
    let mut g = G::header(3, 0, 1);
    g.s("k").u32(8).u64(1 << 40);
    expect!(parse(&g.0), E::StringTooLong { .. });
    // Array counts the file cannot hold.
    let mut g = G::header(3, 0, 1);
    g.s("arr").u32(9).u32(8).u64(u64::MAX / 2);
    expect!(parse(&g.0), E::TooMany { .. });
    let mut g = G::header(3, 0, 1);
    g.s("arr").u32(9).u32(12).u64(1 << 30).u64(0);
    expect!(parse(&g.0), E::TooMany { .. });
    let mut g = G::header(3, 0, 1);
    g.s("nest").u32(9).u32(9).u64(1).u32(0).u64(0);
    expect!(parse(&g.0), E::BadValue { .. });
    let mut g = G::header(3, 0, 1);
    g.s("t").u32(13).u32(0);
    expect!(parse(&g.0), E::BadValue { .. });
    let mut g = G::header(3, 0, 1);
    g.s("arr").u32(9).u32(77).u64(0);
    expect!(parse(&g.0), E::BadValue { .. });
    let mut g = G::header(3, 0, 1);
    g.s("b").u32(7);
    g.0.push(2);
    expect!(parse(&g.0), E::BadValue { .. });
    let mut g = G::header(3, 0, 1);
    g.u64(2);
    g.0.extend_from_slice(&[0xff, 0xfe]);
    g.u32(4).u32(0);
    expect!(parse(&g.0), E::BadValue { .. });
    // Alignment.
    for bad in [0u32, 3, 48] {
        let mut g = G::header(3, 0, 1);
        g.kv_u32("general.alignment", bad);
        expect!(parse(&g.0), E::BadAlignment { .. });
    }
    let mut g = G::header(3, 0, 1);
    g.s("general.alignment").u32(8).s("32");
    expect!(parse(&g.0), E::BadValue { .. });
    let mut g = G::header(3, 0, 2);
    g.kv_u32("k", 1).kv_u32("k", 2);
    expect!(parse(&g.0), E::Duplicate { ref key, .. } if key == "k");
    // Tensor infos.
    let one = |name: &str, ne: &[u64], ty: u32, off: u64, n: usize| {
        let mut g = G::header(3, 1, 0);
        g.info(name, ne, ty, off);
        g.data(32, n)
    };
    assert!(parse(&one(&"n".repeat(127), &[2], 0, 0, 8)).is_ok());
    expect!(
        parse(&one(&"n".repeat(128), &[2], 0, 0, 8)),
        E::BadName { .. }
    );
    expect!(parse(&one("", &[2], 0, 0, 8)), E::BadName { .. });
    expect!(parse(&one("a", &[], 0, 0, 8)), E::BadShape { .. });
    expect!(
        parse(&one("a", &[1, 1, 1, 1, 1], 0, 0, 8)),
        E::BadShape { .. }
    );
    expect!(parse(&one("a", &[2, 0], 0, 0, 8)), E::BadShape { .. });
    expect!(parse(&one("a", &[u64::MAX], 0, 0, 8)), E::BadShape { .. });
    expect!(
        parse(&one("a", &[1 << 32, 1 << 32], 0, 0, 8)),
        E::BadShape { .. }
    );
    expect!(parse(&one("a", &[1 << 62], 0, 0, 8)), E::BadShape { .. });
    expect!(parse(&one("a", &[2], 4, 0, 8)), E::UnknownDType { .. });
    expect!(parse(&one("a", &[2], 99, 0, 8)), E::UnknownDType { .. });
    expect!(parse(&one("a", &[100], 12, 0, 1000)), E::BadShape { .. });
    expect!(parse(&one("a", &[2], 0, 16, 64)), E::Misaligned { .. });
    expect!(
        parse(&one("a", &[2], 0, 64, 8)),
        E::OffsetOutOfBounds { .. }
    );
    expect!(
        parse(&one("a", &[2], 0, u64::MAX - 31, 8)),
        E::OffsetOutOfBounds { .. }
    );
    expect!(
        parse(&one("a", &[256], 12, 0, 143)),
        E::OffsetOutOfBounds { .. }
    );
    expect!(
        parse(&one("a", &[4], 0, 0, 15)),
        E::OffsetOutOfBounds { .. }
    );
    let mut g = G::header(3, 2, 0);
    g.info("a", &[16], 0, 0).info("b", &[4], 0, 32);
    expect!(parse(&g.data(32, 64)), E::Overlap { .. });
    let mut g = G::header(3, 2, 0);
    g.info("a", &[2], 0, 0).info("a", &[2], 0, 32);
    expect!(parse(&g.data(32, 64)), E::Duplicate { ref key, .. } if key == "a");
    // Truncated data via a cut file.
    let mut cut = valid_gguf();
    cut.truncate(cut.len() - 1);
    expect!(parse(&cut), E::OffsetOutOfBounds { ref key, .. } if key == "b");
}

/// Every truncation and every single-byte corruption of valid files must return, not panic.
#[test]
fn mutations_never_panic() {
    let path = Path::new("fuzz.bin");
    let files = [valid_gguf(), valid_st()];
    for (i, good) in files.iter().enumerate() {
        let parse = |b: &[u8]| {
            if i == 0 {
                parse_gguf(b, path).map(|_| ())
            } else {
                parse_safetensors(b, path).map(|_| ())
            }
        };
        assert!(parse(good).is_ok());
        for n in 0..good.len() {
            assert!(
                parse(&good[..n]).is_err(),
                "file {i}: prefix of {n} bytes accepted"
            );
        }
        for pos in 0..good.len() {
            for v in [0x00u8, 0xff, 0x7f, 0x80, 0x01, b'[', b'"'] {
                let mut bad = good.clone();
                bad[pos] = v;
                let _ = parse(&bad);
            }
        }
    }
}

#[test]
fn store_level_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    expect!(
        TensorStore::open(&write("junk.bin", &[0xab; 64])),
        E::BadMagic { .. }
    );
    expect!(
        TensorStore::open(&write("tiny.bin", b"GG")),
        E::BadMagic { .. }
    );
    expect!(
        TensorStore::open(&write("empty.bin", b"")),
        E::BadMagic { .. }
    );
    expect!(
        TensorStore::open(&dir.path().join("absent.gguf")),
        E::Io { .. }
    );
    // More than 4 dims that cannot be squeezed.
    let six = tensor_json("F32", "[2,1,1,1,1,2]", 0, 16);
    expect!(
        TensorStore::open(&write("six.safetensors", &st(&six, &[0; 16]))),
        E::BadShape { .. }
    );
    // A GGUF error surfaces through the store with the file's path.
    let mut bad = valid_gguf();
    bad.truncate(bad.len() - 1);
    match TensorStore::open(&write("cut.gguf", &bad)) {
        Err(E::OffsetOutOfBounds { path, .. }) => assert!(path.ends_with("cut.gguf")),
        other => panic!("{other:?}"),
    }
    // Index files.
    let shard = write("s.safetensors", &valid_st());
    let _ = shard;
    let idx = |body: &str| write("m.safetensors.index.json", body.as_bytes());
    expect!(
        TensorStore::open(&idx(r#"{"weight_map":{"w":"../s.safetensors"}}"#)),
        E::BadIndex { .. }
    );
    expect!(
        TensorStore::open(&idx(r#"{"weight_map":{"w":"/etc/passwd"}}"#)),
        E::BadIndex { .. }
    );
    expect!(
        TensorStore::open(&idx(r#"{"weight_map":{"w":3}}"#)),
        E::BadIndex { .. }
    );
    expect!(
        TensorStore::open(&idx(r#"{"metadata":{}}"#)),
        E::BadIndex { .. }
    );
    expect!(
        TensorStore::open(&idx(r#"{"weight_map":[1]}"#)),
        E::BadIndex { .. }
    );
    expect!(
        TensorStore::open(&idx(
            r#"{"weight_map":{"w":"s.safetensors","w":"s.safetensors"}}"#
        )),
        E::Duplicate { .. }
    );
    expect!(TensorStore::open(&idx(r#"{"weight_map":{"zz":"s.safetensors"}}"#)), E::MissingTensor { ref key, .. } if key == "zz");
    expect!(
        TensorStore::open(&idx(r#"{"weight_map":{"w":"absent.safetensors"}}"#)),
        E::Io { .. }
    );
    let store = TensorStore::open(&idx(
        r#"{"weight_map":{"w":"s.safetensors","b":"s.safetensors"}}"#,
    ))
    .unwrap();
    assert_eq!(store.len(), 2);
    expect!(parse_index(b"{", Path::new("x.json")), E::BadJson { .. });
    // Folder with a broken config.json.
    let sub = dir.path().join("folder");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("model.safetensors"), valid_st()).unwrap();
    std::fs::write(sub.join("config.json"), b"{oops").unwrap();
    expect!(TensorStore::open(&sub), E::BadJson { .. });
}
