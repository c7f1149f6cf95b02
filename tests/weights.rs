//! Integration tests of the model-file layer: reference files written by Python's `safetensors`
//! and `gguf` packages (tests/reference/weights_fixtures.py) read back byte-exactly, writer
//! round trips, and a table of corrupt inputs that must each give their specific error.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use sd_cli::dtype::DType;
use sd_cli::pipeline::components::{ComponentId, ComponentStore};
use sd_cli::pipeline::registry;
use sd_cli::weights::gguf::{parse_gguf, GgufType, GgufValue, GgufWriter};
use sd_cli::weights::names::Component;
use sd_cli::weights::safetensors::{parse_safetensors, write_safetensors, SafetensorsItem};
use sd_cli::weights::{to_f32, FileFormat, SourceDType, TensorStore, WeightsError};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/weights")
        .join(rel)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Expected f32 list from JSON ("nan", "inf", "-inf" are spelled as strings).
fn json_f32(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| match (x.as_f64(), x.as_str()) {
            (Some(f), _) => f as f32,
            (None, Some("inf")) => f32::INFINITY,
            (None, Some("-inf")) => f32::NEG_INFINITY,
            (None, Some("nan")) => f32::NAN,
            _ => panic!("bad expected value {x}"),
        })
        .collect()
}

fn same_f32(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

// ---------------------------------------------------------------------------------------------
// Reference files (written by Python's safetensors / gguf)
// ---------------------------------------------------------------------------------------------

#[test]
fn reads_python_safetensors_exactly() {
    let path = fixture("ref.safetensors");
    let expected = read_json(&fixture("ref.safetensors.expected.json"));
    let store = TensorStore::open(&path).unwrap();
    let raw = std::fs::read(&path).unwrap();
    let header = parse_safetensors(&raw, &path).unwrap();

    let meta: BTreeMap<String, String> =
        serde_json::from_value(expected["metadata"].clone()).unwrap();
    assert_eq!(store.files()[0].safetensors, meta);
    assert_eq!(store.files()[0].format, FileFormat::Safetensors);
    assert_eq!(store.meta_str("note"), Some("weights fixture"));

    let tensors = expected["tensors"].as_object().unwrap();
    assert_eq!(header.tensors.len(), tensors.len());
    let mut checked = 0;
    for (name, want) in tensors {
        let dtype = want["dtype"].as_str().unwrap();
        let src = SourceDType::from_safetensors(dtype).unwrap();
        let torch_shape: Vec<usize> = serde_json::from_value(want["shape"].clone()).unwrap();
        let want_f32 = json_f32(&want["f32"]);
        let entry = header.tensors.iter().find(|e| &e.name == name).unwrap();
        let bytes = &raw[entry.offset as usize..(entry.offset + entry.len) as usize];
        assert_eq!(hex(bytes), want["hex"].as_str().unwrap(), "{name}");
        // Our CPU conversion must agree bit-for-bit with torch's `.float()`.
        assert!(
            same_f32(&to_f32(src, bytes).unwrap(), &want_f32),
            "{name} ({dtype}) values"
        );

        match store.get(name) {
            None => {
                assert!(matches!(dtype, "U8" | "BOOL"), "{name} missing");
                assert!(store.skipped().iter().any(|(n, s)| n == name && *s == src));
            }
            Some(info) => {
                assert_eq!(info.source, src);
                assert_eq!(Some(info.dtype), src.load_dtype());
                assert_eq!(
                    hex(store.get_bytes(info).unwrap()),
                    want["hex"].as_str().unwrap()
                );
                // ggml order = reversed PyTorch order, with outer size-1 dims squeezed past 4.
                let mut squeezed = &torch_shape[..];
                while squeezed.len() > 4 && squeezed[0] == 1 {
                    squeezed = &squeezed[1..];
                }
                let mut ne: Vec<usize> = squeezed.iter().rev().copied().collect();
                if ne.is_empty() {
                    ne.push(1);
                }
                assert_eq!(info.shape(), &ne[..], "{name}");
                assert_eq!(info.numel(), want_f32.len(), "{name}");
                let f = store.to_f32(info).unwrap();
                assert!(same_f32(&f, &want_f32));
                checked += 1;
            }
        }
    }
    assert_eq!(checked, tensors.len() - 2);
}

#[test]
fn safetensors_load_conversions() {
    let store = TensorStore::open(&fixture("ref.safetensors")).unwrap();
    // F8 -> F16 is exact: every E4M3/E5M2 value is an f16 value.
    for name in ["f8_e4m3", "f8_e5m2"] {
        let info = store.get(name).unwrap();
        assert_eq!(info.dtype, DType::F16);
        let loaded = store.load_bytes(info).unwrap();
        assert_eq!(loaded.len(), info.load_len());
        let back = to_f32(SourceDType::Ggml(DType::F16), &loaded).unwrap();
        assert!(same_f32(&back, &store.to_f32(info).unwrap()), "{name}");
    }
    // F64 -> F32 rounds like torch's `.float()`.
    let f64i = store.get("f64").unwrap();
    assert_eq!(f64i.dtype, DType::F32);
    let l = store.load_bytes(f64i).unwrap();
    assert!(same_f32(
        &to_f32(SourceDType::Ggml(DType::F32), &l).unwrap(),
        &store.to_f32(f64i).unwrap()
    ));
    // I64 -> I32 saturates (2^40 does not fit).
    let i64i = store.get("i64").unwrap();
    assert_eq!(i64i.dtype, DType::I32);
    let l = store.load_bytes(i64i).unwrap();
    let got: Vec<i32> = l
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, vec![0, -3, i32::MAX]);
    // Unchanged types are borrowed, not copied.
    let f = store.get("f16").unwrap();
    assert!(matches!(store.load_bytes(f).unwrap(), Cow::Borrowed(_)));
}

