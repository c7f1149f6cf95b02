//! `--mask` inpainting and the `--hires` fix against tests/reference/inpaint_hires_fixtures.py:
//! the tiny SD1 pipeline of tests/fixtures/sd_pipeline run by the `sd-cli` binary, compared with
//! a sampling loop written out with diffusers' UNet, VAE and text encoder under sd-cli's rules
//! (docs/inpainting.md, docs/hires.md), and the resampling filters against PyTorch.
//!
//! Tolerances: images ≥ 60 dB PSNR (8-bit PNG against the f32 reference; seen: ∞ for all but
//! `Latent (nearest-exact)`, 81.8 dB); resampling 1e-5 × scale.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::pipeline::resample::{resize, Resample};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const PROMPT: &str = "A lovely cat, holding a sign.";
const NEGATIVE: &str = "blurry, low quality";

fn dir() -> PathBuf {
    fixture_path("inpaint_hires")
}

fn sd1() -> PathBuf {
    fixture_path("sd_pipeline").join("sd1")
}

fn refs() -> TensorStore {
    open_fixture("inpaint_hires/reference.safetensors")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs the binary with the fixtures' sampling flags plus `extra`; returns the image and the
/// process's stderr.
fn run(model: &Path, extra: &[&str], out: &Path) -> (sd_cli::image_io::Image, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-m", s(model), "-p", PROMPT, "-n", NEGATIVE])
        .args([
            "--steps",
            "4",
            "--cfg-scale",
            "5",
            "-s",
            "42",
            "--rng",
            "cpu",
        ])
        .args(["--sampling-method", "euler", "--scheduler", "discrete"])
        .args(["-W", "24", "-H", "16", "-t", "2"])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "sd-cli {extra:?}: {stderr}");
    (read_png(out).unwrap(), stderr)
}

fn check(what: &str, got: &sd_cli::image_io::Image, want_key: &str, min_db: f64) {
    let want = tensor(&refs(), want_key);
    assert_eq!(
        (got.width as usize, got.height as usize),
        (want.ne[0], want.ne[1]),
        "{what}: size"
    );
    let p = psnr(&got.data, &image_bytes(&want));
    eprintln!("{what}: PSNR {p:.1} dB vs reference");
    assert!(p >= min_db, "{what}: PSNR {p:.1} dB < {min_db}");
}

fn inputs() -> (PathBuf, PathBuf) {
    (dir().join("init.png"), dir().join("mask.png"))
}

#[test]
fn masked_img2img_keeps_the_init_latent_outside_the_mask() {
    let tmp = tempfile::tempdir().unwrap();
    let (init, mask) = inputs();
    let extra = [
        "--init-img",
        s(&init),
        "--mask",
        s(&mask),
        "--strength",
        "0.6",
    ];
    let (img, _) = run(&sd1(), &extra, &tmp.path().join("masked.png"));
    check("masked img2img", &img, "masked_image", 60.0);
    // Without the mask the run is plain img2img: it must differ.
    let (plain, _) = run(
        &sd1(),
        &extra[..2]
            .iter()
            .chain(&extra[4..])
            .copied()
            .collect::<Vec<_>>(),
        &tmp.path().join("plain.png"),
    );
    assert!(
        psnr(&plain.data, &img.data) < 40.0,
        "the mask changed nothing"
    );
}

#[test]
fn mask_without_init_image_blends_toward_an_empty_latent() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, mask) = inputs();
    let (img, stderr) = run(&sd1(), &["--mask", s(&mask)], &tmp.path().join("m.png"));
    check("mask without init", &img, "mask_only_image", 60.0);
    assert!(stderr.contains("--mask without --init-img"), "{stderr}");
}

