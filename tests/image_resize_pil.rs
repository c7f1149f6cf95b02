//! `resize_pil` against Pillow's `Image.resize`, byte for byte (tolerance 0).
//! Fixtures: tests/reference/image_resize_pil_fixtures.py.

use std::path::{Path, PathBuf};

use sd_cli::image_io::{resize_pil, resize_pil_luma, Channels, Image, ImageIoError, PilFilter};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/image_resize_pil")
        .join(name)
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixture("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("json")
}

fn filter(name: &str) -> PilFilter {
    match name {
        "nearest" => PilFilter::Nearest,
        "box" => PilFilter::Box,
        "bilinear" => PilFilter::Bilinear,
        "hamming" => PilFilter::Hamming,
        "bicubic" => PilFilter::Bicubic,
        "lanczos" => PilFilter::Lanczos,
        other => panic!("unknown filter {other}"),
    }
}

fn u(v: &Value) -> usize {
    v.as_u64().expect("number") as usize
}

fn u32v(v: &Value) -> u32 {
    u(v) as u32
}

fn channels(mode: &str) -> Option<Channels> {
    match mode {
        "RGB" => Some(Channels::Rgb),
        "RGBA" => Some(Channels::Rgba),
        "L" => None,
        other => panic!("unknown mode {other}"),
    }
}

/// Resizes raw samples of the given Pillow mode with our implementation.
fn ours(mode: &str, data: Vec<u8>, src: (u32, u32), dst: (u32, u32), f: PilFilter) -> Vec<u8> {
    match channels(mode) {
        Some(ch) => {
            let img = Image::new(src.0, src.1, ch, data).expect("source image");
            let out = resize_pil(&img, dst.0, dst.1, f).expect("resize");
            assert_eq!((out.width, out.height, out.channels), (dst.0, dst.1, ch));
            out.data
        }
        None => resize_pil_luma(&data, src.0, src.1, dst.0, dst.1, f).expect("resize"),
    }
}

/// Every small case: all six filters, RGB/RGBA/L, up, down, mixed, one pass, copy, 1-pixel.
#[test]
fn matches_pillow_exactly() {
    let m = manifest();
    let sources = std::fs::read(fixture("sources.bin")).expect("sources.bin");
    let outputs = std::fs::read(fixture("outputs.bin")).expect("outputs.bin");
    let cases = m["cases"].as_array().expect("cases");
    assert!(cases.len() > 500, "fixture has {} cases", cases.len());
    let mut failures = Vec::new();
    let mut total_bytes = 0usize;
    for case in cases {
        let src = &m["sources"][case["source"].as_str().expect("source")];
        let mode = src["mode"].as_str().expect("mode");
        let (so, sl) = (u(&src["offset"]), u(&src["len"]));
        let (oo, ol) = (u(&case["offset"]), u(&case["len"]));
        let fname = case["filter"].as_str().expect("filter");
        let got = ours(
            mode,
            sources[so..so + sl].to_vec(),
            (u32v(&src["width"]), u32v(&src["height"])),
            (u32v(&case["width"]), u32v(&case["height"])),
            filter(fname),
        );
        let want = &outputs[oo..oo + ol];
        total_bytes += ol;
        assert_eq!(got.len(), want.len());
        let diff: Vec<i32> = got
            .iter()
            .zip(want)
            .map(|(&a, &b)| a as i32 - b as i32)
            .filter(|&d| d != 0)
            .collect();
        if !diff.is_empty() {
            let max = diff.iter().map(|d| d.abs()).max().unwrap_or(0);
            failures.push(format!(
                "{} -> {}x{} {fname}: {} of {} bytes differ, max |diff| {max}",
                case["source"],
                case["width"],
                case["height"],
                diff.len(),
                ol
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ ({} bytes compared):\n{}",
        failures.len(),
        cases.len(),
        total_bytes,
        failures.join("\n")
    );
}

/// FNV-1a 64, as the fixture script hashes Pillow's output.
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The fixture script's `pattern`: noise/ramp checkerboard, alpha bands for 4 channels.
fn pattern(w: u32, h: u32, c: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(w as usize * h as usize * c);
    for y in 0..h as u64 {
        for x in 0..w as u64 {
            for k in 0..c as u64 {
                let mut v =
                    (x.wrapping_mul(2_654_435_761) ^ (y * 40503) ^ (k * 97 + 1)) & 0xffff_ffff;
                v = ((v ^ (v >> 13)).wrapping_mul(1_274_126_177)) & 0xffff_ffff;
                let noise = (v >> 24) as u8;
                let ramp = ((x * 3 + y * 5 + k * 40) % 256) as u8;
                let mut p = if (x / 32 + y / 32) % 2 == 0 {
                    noise
                } else {
                    ramp
                };
                if c == 4 && k == 3 {
                    if y % 64 < 10 {
                        p = 0;
                    }
                    if x % 50 < 8 {
                        p = 255;
                    }
                }
                out.push(p);
            }
        }
    }
    out
}

/// Reference-image-sized resizes (lanczos and bicubic as diffusers/transformers use them),
/// compared through a hash of Pillow's output.
#[test]
fn matches_pillow_on_large_images() {
    let m = manifest();
    for case in m["hashed"].as_array().expect("hashed") {
        let mode = case["mode"].as_str().expect("mode");
        let c = channels(mode).map_or(1, |ch| ch.count());
        let src = (u32v(&case["src_width"]), u32v(&case["src_height"]));
        let dst = (u32v(&case["width"]), u32v(&case["height"]));
        let fname = case["filter"].as_str().expect("filter");
        let got = ours(mode, pattern(src.0, src.1, c), src, dst, filter(fname));
        let sum: u64 = got.iter().map(|&b| b as u64).sum();
        let hash = format!("{:016x}", fnv1a64(&got));
        assert_eq!(
            (hash.as_str(), sum),
            (
                case["fnv1a64"].as_str().expect("hash"),
                case["sum"].as_u64().expect("sum")
            ),
            "{mode} {src:?} -> {dst:?} {fname}"
        );
    }
}

#[test]
fn same_size_is_a_copy_and_zero_size_is_an_error() {
    let img = Image::new(3, 2, Channels::Rgba, (0..24).collect()).expect("image");
    // Pillow returns a copy without premultiplying, so alpha-0 colour survives.
    assert_eq!(
        resize_pil(&img, 3, 2, PilFilter::Lanczos).expect("copy"),
        img
    );
    assert!(matches!(
        resize_pil(&img, 0, 2, PilFilter::Bicubic),
        Err(ImageIoError::BadSize { width: 0, .. })
    ));
    assert!(matches!(
        resize_pil_luma(&[1, 2, 3], 2, 2, 4, 4, PilFilter::Bilinear),
        Err(ImageIoError::BadBuffer { .. })
    ));
}