fn check_gguf_reference(file: &str) {
    let path = fixture(file);
    let expected = read_json(&fixture(&format!("{file}.expected.json")));
    let store = TensorStore::open(&path).unwrap();
    let meta = &store.files()[0];
    assert_eq!(meta.format, FileFormat::Gguf);
    let kv = &meta.gguf;
    assert_eq!(kv.get_u32("t.u8"), Some(200));
    assert_eq!(kv.get("t.u8").unwrap().ty(), GgufType::U8);
    assert_eq!(kv.get_i32("t.i8"), Some(-5));
    assert_eq!(kv.get_u32("t.u16"), Some(65000));
    assert_eq!(kv.get_i32("t.i16"), Some(-30000));
    assert_eq!(kv.get_u32("t.u32"), Some(4_000_000_000));
    assert_eq!(kv.get_i32("t.i32"), Some(-2_000_000_000));
    assert_eq!(kv.get_f32("t.f32"), Some(0.25));
    assert_eq!(kv.get_bool("t.bool"), Some(true));
    assert_eq!(kv.get_str("t.str"), Some("héllo"));
    assert_eq!(kv.get_u64("t.u64"), Some((1u64 << 63) + 5));
    assert_eq!(kv.get_u32("t.u64"), None);
    assert_eq!(kv.get_i64("t.i64"), Some(-(1i64 << 40)));
    assert_eq!(kv.get("t.f64"), Some(&GgufValue::F64(1.0 / 3.0)));
    assert_eq!(kv.get_arr_str("t.arr_str"), Some(vec!["a", "bc", ""]));
    assert_eq!(kv.get_arr_i32("t.arr_i32"), Some(vec![1, -2, 3]));
    assert_eq!(kv.get_arr_f32("t.arr_f32"), Some(vec![0.5, -1.5]));
    assert_eq!(kv.get_str("general.architecture"), Some("pixart"));
    assert_eq!(store.meta_str("general.architecture"), Some("pixart"));

    let raw = std::fs::read(&path).unwrap();
    let header = parse_gguf(&raw, &path).unwrap();
    assert_eq!(header.version, 3);
    assert_eq!(header.alignment, expected["alignment"].as_u64().unwrap());
    let want = expected["tensors"].as_array().unwrap();
    assert_eq!(store.len(), want.len());
    for (t, w) in store.iter().zip(want) {
        assert_eq!(t.name, w["name"].as_str().unwrap());
        assert_eq!(u64::from(t.dtype.id()), w["type"].as_u64().unwrap());
        let ne: Vec<usize> = serde_json::from_value(w["ne"].clone()).unwrap();
        assert_eq!(t.shape(), &ne[..]);
        assert_eq!(t.offset as u64 % header.alignment, 0);
        assert_eq!(
            hex(store.get_bytes(t).unwrap()),
            w["hex"].as_str().unwrap(),
            "{}",
            t.name
        );
        assert_eq!(t.len, t.load_len());
    }
    // The file holds PixArt's original names: the registry recognises the family.
    let dit = ComponentStore::open(ComponentId::Diffusion, &path, false).unwrap();
    assert_eq!(registry::detect(&dit).map(|f| f.id()), Some("pixart"));

    // Our writer reproduces gguf-py's file byte for byte from what our reader returned.
    let mut w = GgufWriter::new();
    for (k, v) in kv.iter() {
        w.add_kv(k, v.clone()).unwrap();
    }
    for t in store.iter() {
        let ne: Vec<u64> = t.shape().iter().map(|&n| n as u64).collect();
        w.add_tensor(&t.name, t.dtype, &ne).unwrap();
    }
    let tensors: Vec<_> = store.iter().cloned().collect();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rewritten.gguf");
    w.write_with(&out, |i| store.get_bytes(&tensors[i]).map(Cow::Borrowed))
        .unwrap();
    assert!(
        std::fs::read(&out).unwrap() == raw,
        "rewritten {file} differs from gguf-py's"
    );
}

