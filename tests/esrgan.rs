//! ESRGAN upscaling (`-M upscale`, `--upscale-model` after generation) against BasicSR's
//! RRDBNet in PyTorch on tiny random weights (tests/reference/esrgan_fixtures.py): scale 4
//! from safetensors and from Real-ESRGAN's `.pth` layout (`params_ema`), scale 2 twice
//! (`--upscale-repeats 2`, 8-bit between passes as upstream), tiled against untiled, and after
//! an SD1 generation.
//!
//! Tolerances: ≥ 60 dB PSNR against the reference's 8-bit pixels (seen: ∞); tiled vs untiled
//! with a shallow model (small receptive field): identical outside the tiles' overlap, ≥ 45 dB
//! over the whole picture (seen 51.2 dB).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use sd_cli::image_io::read_image;

fn fx(name: &str) -> PathBuf {
    fixture_path("esrgan").join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn reference(name: &str) -> Vec<u8> {
    image_bytes(&tensor(&open_fixture("esrgan/reference.safetensors"), name))
}

fn sd_cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(args)
        .args(["-t", "2"])
        .output()
        .unwrap()
}

fn upscale(model: &Path, extra: &[&str], out: &Path) -> Vec<u8> {
    let input = fx("input.png");
    let mut args = vec!["-M", "upscale", "--upscale-model", s(model)];
    args.extend(["--init-img", s(&input), "-o", s(out)]);
    args.extend(extra);
    let o = sd_cli(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_image(out).unwrap().data
}

fn check(got: &[u8], want: &[u8], what: &str, floor: f64) {
    let p = psnr(got, want);
    eprintln!("{what}: PSNR {p:.1} dB");
    assert!(p >= floor, "{what}: PSNR {p:.1} dB");
}

#[test]
fn upscale_mode_matches_rrdbnet() {
    let dir = tempfile::tempdir().unwrap();
    let want = reference("x4");
    let got = upscale(&fx("x4.safetensors"), &[], &dir.path().join("a.png"));
    check(&got, &want, "x4 (safetensors)", 60.0);
    let got = upscale(&fx("x4.pth"), &[], &dir.path().join("b.png"));
    check(&got, &want, "x4 (.pth, params_ema)", 60.0);
    let got = upscale(
        &fx("x2.safetensors"),
        &["--upscale-repeats", "2"],
        &dir.path().join("c.png"),
    );
    check(&got, &reference("x2_twice"), "x2 twice", 60.0);
}

#[test]
fn tiles_agree_with_one_pass() {
    let dir = tempfile::tempdir().unwrap();
    let model = fx("x2_shallow.safetensors");
    let whole = upscale(&model, &[], &dir.path().join("whole.png"));
    check(
        &whole,
        &reference("x2_shallow"),
        "x2 shallow, one pass",
        60.0,
    );
    // 20x14 input, 16-pixel tiles: two tiles across, blended over their overlap.
    let tiled = upscale(
        &model,
        &["--upscale-tile-size", "16"],
        &dir.path().join("tiled.png"),
    );
    check(
        &tiled,
        &whole,
        "x2 shallow, 16-pixel tiles vs one pass",
        45.0,
    );
    // Away from the overlap (and the receptive field's reach into it) every pixel is the same.
    let (w, c) = (40, 3);
    for (i, (a, b)) in tiled.iter().zip(&whole).enumerate() {
        let x = (i / c) % w;
        if !(8..32).contains(&x) {
            assert_eq!(a, b, "pixel column {x} is inside one tile only");
        }
    }
}

#[test]
fn generation_then_upscale() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cat.png");
    let folder = fixture_path("sd_pipeline/sd1");
    let o = sd_cli(&[
        "-m",
        s(&folder),
        "-p",
        "A lovely cat, holding a sign.",
        "-n",
        "blurry, low quality",
        "--steps",
        "4",
        "--cfg-scale",
        "5",
        "-W",
        "24",
        "-H",
        "16",
        "-s",
        "42",
        "--rng",
        "cpu",
        "--sampling-method",
        "euler",
        "--scheduler",
        "discrete",
        "--upscale-model",
        s(&fx("x2.safetensors")),
        "-o",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let img = read_image(&out).unwrap();
    assert_eq!((img.width, img.height), (48, 32));
    check(&img.data, &reference("sd1_x2"), "SD1 then x2", 60.0);
}

#[test]
fn bad_upscale_models_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.png");
    let input = fx("input.png");
    // A diffusion model is no upscaler.
    let unet = fixture_path("sd_pipeline/sd1/unet/diffusion_pytorch_model.safetensors");
    let o = sd_cli(&[
        "-M",
        "upscale",
        "--upscale-model",
        s(&unet),
        "--init-img",
        s(&input),
        "-o",
        s(&out),
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("not an ESRGAN model"),
        "{e}"
    );
    // Upscale mode without its model or image.
    let o = sd_cli(&["-M", "upscale", "--init-img", s(&input), "-o", s(&out)]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--upscale-model"));
}
