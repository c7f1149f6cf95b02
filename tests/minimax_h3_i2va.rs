//! MiniMax-H3 keyframe conditioning (I2VA: `--init-img`; FL2VA: `--end-img` too) against
//! diffusers' components run on upstream sd-cli's recipe
//! (tests/reference/minimax_h3_i2va_fixtures.py): the transformer and VAEs of
//! tests/minimax_h3_pipeline.rs, the tiny Qwen3-VL with its vision tower (2 blocks, deepstack
//! after decoder layers 0 and 1) in the `--llm` file, 64x64 keyframes, 22 frames, 3 Euler
//! steps, CFG 3 with a negative prompt that carries the same pictures, seed 42, `--rng cpu`.
//!
//! Tolerances: the text condition (labels, vision blocks, deepstack) ≤ 1e-4 relative; the
//! keyframe latents (posterior mean, normalised) ≤ 1e-4; frames ≥ 55 dB PSNR (8-bit) and
//! the soundtrack ≥ 50 dB SNR. The tiny random transformer barely looks at its keyframes
//! (frames with and without them differ by ~54 dB), so the audio, which moves by ~28 dB,
//! and the condition checks are what tell a wrong keyframe path apart.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use sd_cli::image_io::audio::read_wav;
use sd_cli::image_io::{read_frames_dir, read_image, read_png};
use sd_cli::pipeline::components::{ComponentFiles, ComponentId, Needs};
use sd_cli::pipeline::minimax_h3::MiniMaxH3Pipeline;
use sd_cli::pipeline::ref_args::RefImageArgs;
use sd_cli::pipeline::{BatchInputs, Generator, LoadContext, ModelArgs, RefVideo};
use sd_cli::runner::MemoryOptions;
use sd_cli::tensor::HostTensor;

const PROMPT: &str = "a cat surfs a wave, with surf rock";
const NEGATIVE: &str = "blurry";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn dir() -> PathBuf {
    fixture_path("minimax_h3_i2va")
}

fn transformer() -> PathBuf {
    fixture_path("minimax_h3_pipeline/transformer/diffusion_pytorch_model.safetensors")
}

fn vae() -> PathBuf {
    fixture_path("minimax_h3_vae/vae/diffusion_pytorch_model.safetensors")
}

fn audio_vae() -> PathBuf {
    fixture_path("minimax_h3_audio_vae/b/diffusion_pytorch_model.safetensors")
}

fn llm() -> PathBuf {
    dir().join("text_encoder/model.safetensors")
}

fn reference() -> sd_cli::weights::TensorStore {
    open_fixture("minimax_h3_i2va/reference.safetensors")
}

fn run(out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--diffusion-model", s(&transformer())])
        .args(["--llm", s(&llm()), "--vae", s(&vae())])
        .args(["--audio-vae", s(&audio_vae())])
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--cfg-scale",
            "3",
            "--steps",
            "3",
        ])
        .args([
            "-W", "64", "-H", "64", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["--video-frames", "22"])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap()
}

/// SNR (dB) of the `.wav` beside the frames against the reference waveform of `case`.
fn soundtrack_snr(wav: &Path, case: &str) -> f64 {
    let got = read_wav(wav).unwrap().channels;
    av::snr(
        &got,
        &av::reference_audio(&reference(), &format!("{case}.audio")),
    )
}

/// Runs `case` through the binary and checks its frames and soundtrack.
fn check_case(case: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&tmp.path().join("f_%02d.png"), extra);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (n, want) = av::reference_frames(&reference(), &format!("{case}.video"));
    assert_eq!(n, 22);
    let mut got = Vec::new();
    for i in 0..n {
        let img = read_png(&tmp.path().join(format!("f_{i:02}.png"))).unwrap();
        assert_eq!((img.width, img.height), (64, 64));
        got.extend_from_slice(&img.data);
    }
    let p = psnr(&got, &want);
    let q = soundtrack_snr(&tmp.path().join("f.wav"), case);
    eprintln!("MiniMax-H3 {case}: frames PSNR {p:.1} dB, soundtrack SNR {q:.1} dB");
    assert!(
        p >= device::psnr_floor(55.0),
        "{case} video: PSNR {p:.1} dB"
    );
    assert!(q >= 50.0, "{case} audio: SNR {q:.1} dB");
}