#[test]
fn reads_python_gguf_exactly() {
    check_gguf_reference("ref.gguf");
}

#[test]
fn reads_python_gguf_with_alignment_64() {
    check_gguf_reference("ref_align64.gguf");
}

#[test]
fn reads_sharded_index_and_prefixes() {
    let expected = read_json(&fixture("sharded/expected.json"));
    let mut store = TensorStore::new();
    let t5 = Component::T5.prefix();
    store
        .add_file(&fixture("sharded/model.safetensors.index.json"), t5)
        .unwrap();
    assert_eq!(store.files().len(), 2);
    for (name, want) in expected["tensors"].as_object().unwrap() {
        let info = store.require(&format!("{t5}{name}")).unwrap();
        assert_eq!(
            hex(store.get_bytes(info).unwrap()),
            want["hex"].as_str().unwrap()
        );
    }
    // The shards are a T5 encoder under the T5 prefix, and nothing else.
    assert!(registry::what_it_is(&store, t5).is_some_and(|w| w.contains("T5")));
    assert_eq!(registry::what_it_is(&store, Component::Vae.prefix()), None);
    let err = store
        .require("text_encoders.t5xxl.transformer.nope")
        .unwrap_err();
    assert!(matches!(err, WeightsError::MissingTensor { ref key, .. } if key.ends_with("nope")));

    // Several components in one store; a name clash across files is rejected.
    store
        .add_file(&fixture("vae_folder"), Component::Vae.prefix())
        .unwrap();
    assert!(store.contains("first_stage_model.decoder.conv_in.weight"));
    let again = store.add_file(&fixture("vae_folder"), Component::Vae.prefix());
    assert!(matches!(again, Err(WeightsError::Duplicate { .. })));
    assert_eq!(store.files().len(), 3);
}

