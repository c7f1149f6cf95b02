//! A whole MiniMax-H3 text-to-audio-video run through the `sd-cli` binary against diffusers'
//! components on sd-cli's schedule (tests/reference/minimax_h3_pipeline_fixtures.py): 22
//! frames of 48x32 (7 latent frames), 37 audio latents, 4 Euler steps, CFG 3 with a negative
//! prompt, seed 42 with `--rng cpu`. The VAEs are the parity fixtures of
//! tests/minimax_h3_vae_parity.rs and tests/minimax_h3_audio_vae_parity.rs.
//! Tolerances: frames ≥ 55 dB PSNR over all frames (8-bit); the soundtrack (16-bit PCM, in
//! the `.wav` beside an image sequence and inside the AVI) ≥ 50 dB SNR against the
//! reference waveform.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use sd_cli::image_io::audio::read_wav;
use sd_cli::image_io::read_png;

const PROMPT: &str = "a cat surfs a wave, with surf rock";
const NEGATIVE: &str = "blurry";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn dir() -> PathBuf {
    fixture_path("minimax_h3_pipeline")
}

fn run(out: &Path, extra: &[&str]) -> Output {
    let d = dir();
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen"])
        .args([
            "--diffusion-model",
            s(&d.join("transformer/diffusion_pytorch_model.safetensors")),
        ])
        .args(["--llm", s(&d.join("text_encoder/model.safetensors"))])
        .args([
            "--vae",
            s(&fixture_path(
                "minimax_h3_vae/vae/diffusion_pytorch_model.safetensors",
            )),
        ])
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--cfg-scale",
            "3",
            "--steps",
            "4",
        ])
        .args([
            "-W", "48", "-H", "32", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap()
}

fn with_audio<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "--audio-vae",
        // Leaked once per test: a 'static path for the argument list.
        Box::leak(
            fixture_path("minimax_h3_audio_vae/b/diffusion_pytorch_model.safetensors")
                .to_str()
                .unwrap()
                .to_string()
                .into_boxed_str(),
        ),
    ];
    v.extend_from_slice(extra);
    v
}

fn reference() -> sd_cli::weights::TensorStore {
    open_fixture("minimax_h3_pipeline/reference.safetensors")
}

/// The reference frames as 8-bit RGB, all frames in order.
fn reference_frames() -> (usize, Vec<u8>) {
    av::reference_frames(&reference(), "video")
}

/// The reference waveform per channel.
fn reference_audio() -> Vec<Vec<f32>> {
    av::reference_audio(&reference(), "audio")
}

