//! Wan image-to-video against diffusers on tiny random-weight models
//! (tests/reference/wan_i2v_fixtures.py): `sd-cli -M vid_gen --init-img` (and `--end-img`)
//! with an I2V transformer and a CLIP vision tower, a first/last-frame (FLF2V) transformer, and
//! a transformer that reads only the concatenated condition (Wan 2.2 I2V style), each against
//! `WanImageToVideoPipeline`'s conditioning in its loop on sd-cli's sigmas; the CLIP tower's
//! tokens alone; and the errors a user meets.
//!
//! Tolerances: frames ≥ 55 dB PSNR over all frames (8-bit), CLIP tokens 1e-4 × scale.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;

const FIX: &str = "wan_i2v";
const PROMPT: &str = "A lovely cat walking on the grass.";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn fix(name: &str) -> PathBuf {
    fixture_path(FIX).join(name)
}

/// `sd-cli -M vid_gen` with the shared text encoder and VAE of the text-to-video fixtures,
/// 5 frames of 32×32, frames written as a PNG sequence in `tmp`.
fn run(transformer: &Path, extra: &[&str], tmp: &Path) -> std::process::Output {
    let t2v = fixture_path("wan");
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--diffusion-model", s(transformer)])
        .args(["--t5xxl", s(&t2v.join("text_encoder/model.safetensors"))])
        .args([
            "--t5xxl-tokenizer",
            s(&fixture_path(
                "../../../shared/tokenizers/t5-v1_1.tokenizer.json",
            )),
        ])
        .args([
            "--vae",
            s(&t2v.join("vae/diffusion_pytorch_model.safetensors")),
        ])
        .args(["-p", PROMPT, "--steps", "4", "--cfg-scale", "5"])
        .args(["-W", "32", "-H", "32", "--video-frames", "5"])
        .args(["-s", "42", "--rng", "cpu", "-t", "2"])
        .args(extra)
        .args(["-o", s(&tmp.join("frame_%d.png"))])
        .output()
        .unwrap()
}

/// PSNR of the written frames against reference `name` [W, H, 3, F].
fn frames_psnr(name: &str, tmp: &Path) -> f64 {
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let v = tensor(&r, name);
    let [w, h, c, f] = v.ne;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for i in 0..f {
        let one = sd_cli::tensor::HostTensor {
            ne: [w, h, c, 1],
            data: v.data[i * w * h * c..(i + 1) * w * h * c].to_vec(),
        };
        want.extend(image_bytes(&one));
        let img = read_png(&tmp.join(format!("frame_{i}.png"))).unwrap();
        assert_eq!((img.width as usize, img.height as usize), (w, h));
        got.extend_from_slice(&img.data);
    }
    psnr(&got, &want)
}