#[test]
fn i2va_matches_the_reference() {
    let first = dir().join("first.png");
    check_case("i2va", &["--init-img", s(&first)]);
}

#[test]
fn ref2va_matches_the_reference() {
    let (img, wav) = (dir().join("ref.png"), dir().join("ref.wav"));
    check_case("ref2va", &["-r", s(&img), "--ref-audio", s(&wav)]);
}

#[test]
fn ref2va_with_a_video_matches_the_reference() {
    let (img, wav) = (dir().join("ref.png"), dir().join("ref.wav"));
    let (video, video_wav) = (dir().join("ref_video"), dir().join("ref_video.wav"));
    check_case(
        "ref2va_video",
        &[
            "-r",
            s(&img),
            "--ref-video",
            s(&video),
            "--ref-video-audio",
            s(&video_wav),
            "--ref-audio",
            s(&wav),
        ],
    );
}

#[test]
fn fl2va_matches_the_reference() {
    let (first, last) = (dir().join("first.png"), dir().join("last.png"));
    check_case("fl2va", &["--init-img", s(&first), "--end-img", s(&last)]);
}

#[test]
fn reference_errors_name_the_input() {
    let tmp = tempfile::tempdir().unwrap();
    let wav = dir().join("ref.wav");
    // A reference soundtrack needs the audio VAE's encoder.
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--diffusion-model", s(&transformer())])
        .args(["--llm", s(&llm()), "--vae", s(&vae())])
        .args(["-p", PROMPT, "-W", "64", "-H", "64", "--steps", "1"])
        .args(["--video-frames", "5", "--ref-audio", s(&wav)])
        .args(["-o", s(&tmp.path().join("x.avi"))])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--ref-audio") && err.contains("--audio-vae"),
        "{err}"
    );
    // A reference video of fewer than 5 frames.
    let short = tmp.path().join("short");
    std::fs::create_dir(&short).unwrap();
    for i in 0..3 {
        std::fs::copy(
            dir().join("ref_video/frame_000.png"),
            short.join(format!("f{i}.png")),
        )
        .unwrap();
    }
    let o = run(&tmp.path().join("y.avi"), &["--ref-video", s(&short)]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--ref-video 1: 3 frames"), "{err}");
}

/// The pipeline over the fixture files, with the VAE encoder and the vision tower.
fn pipeline() -> MiniMaxH3Pipeline {
    let mut files = ComponentFiles::new("MiniMax-H3")
        .with(
            ComponentId::Diffusion,
            component(ComponentId::Diffusion, &transformer()),
        )
        .with(ComponentId::Llm, component(ComponentId::Llm, &llm()))
        .with(ComponentId::Vae, component(ComponentId::Vae, &vae()))
        .with(
            ComponentId::AudioVae,
            component(ComponentId::AudioVae, &audio_vae()),
        );
    files.insert(
        ComponentId::LlmVision,
        component(ComponentId::LlmVision, &llm()),
    );
    let model_args = ModelArgs::parse("").0;
    MiniMaxH3Pipeline::load(
        &files,
        &LoadContext {
            backends: &device::test_plan(2),
            memory: MemoryOptions::default(),
            wtype: None,
            flash_attn: false,
            model_args: &model_args,
            needs: Needs {
                encoder: true,
                references: false,
                audio_references: true,
            },
            t5_tokenizer: None,
            prediction: None,
            clip_skip: None,
            embd_dir: None,
            lora: None,
            taesd_preview_only: false,
            flow_shift: None,
        },
    )
    .expect("pipeline loads")
}