#[test]
fn frames_and_soundtrack_match_the_reference_loop() {
    let tmp = tempfile::tempdir().unwrap();
    // 20 frames are rounded up to 22 (17k + 5), and --fps 16 becomes 24.
    let o = run(
        &tmp.path().join("f_%02d.png"),
        &with_audio(&["--video-frames", "20", "--fps", "16"]),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("20 requested, 22 generated"), "{err}");
    let (n, want) = reference_frames();
    assert_eq!(n, 22);
    let mut got = Vec::new();
    for i in 0..n {
        let img = read_png(&tmp.path().join(format!("f_{i:02}.png"))).unwrap();
        assert_eq!((img.width, img.height), (48, 32));
        got.extend_from_slice(&img.data);
    }
    let p = psnr(&got, &want);
    eprintln!("MiniMax-H3 22 frames vs the reference: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(55.0), "video: PSNR {p:.1} dB");

    // The soundtrack of an image sequence goes beside it.
    let wav = read_wav(&tmp.path().join("f.wav")).unwrap();
    let want = reference_audio();
    assert_eq!(wav.channels.len(), 2);
    let q = av::snr(&wav.channels, &want);
    eprintln!("MiniMax-H3 soundtrack vs the reference: SNR {q:.1} dB");
    assert!(q >= 50.0, "audio: SNR {q:.1} dB");
}

/// Reads a little-endian u32 at `at`.
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn avi_and_webm_carry_the_soundtrack() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("clip.avi");
    let o = run(&path, &with_audio(&["--video-frames", "22"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let avi = std::fs::read(&path).unwrap();
    // Two streams; the audio one 16-bit stereo PCM at the audio VAE's rate.
    let avih = avi.windows(4).position(|w| w == b"avih").unwrap();
    assert_eq!(u32_at(&avi, avih + 8 + 24), 2, "dwStreams");
    let auds = avi.windows(4).position(|w| w == b"auds").unwrap();
    let strf = auds + avi[auds..].windows(4).position(|w| w == b"strf").unwrap();
    let fmt = &avi[strf + 8..strf + 8 + 16];
    assert_eq!(u16::from_le_bytes([fmt[0], fmt[1]]), 1, "PCM");
    assert_eq!(u16::from_le_bytes([fmt[2], fmt[3]]), 2, "stereo");
    assert_eq!(u16::from_le_bytes([fmt[14], fmt[15]]), 16, "bits");
    // The 01wb chunk holds every sample, interleaved.
    // Walk movi's chunks: the frames, then the one audio chunk, then idx1 follows.
    let movi = avi.windows(4).position(|w| w == b"movi").unwrap();
    let mut at = movi + 4;
    while &avi[at..at + 4] == b"00dc" {
        at += 8 + (u32_at(&avi, at + 4) as usize).next_multiple_of(2);
    }
    assert_eq!(
        &avi[at..at + 4],
        b"01wb",
        "the audio chunk follows the frames"
    );
    let len = u32_at(&avi, at + 4) as usize;
    let pcm = &avi[at + 8..at + 8 + len];
    let want = reference_audio();
    assert_eq!(len, want[0].len() * 4);
    let mut got = vec![Vec::new(), Vec::new()];
    for (i, s) in pcm.chunks_exact(2).enumerate() {
        got[i % 2].push(f32::from(i16::from_le_bytes([s[0], s[1]])) / 32767.0);
    }
    let q = av::snr(&got, &want);
    eprintln!("MiniMax-H3 AVI soundtrack: SNR {q:.1} dB");
    assert!(q >= 50.0, "AVI audio: SNR {q:.1} dB");
    // 24 fps whatever --fps says: dwMicroSecPerFrame 41667.
    assert_eq!(u32_at(&avi, avih + 8), 41_667);

    let path = tmp.path().join("clip.webm");
    let o = run(&path, &with_audio(&["--video-frames", "22"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let webm = std::fs::read(&path).unwrap();
    assert!(webm.windows(13).any(|w| w == b"A_PCM/INT/LIT"));
    assert!(webm.windows(5).any(|w| w == b"V_VP8"));
}

#[test]
fn without_the_audio_vae_the_video_is_silent() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("silent_%d.png");
    let o = run(&path, &["--video-frames", "22"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(tmp.path().join("silent_0.png").exists());
    assert!(!tmp.path().join("silent.wav").exists());
    // The joint model ran all the same: the frames equal the run with audio decoding.
    let (_, want) = reference_frames();
    let mut got = Vec::new();
    for i in 0..22 {
        got.extend(
            read_png(&tmp.path().join(format!("silent_{i}.png")))
                .unwrap()
                .data,
        );
    }
    assert!(psnr(&got, &want) >= device::psnr_floor(55.0));
    // The context cache changes nothing: the same frames without it.
    let path = tmp.path().join("nocache_%d.png");
    let o = run(
        &path,
        &[
            "--video-frames",
            "22",
            "--model-args",
            "minimax_h3_context_cache=false",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for i in 0..22 {
        let a = read_png(&tmp.path().join(format!("silent_{i}.png"))).unwrap();
        let b = read_png(&tmp.path().join(format!("nocache_{i}.png"))).unwrap();
        assert_eq!(a.data, b.data, "frame {i}");
    }
}

/// The transformer converted to a q8_0 GGUF (`-M convert`, as the released GGUFs) runs and
/// stays close to the f32 reference (measured 56 dB).
#[test]
fn gguf_q8_0_transformer_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("dit_q8_0.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "convert", "--type", "q8_0"])
        .args(["--diffusion-model", s(&dir().join("transformer"))])
        .args(["-o", s(&gguf)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = dir();
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--diffusion-model", s(&gguf)])
        .args(["--llm", s(&d.join("text_encoder/model.safetensors"))])
        .args(["--vae", s(&fixture_path("minimax_h3_vae/vae"))])
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--cfg-scale",
            "3",
            "--steps",
            "4",
        ])
        .args([
            "-W", "48", "-H", "32", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args([
            "--video-frames",
            "22",
            "-o",
            s(&tmp.path().join("q_%d.png")),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, want) = reference_frames();
    let mut got = Vec::new();
    for i in 0..22 {
        got.extend(
            read_png(&tmp.path().join(format!("q_{i}.png")))
                .unwrap()
                .data,
        );
    }
    let p = psnr(&got, &want);
    eprintln!("MiniMax-H3 q8_0 GGUF transformer: PSNR {p:.1} dB");
    assert!(p >= 40.0, "q8_0: PSNR {p:.1} dB");
}

/// `-M img_gen` makes the shortest clip (5 frames) and keeps its first frame; `-M vid_gen`
/// with 5 frames decodes 2 latent frames (upstream pads them to one VAE chunk; diffusers
/// cannot decode them).
#[test]
fn image_mode_is_the_first_frame_of_the_shortest_clip() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dir();
    let common = |mode: &str, out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args(["-M", mode])
            .args([
                "--diffusion-model",
                s(&d.join("transformer/diffusion_pytorch_model.safetensors")),
            ])
            .args(["--llm", s(&d.join("text_encoder/model.safetensors"))])
            .args(["--vae", s(&fixture_path("minimax_h3_vae/vae"))])
            .args(["-p", PROMPT, "--cfg-scale", "1", "--steps", "2"])
            .args(["-W", "48", "-H", "32", "-s", "7", "--rng", "cpu", "-t", "2"])
            .args(["--video-frames", "5", "-o", s(out)])
            .output()
            .unwrap()
    };
    let o = common("vid_gen", &tmp.path().join("v_%d.png"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(tmp.path().join("v_4.png").exists() && !tmp.path().join("v_5.png").exists());
    let o = common("img_gen", &tmp.path().join("img.png"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let a = read_png(&tmp.path().join("img.png")).unwrap();
    let b = read_png(&tmp.path().join("v_0.png")).unwrap();
    assert_eq!((a.width, a.height), (48, 32));
    assert_eq!(a.data, b.data);
}

#[test]
fn keyframes_without_vision_weights_condition_through_latents_and_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("k.png");
    let pixels = (0..48 * 32 * 3).map(|i| (i % 251) as u8).collect();
    let image =
        sd_cli::image_io::Image::new(48, 32, sd_cli::image_io::Channels::Rgb, pixels).unwrap();
    sd_cli::image_io::write_png_atomic(&img, &image, &[]).unwrap();
    // This --llm file has no vision tower: the picture is left out of the prompt, with a
    // warning, and the keyframe still conditions through its latent rows.
    let plain = tmp.path().join("plain_%d.png");
    let o = run(&plain, &["--video-frames", "5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let keyed = tmp.path().join("keyed_%d.png");
    let o = run(&keyed, &["--video-frames", "5", "--init-img", s(&img)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("left out of the prompt"), "{err}");
    let a = read_png(&tmp.path().join("plain_0.png")).unwrap();
    let b = read_png(&tmp.path().join("keyed_0.png")).unwrap();
    assert_ne!(a.data, b.data, "the keyframe changes the video");

    // Keyframes and references exclude each other; a reference video needs frames.
    let o = run(
        &tmp.path().join("x.avi"),
        &["--init-img", s(&img), "-r", s(&img)],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not both"), "{err}");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = run(&tmp.path().join("x.avi"), &["--ref-video", s(&empty)]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--ref-video") && err.contains("no .png"),
        "{err}"
    );
}