#[test]
fn reads_diffusers_folder_with_config() {
    let expected = read_json(&fixture("vae_folder/expected.json"));
    let store = TensorStore::open(&fixture("vae_folder")).unwrap();
    let config = store.files()[0].config.as_ref().unwrap();
    assert_eq!(config["latent_channels"], 4);
    assert_eq!(config["_class_name"], "AutoencoderKL");
    for (name, want) in expected["tensors"].as_object().unwrap() {
        let info = store.get(name).unwrap();
        let torch: Vec<usize> = serde_json::from_value(want["shape"].clone()).unwrap();
        let ne: Vec<usize> = torch.iter().rev().copied().collect();
        assert_eq!(info.shape(), &ne[..]);
        assert!(same_f32(
            &store.to_f32(info).unwrap(),
            &json_f32(&want["f32"])
        ));
    }
    assert!(registry::what_it_is(&store, "").is_some_and(|w| w.contains("VAE")));
    // The weights file inside the folder reads the config beside it; a file with another
    // name in a folder with a config.json does not (the config may not be its own).
    let file =
        TensorStore::open(&fixture("vae_folder/diffusion_pytorch_model.safetensors")).unwrap();
    assert_eq!(file.files()[0].config.as_ref(), Some(config));
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("vae_folder/config.json"),
        tmp.path().join("config.json"),
    )
    .unwrap();
    let other = tmp.path().join("ae.safetensors");
    std::fs::copy(
        fixture("vae_folder/diffusion_pytorch_model.safetensors"),
        &other,
    )
    .unwrap();
    assert!(TensorStore::open(&other).unwrap().files()[0]
        .config
        .is_none());
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        TensorStore::open(empty.path()),
        Err(WeightsError::NotAModel { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Writers
// ---------------------------------------------------------------------------------------------

#[test]
fn gguf_writer_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.gguf");
    let mut w = GgufWriter::new();
    let values = [
        ("a.u8", GgufValue::U8(7)),
        ("a.i8", GgufValue::I8(-7)),
        ("a.u16", GgufValue::U16(700)),
        ("a.i16", GgufValue::I16(-700)),
        ("a.u32", GgufValue::U32(70000)),
        ("a.i32", GgufValue::I32(-70000)),
        ("a.f32", GgufValue::F32(1.5)),
        ("a.bool", GgufValue::Bool(false)),
        ("a.str", GgufValue::String("ünïcode".into())),
        ("a.u64", GgufValue::U64(u64::MAX)),
        ("a.i64", GgufValue::I64(i64::MIN)),
        ("a.f64", GgufValue::F64(-2.5)),
        (
            "a.arr",
            GgufValue::Array(GgufType::String, vec![GgufValue::String("x".into())]),
        ),
        ("a.empty", GgufValue::Array(GgufType::U8, vec![])),
        ("general.alignment", GgufValue::U32(64)),
    ];
    for (k, v) in &values {
        w.add_kv(*k, v.clone()).unwrap();
    }
    let specs: [(&str, DType, &[u64]); 5] = [
        ("w.f32", DType::F32, &[3, 2]),
        ("w.f16", DType::F16, &[5]),
        ("w.q8", DType::Q8_0, &[64, 2]),
        ("w.q4k", DType::Q4_K, &[256, 1, 2]),
        ("w.i32", DType::I32, &[1, 1, 1, 3]),
    ];
    let mut datas = Vec::new();
    for (i, (name, dtype, ne)) in specs.iter().enumerate() {
        assert_eq!(w.add_tensor(name, *dtype, ne).unwrap(), i);
        let len = dtype.nbytes(ne).unwrap() as usize;
        datas.push(
            (0..len)
                .map(|j| (j * 31 + i * 7) as u8)
                .collect::<Vec<u8>>(),
        );
    }
    let refs: Vec<&[u8]> = datas.iter().map(Vec::as_slice).collect();
    w.write(&path, &refs).unwrap();

    let store = TensorStore::open(&path).unwrap();
    let kv = &store.files()[0].gguf;
    for (k, v) in &values {
        assert_eq!(kv.get(k), Some(v), "{k}");
    }
    assert_eq!(kv.len(), values.len());
    for ((name, dtype, ne), data) in specs.iter().zip(&datas) {
        let t = store.require(name).unwrap();
        assert_eq!(t.dtype, *dtype);
        let got: Vec<u64> = t.shape().iter().map(|&n| n as u64).collect();
        assert_eq!(&got[..], *ne);
        assert_eq!(t.offset % 64, 0);
        assert_eq!(store.get_bytes(t).unwrap(), &data[..]);
    }
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    // Writer-side validation.
    let mut w = GgufWriter::new();
    assert!(w.add_tensor("bad", DType::Q4_K, &[100]).is_err());
    assert!(w.add_tensor(&"n".repeat(128), DType::F32, &[1]).is_err());
    assert!(w.add_tensor("z", DType::F32, &[0]).is_err());
    assert!(w.add_kv("general.alignment", GgufValue::U32(3)).is_err());
    w.add_tensor("x", DType::F32, &[2]).unwrap();
    assert!(w.add_tensor("x", DType::F32, &[2]).is_err());
    assert!(GgufWriter::new()
        .add_tensor(&"m".repeat(127), DType::F32, &[1])
        .is_ok());
    let short = w.write(&dir.path().join("short.gguf"), &[&[0u8; 4]]);
    assert!(matches!(short, Err(WeightsError::ShapeMismatch { .. })));
    assert!(!dir.path().join("short.gguf").exists());
}

#[test]
fn safetensors_writer_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.safetensors");
    let a: Vec<u8> = (0..24).collect();
    let b: Vec<u8> = vec![0x00, 0x3c, 0x00, 0xbc]; // f16 1.0, -1.0
    let items = [
        SafetensorsItem {
            name: "b.weight",
            dtype: "F32",
            shape: &[2, 3],
            data: &a,
        },
        SafetensorsItem {
            name: "a.bias",
            dtype: "F16",
            shape: &[2],
            data: &b,
        },
    ];
    let meta = BTreeMap::from([("k".to_string(), "v".to_string())]);
    write_safetensors(&path, &meta, &items).unwrap();
    let store = TensorStore::open(&path).unwrap();
    assert_eq!(store.files()[0].safetensors, meta);
    assert_eq!(
        store.get_bytes(store.get("b.weight").unwrap()).unwrap(),
        &a[..]
    );
    assert_eq!(store.get("b.weight").unwrap().shape(), &[3, 2]);
    assert_eq!(
        store.to_f32(store.get("a.bias").unwrap()).unwrap(),
        vec![1.0, -1.0]
    );
    let bad = [SafetensorsItem {
        name: "x",
        dtype: "F32",
        shape: &[2],
        data: &b[..3],
    }];
    assert!(write_safetensors(&path, &meta, &bad).is_err());
}