#[test]
fn inpainting_unet_single_file_reads_mask_and_masked_image_channels() {
    let tmp = tempfile::tempdir().unwrap();
    let model = assemble_checkpoint(&dir(), "sd1_inpaint.single", tmp.path());
    let (init, mask) = inputs();
    let extra = [
        "--init-img",
        s(&init),
        "--mask",
        s(&mask),
        "--strength",
        "1",
    ];
    let (img, _) = run(&model, &extra, &tmp.path().join("inpaint.png"));
    check("inpainting UNet", &img, "inpaint_image", 60.0);
    // The hires fix cannot carry an inpainting UNet's mask channels: a clear refusal.
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args([
            "-m",
            s(&model),
            "-p",
            "x",
            "--steps",
            "1",
            "-W",
            "24",
            "-H",
            "16",
        ])
        .args(["--hires", "-o", s(&tmp.path().join("no.png"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--hires"), "{err}");
}

/// The hires fix from txt2img (24x16 → 48x32, 2 hires steps at strength 0.5) with `upscaler`.
fn hires(upscaler: &str, key: &str, tmp: &Path) -> sd_cli::image_io::Image {
    let out = tmp.join(format!("{key}.png"));
    let extra = [
        "--hires",
        "--hires-upscaler",
        upscaler,
        "--hires-steps",
        "2",
        "--hires-denoising-strength",
        "0.5",
    ];
    let (img, _) = run(&sd1(), &extra, &out);
    check(&format!("hires {upscaler}"), &img, key, 60.0);
    img
}

#[test]
fn hires_fix_with_latent_upscalers_matches_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let img = hires("Latent", "hires_latent_image", tmp.path());
    assert_eq!((img.width, img.height), (48, 32));
    hires("Latent (bicubic)", "hires_latent_bicubic_image", tmp.path());
    hires(
        "Latent (nearest-exact)",
        "hires_latent_nearest_exact_image",
        tmp.path(),
    );
    // The metadata names the hires fix; the size is the first pass's (upstream).
    let text = sd_cli::image_io::read_png_text_pairs(&tmp.path().join("hires_latent_image.png"))
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect::<Vec<_>>()
        .join("\n");
    for want in [
        "Hires upscale: Latent",
        "Hires steps: 2",
        "Denoising strength: 0.500000",
        "Size: 24x16",
    ] {
        assert!(text.contains(want), "{want} missing from {text}");
    }
}

#[test]
fn hires_fix_with_lanczos_decodes_resizes_and_encodes() {
    let tmp = tempfile::tempdir().unwrap();
    hires("Lanczos", "hires_lanczos_image", tmp.path());
}

#[test]
fn hires_fix_carries_the_mask_to_the_larger_size() {
    let tmp = tempfile::tempdir().unwrap();
    let (init, mask) = inputs();
    let extra = [
        "--init-img",
        s(&init),
        "--mask",
        s(&mask),
        "--strength",
        "0.6",
        "--hires",
        "--hires-steps",
        "2",
        "--hires-denoising-strength",
        "0.5",
    ];
    let (img, _) = run(&sd1(), &extra, &tmp.path().join("hm.png"));
    check("hires + mask", &img, "hires_masked_image", 60.0);
}

#[test]
fn hires_upscaler_names_are_checked_before_loading() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-m", s(&sd1()), "-p", "x", "--hires"])
        .args(["--hires-upscaler", "4x-UltraSharp"])
        .args(["-o", s(&tmp.path().join("x.png"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--hires-upscalers-dir"),
        "{err}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-m", s(&sd1()), "-p", "x", "--hires"])
        .args(["--hires-upscaler", "4x-UltraSharp", "--hires-upscalers-dir"])
        .arg(tmp.path())
        .args(["-o", s(&tmp.path().join("x.png"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no 4x-UltraSharp.gguf"),
        "{err}"
    );
}

/// Our filters against PyTorch's interpolate (and upstream's Lanczos as the reference writes it).
/// Antialiased shrinking is not compared: upstream clamps edge taps where PyTorch drops them
/// (resample.rs tests it by hand).
#[test]
fn resampling_filters_match_pytorch() {
    let r = refs();
    let src = tensor(&r, "resample_src");
    let cases: Vec<(String, Resample, usize, usize)> = [(16, 11), (4, 3)]
        .iter()
        .flat_map(|&(w, h)| {
            [
                ("bilinear", Resample::Bilinear { antialias: false }),
                ("bicubic", Resample::Bicubic { antialias: false }),
                ("nearest", Resample::Nearest),
                ("nearest_exact", Resample::NearestExact),
            ]
            .into_iter()
            .map(move |(n, m)| (format!("resample_{n}_{w}x{h}"), m, w, h))
        })
        .chain([(
            "resample_lanczos_16x11".to_string(),
            Resample::Lanczos,
            16,
            11,
        )])
        .collect();
    for (key, mode, w, h) in cases {
        let want = tensor(&r, &key);
        let got = resize(&src, w, h, mode);
        assert_close(&key, &got, &want, 1e-5);
    }
    // The inpainting mask's latent: block maximum of the rounded mask.
    let mask = read_png(&dir().join("mask.png")).unwrap();
    let img = sd_cli::image_io::Image::new(
        mask.width,
        mask.height,
        sd_cli::image_io::Channels::Rgb,
        mask.data.clone(),
    )
    .unwrap();
    let m = sd_cli::pipeline::mask::InpaintMask::from_image(&img, 24, 16, 2);
    let want: HostTensor = tensor(&r, "mask_latent");
    assert_eq!(m.latent.data, want.data);
}

/// `--hires-upscaler NAME` finds an ESRGAN model in `--hires-upscalers-dir` (x4 here: its
/// output is resized to the 2x target) and runs; the picture differs from the latent path's.
#[test]
fn hires_fix_with_an_esrgan_model_from_the_upscalers_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("upscalers");
    std::fs::create_dir(&models).unwrap();
    std::fs::copy(
        fixture_path("esrgan").join("x4.pth"),
        models.join("tiny-x4.pth"),
    )
    .unwrap();
    let hires = [
        "--hires",
        "--hires-steps",
        "2",
        "--hires-denoising-strength",
        "0.5",
    ];
    let mut extra = hires.to_vec();
    extra.extend([
        "--hires-upscaler",
        "tiny-x4",
        "--hires-upscalers-dir",
        s(&models),
    ]);
    let (img, _) = run(&sd1(), &extra, &tmp.path().join("esrgan.png"));
    assert_eq!((img.width, img.height), (48, 32));
    let (latent, _) = run(&sd1(), &hires, &tmp.path().join("latent.png"));
    assert!(
        psnr(&img.data, &latent.data) < 40.0,
        "the model upscaler changed nothing"
    );
}

/// A `w × h` grey mask PNG of one value (0: keep everything, 255: repaint everything).
fn flat_mask(path: &Path, w: u32, h: u32, value: u8) {
    let data = vec![value; (w * h * 3) as usize];
    let img = sd_cli::image_io::Image::new(w, h, sd_cli::image_io::Channels::Rgb, data).unwrap();
    sd_cli::image_io::write_png_atomic(path, &img, &[]).unwrap();
}

/// A family's model flags and size, for the invariants below.
struct FamilyRun {
    name: &'static str,
    args: Vec<String>,
    size: (u32, u32),
}

fn families() -> Vec<FamilyRun> {
    let p = |f: PathBuf| f.to_str().unwrap().to_string();
    let pixart = fixture_path("pixart_pipeline");
    let qwen = fixture_path("qwen_image_pipeline");
    let t5 = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/tokenizers/t5-v1_1.tokenizer.json");
    vec![
        FamilyRun {
            name: "SD1",
            args: vec!["-m".into(), p(sd1())],
            size: (24, 16),
        },
        FamilyRun {
            name: "PixArt",
            args: vec![
                "--diffusion-model".into(),
                p(pixart.join("transformer")),
                "--t5xxl".into(),
                p(pixart.join("text_encoder")),
                "--vae".into(),
                p(pixart.join("vae")),
                "--t5xxl-tokenizer".into(),
                p(t5),
            ],
            size: (24, 16),
        },
        FamilyRun {
            name: "Qwen Image 2.1",
            args: vec![
                "--diffusion-model".into(),
                p(qwen.join("diffusion_model.safetensors")),
                "--vae".into(),
                p(qwen.join("vae.safetensors")),
                "--llm".into(),
                p(qwen.join("llm.safetensors")),
            ],
            size: (96, 64),
        },
    ]
}

fn run_family(f: &FamilyRun, seed: &str, extra: &[&str], out: &Path) -> sd_cli::image_io::Image {
    let (w, h) = (f.size.0.to_string(), f.size.1.to_string());
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(&f.args)
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--steps",
            "3",
            "--cfg-scale",
            "4",
        ])
        .args(["-W", &w, "-H", &h, "-s", seed, "--rng", "cpu", "-t", "2"])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{} {extra:?}: {}",
        f.name,
        String::from_utf8_lossy(&o.stderr)
    );
    read_png(out).unwrap()
}

/// Every family, model-independent: a black mask keeps the init image's latent (two seeds give
/// the same picture), a white mask is plain img2img, and the hires fix doubles the size.
#[test]
fn every_family_keeps_unmasked_latents_and_runs_the_hires_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let init = dir().join("init.png");
    for f in families() {
        let (w, h) = f.size;
        let (black, white) = (tmp.path().join("black.png"), tmp.path().join("white.png"));
        flat_mask(&black, w, h, 0);
        flat_mask(&white, w, h, 255);
        let out = |n: &str| {
            tmp.path()
                .join(format!("{}-{n}.png", f.name.replace(' ', "_")))
        };
        let img2img = ["--init-img", s(&init), "--strength", "0.7"];
        let with_black = [&img2img[..], &["--mask", s(&black)]].concat();
        let with_white = [&img2img[..], &["--mask", s(&white)]].concat();
        let a = run_family(&f, "1", &with_black, &out("black1"));
        let b = run_family(&f, "2", &with_black, &out("black2"));
        assert_eq!(
            a.data, b.data,
            "{}: a black mask must keep the init latent",
            f.name
        );
        let masked = run_family(&f, "3", &with_white, &out("white"));
        let plain = run_family(&f, "3", &img2img, &out("plain"));
        assert_eq!(
            masked.data, plain.data,
            "{}: a white mask is plain img2img",
            f.name
        );
        let hires = [
            "--hires",
            "--hires-steps",
            "1",
            "--hires-upscaler",
            "Lanczos",
        ];
        let big = run_family(&f, "4", &[&img2img[..], &hires].concat(), &out("hires"));
        assert_eq!(
            (big.width, big.height),
            (2 * w, 2 * h),
            "{}: hires size",
            f.name
        );
    }
}