/// Prepares a batch: keyframes (`init`, `end`), or the Ref2VA references with `refs`.
fn prepare(pipe: &mut MiniMaxH3Pipeline, case: &str) {
    let first = read_image(&dir().join("first.png")).unwrap();
    let last = read_image(&dir().join("last.png")).unwrap();
    let refs = [read_image(&dir().join("ref.png")).unwrap()];
    let audio = [read_wav(&dir().join("ref.wav")).unwrap()];
    let reference = case.starts_with("ref2va");
    let videos = [RefVideo {
        frames: read_frames_dir(&dir().join("ref_video"), usize::MAX).unwrap(),
        audio: Some(read_wav(&dir().join("ref_video.wav")).unwrap()),
    }];
    pipe.prepare(&BatchInputs {
        width: 64,
        height: 64,
        init: (!reference).then_some(&first),
        end: (case == "fl2va").then_some(&last),
        refs: if reference { &refs } else { &[] },
        ref_audio: if reference { &audio } else { &[] },
        ref_videos: if case == "ref2va_video" { &videos } else { &[] },
        mask: None,
        ref_args: &RefImageArgs::default(),
        tiling: None,
        hires: false,
        video_frames: Some(22),
        control_frames: &[],
        vace_strength: 1.0,
    })
    .unwrap();
}

/// Max |got − want| over max |want|.
fn rel_err(got: &HostTensor, want: &HostTensor) -> f32 {
    assert_eq!(got.data.len(), want.data.len(), "sizes");
    let scale = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    max_abs_diff(got, want) / scale
}

#[test]
fn conditions_carry_the_pictures() {
    let mut pipe = pipeline();
    let r = reference();
    for case in ["i2va", "fl2va", "ref2va", "ref2va_video"] {
        prepare(&mut pipe, case);
        for (prompt, key) in [(PROMPT, "cond"), (NEGATIVE, "uncond")] {
            let c = pipe.encode_condition(prompt).unwrap().unwrap();
            let want = tensor(&r, &format!("{case}.{key}"));
            let e = rel_err(&c.states, &want);
            eprintln!("{case} {key}: {} rows, rel err {e:.2e}", c.states.ne[1]);
            assert!(e <= 1e-4, "{case} {key} states: rel err {e:.2e}");
            let tag_name = if key == "cond" { "tags" } else { "uncond_tags" };
            let tags = tensor(&r, &format!("{case}.{tag_name}"));
            let want: Vec<u8> = tags.data.iter().map(|&t| t as u8).collect();
            assert_eq!(c.tags, want, "{case} {key} tags");
        }
        let latents = pipe.condition_latents();
        let names: &[&str] = match case {
            "i2va" => &["first_latent"],
            "fl2va" => &["first_latent", "last_latent"],
            "ref2va" => &["ref2va.ref_latent"],
            _ => &["ref2va.ref_latent", "ref2va_video.video_latent"],
        };
        assert_eq!(latents.len(), names.len());
        if case.starts_with("ref2va") {
            // (rows, 4) in torch order are [4, rows] here.
            let name = if case == "ref2va" {
                "ref2va.ref_audio_rows"
            } else {
                "ref2va_video.audio_rows"
            };
            let want = tensor(&r, name);
            let got = HostTensor {
                ne: want.ne,
                data: pipe.condition_audio_rows().to_vec(),
            };
            let e = rel_err(&got, &want);
            eprintln!("{case} audio rows: rel err {e:.2e}");
            assert!(e <= 1e-4, "reference audio rows: rel err {e:.2e}");
        }
        for (z, name) in latents.iter().zip(names) {
            // [24, 1, 16, 16] in torch order is [16, 16, 1, 24] here.
            let mut want = tensor(&r, name);
            want.ne = z.ne;
            let e = max_abs_diff(z, &want);
            eprintln!("{case} {name}: max abs err {e:.2e}");
            assert!(e <= 1e-4, "{case} {name}: {e:.2e}");
        }
    }
}