fn check_run(case: &str, transformer: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&fix(transformer), extra, tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = frames_psnr(case, tmp.path());
    eprintln!("Wan {case}: 5 frames vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 55.0, "{case}: PSNR {p:.1} dB");
}

#[test]
fn i2v_matches_diffusers() {
    let start = fix("start.png");
    let clip = fix("image_encoder");
    let args = ["--init-img", s(&start), "--clip_vision", s(&clip)];
    check_run("i2v", "i2v", &args);
    // diffusers' own choice of layer (the penultimate) through --clip-skip 2.
    let mut penultimate = args.to_vec();
    penultimate.extend(["--clip-skip", "2"]);
    check_run("i2v_penultimate", "i2v", &penultimate);
}

#[test]
fn first_last_frame_matches_diffusers() {
    let (start, end, clip) = (fix("start.png"), fix("end.png"), fix("image_encoder"));
    check_run(
        "flf2v",
        "flf2v",
        &[
            "--init-img",
            s(&start),
            "--end-img",
            s(&end),
            "--clip_vision",
            s(&clip),
        ],
    );
}

#[test]
fn concat_only_model_needs_no_clip_vision() {
    let start = fix("start.png");
    check_run("concat_only", "concat_only", &["--init-img", s(&start)]);
}

#[test]
fn user_errors_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let start = fix("start.png");
    // An image branch without its CLIP tower.
    let o = run(&fix("i2v"), &["--init-img", s(&start)], tmp.path());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--clip_vision"), "{err}");
    // --end-img on a text-to-video model.
    let t2v = fixture_path("wan/transformer/diffusion_pytorch_model.safetensors");
    let o = run(&t2v, &["--end-img", s(&start)], tmp.path());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--end-img"), "{err}");
    // A CLIP tower of the wrong width: the T5 encoder's file is no CLIP tower at all.
    let o = run(
        &fix("i2v"),
        &[
            "--init-img",
            s(&start),
            "--clip_vision",
            s(&fixture_path("wan/text_encoder/model.safetensors")),
        ],
        tmp.path(),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
}

/// Wan 2.2 A14B's two experts: `--high-noise-diffusion-model` with its own CFG on the steps at
/// or above `--moe-boundary` (2 of 4 here), then the main model, against WanPipeline's
/// `transformer` / `transformer_2` switch.
#[test]
fn two_experts_match_diffusers() {
    let start = fix("start.png");
    let expert = fix("moe_high");
    check_run(
        "moe",
        "concat_only",
        &[
            "--init-img",
            s(&start),
            "--high-noise-diffusion-model",
            s(&expert),
            "--high-noise-cfg-scale",
            "3",
        ],
    );
    // The boundary matters: with the expert on every step the picture differs.
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        &fix("concat_only"),
        &[
            "--init-img",
            s(&start),
            "--high-noise-diffusion-model",
            s(&expert),
            "--high-noise-cfg-scale",
            "3",
            "--high-noise-steps",
            "4",
        ],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = frames_psnr("moe", tmp.path());
    assert!(
        p < 40.0,
        "8 steps with 4 on the expert gave the same video ({p:.1} dB)"
    );
}

/// `sd-cli -M vid_gen` on the TI2V-style transformer over the tiny Wan 2.2 VAE (64×32, 5 frames).
fn ti2v_run(extra: &[&str], tmp: &Path) -> std::process::Output {
    let t2v = fixture_path("wan");
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--diffusion-model", s(&fix("ti2v"))])
        .args(["--t5xxl", s(&t2v.join("text_encoder/model.safetensors"))])
        .args([
            "--t5xxl-tokenizer",
            s(&fixture_path(
                "../../../shared/tokenizers/t5-v1_1.tokenizer.json",
            )),
        ])
        .args(["--vae", s(&fixture_path("wan22_vae/diffusers"))])
        .args(["-p", PROMPT, "--steps", "4", "--cfg-scale", "5"])
        .args(["-W", "64", "-H", "32", "--video-frames", "5"])
        .args(["-s", "42", "--rng", "cpu", "-t", "2"])
        .args(extra)
        .args(["-o", s(&tmp.join("frame_%d.png"))])
        .output()
        .unwrap()
}

/// Wan 2.2 TI2V-5B style text-to-video and image-to-video: the Wan 2.2 VAE (16×, patchified,
/// picked from its weights) under a transformer of its latent width, against WanPipeline's loop
/// and WanImageToVideoPipeline's `expand_timesteps` loop (the init image's latent as the first
/// frame, clean, at timestep 0).
#[test]
fn wan22_ti2v_matches_diffusers() {
    let start = fix("start_wide.png");
    for (case, extra) in [
        ("ti2v_t2v", vec![]),
        ("ti2v_i2v", vec!["--init-img", s(&start)]),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let o = ti2v_run(&extra, tmp.path());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let p = frames_psnr(case, tmp.path());
        eprintln!("Wan 2.2 {case}: 5 frames vs diffusers: PSNR {p:.1} dB");
        assert!(p >= 55.0, "{case}: PSNR {p:.1} dB");
    }
}
