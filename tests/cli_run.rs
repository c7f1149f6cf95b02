//! End-to-end runs of the `sd-cli` binary: convert round trips, metadata, and bad input
//! (every case a clear one-line error and a non-zero exit, never a panic).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use sd_cli::dtype::DType;
use sd_cli::image_io::{write_generation_png, Channels, GenerationParams, Image};
use sd_cli::weights::safetensors::{write_safetensors, SafetensorsItem};
use sd_cli::weights::TensorStore;

fn sd_cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(args)
        .output()
        .expect("run sd-cli")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a clean failure: exit code 1 or 2 (not a signal/abort), one `error:` line that
/// contains every `needle`, and no panic text.
fn assert_clean_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    let code = o.status.code();
    assert!(
        matches!(code, Some(1) | Some(2)),
        "exit {code:?}, stderr: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks '{n}': {err}");
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tiny_model(path: &Path) -> (Vec<f32>, Vec<f32>) {
    let w: Vec<f32> = (0..64 * 8)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let b: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let (wb, bb) = (f32_bytes(&w), f32_bytes(&b));
    let items = [
        SafetensorsItem {
            name: "blocks.0.proj.weight",
            dtype: "F32",
            shape: &[8, 64],
            data: &wb,
        },
        SafetensorsItem {
            name: "blocks.0.proj.bias",
            dtype: "F32",
            shape: &[8],
            data: &bb,
        },
    ];
    write_safetensors(path, &BTreeMap::new(), &items).unwrap();
    (w, b)
}

#[test]
fn convert_to_q8_0_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("tiny.safetensors");
    let output = dir.path().join("tiny.q8_0.gguf");
    let (w, b) = tiny_model(&input);
    let o = sd_cli(&[
        "-M",
        "convert",
        "-m",
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
        "--type",
        "q8_0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));

    let store = TensorStore::open(&output).unwrap();
    let wi = store
        .get("blocks.0.proj.weight")
        .expect("weight kept its name");
    assert_eq!(wi.dtype, DType::Q8_0);
    assert_eq!(wi.shape(), &[64, 8]);
    let raw = store.load_bytes(wi).unwrap();
    let back = sd_cli::ggml::dequantize_rows(sd_cli::dtype::DType::Q8_0, &raw, 64).unwrap();
    let max = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = back
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // q8_0 stores blocks of 32 with a per-block f16 scale: error ≤ half a step of max/127.
    assert!(err <= max / 127.0, "q8_0 round trip error {err}");
    // 1-D tensors keep their type.
    let bi = store.get("blocks.0.proj.bias").unwrap();
    assert_eq!(bi.dtype, DType::F32);
    assert_eq!(store.to_f32(bi).unwrap(), b);
}

#[test]
fn convert_keeps_types_without_type_flag_and_converts_to_f16() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("tiny.safetensors");
    let (w, _) = tiny_model(&input);
    for (ty, want) in [(None, DType::F32), (Some("f16"), DType::F16)] {
        let output = dir
            .path()
            .join(format!("out_{}.gguf", ty.unwrap_or("keep")));
        let mut args = vec![
            "-M",
            "convert",
            "-m",
            input.to_str().unwrap(),
            "-o",
            output.to_str().unwrap(),
        ];
        if let Some(t) = ty {
            args.extend(["--type", t]);
        }
        let o = sd_cli(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let store = TensorStore::open(&output).unwrap();
        let wi = store.get("blocks.0.proj.weight").unwrap();
        assert_eq!(wi.dtype, want);
        let back = store.to_f32(wi).unwrap();
        let err = back
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err <= 2e-3, "{ty:?}: error {err}");
    }
}

#[test]
fn metadata_mode_prints_generation_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.png");
    let img = Image::new(2, 2, Channels::Rgb, vec![7; 12]).unwrap();
    let mut p = GenerationParams::new();
    p.prompt = "a lovely cat".into();
    p.seed = 1234;
    write_generation_png(&png, &img, Some(&p)).unwrap();
    let o = sd_cli(&["-M", "metadata", "--image", png.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("a lovely cat") && out.contains("1234"),
        "{out}"
    );
}

#[test]
fn help_and_devices() {
    let o = sd_cli(&["--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for group in ["Model files", "Sampling", "VAE"] {
        assert!(help.contains(group), "help lacks group {group}");
    }
    let o = sd_cli(&["--list-devices"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("CPU"));
}

#[test]
fn bad_inputs_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let missing = d.join("nope.safetensors");
    let o = sd_cli(&["--diffusion-model", missing.to_str().unwrap(), "-p", "x"]);
    assert_clean_error(&o, &["nope.safetensors"]);

    // Truncated / corrupt model files.
    let bad = d.join("bad.safetensors");
    std::fs::write(&bad, [0xffu8; 4]).unwrap();
    let o = sd_cli(&[
        "--diffusion-model",
        bad.to_str().unwrap(),
        "-p",
        "x",
        "-o",
        d.join("o.png").to_str().unwrap(),
    ]);
    assert_clean_error(&o, &["bad.safetensors"]);
    let huge = d.join("huge.safetensors");
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&huge, bytes).unwrap();
    let o = sd_cli(&[
        "-M",
        "convert",
        "-m",
        huge.to_str().unwrap(),
        "-o",
        d.join("h.gguf").to_str().unwrap(),
    ]);
    assert_clean_error(&o, &["huge.safetensors"]);
    let gguf = d.join("bad.gguf");
    std::fs::write(
        &gguf,
        b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",
    )
    .unwrap();
    let o = sd_cli(&[
        "-M",
        "convert",
        "-m",
        gguf.to_str().unwrap(),
        "-o",
        d.join("g.gguf").to_str().unwrap(),
    ]);
    assert_clean_error(&o, &["bad.gguf"]);

    // A model whose family is not recognised.
    let tiny = d.join("tiny.safetensors");
    tiny_model(&tiny);
    let o = sd_cli(&[
        "--diffusion-model",
        tiny.to_str().unwrap(),
        "-p",
        "x",
        "-o",
        d.join("o.png").to_str().unwrap(),
    ]);
    assert_clean_error(&o, &["recognise"]);

    // Output path that is a directory; unknown --type; bad numbers; unknown flags.
    let o = sd_cli(&[
        "--diffusion-model",
        tiny.to_str().unwrap(),
        "-p",
        "x",
        "-o",
        d.to_str().unwrap(),
    ]);
    assert_clean_error(&o, &[]);
    let o = sd_cli(&[
        "-M",
        "convert",
        "-m",
        tiny.to_str().unwrap(),
        "-o",
        d.join("t.gguf").to_str().unwrap(),
        "--type",
        "q9_9",
    ]);
    assert_clean_error(&o, &["q9_9"]);
    let o = sd_cli(&[
        "--diffusion-model",
        tiny.to_str().unwrap(),
        "--steps",
        "abc",
    ]);
    assert_clean_error(&o, &["--steps"]);
    let o = sd_cli(&["--no-such-flag"]);
    assert_clean_error(&o, &["--no-such-flag"]);
    let o = sd_cli(&["-M", "metadata", "--image", bad.to_str().unwrap()]);
    assert_clean_error(&o, &["bad.safetensors"]);
}
