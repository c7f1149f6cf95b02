//! Wan 2.1 text-to-video against diffusers on tiny random-weight models
//! (tests/reference/wan_pipeline_fixtures.py): the umT5 states of a prompt and of the empty
//! negative prompt (512 tokens, padding masked and zeroed), and a whole `sd-cli -M vid_gen` run
//! (9 frames, CFG 5) against WanPipeline's loop with diffusers' transformer and VAE on sd-cli's
//! sigmas, written as a lossless PNG sequence; the same run as `.avi` and `.webp` files.
//!
//! Tolerances: text states 1e-4 × scale (2e-3 where ggml's f16 matmul runs, see
//! `f16_weight_tolerance`); frames ≥ 55 dB PSNR over all frames (8-bit).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::models::te::t5::{self, T5Config, T5Encoder, T5Source};
use sd_cli::pipeline::text::t5_weighted_chunks;
use sd_cli::runner::{RunOptions, Runner, WeightLoader};
use sd_cli::tokenizers::load_t5_tokenizer;
use sd_cli::weights::TensorStore;

const FIX: &str = "wan";
const PROMPT: &str = "A lovely cat walking on the grass.";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn tokenizer_path() -> std::path::PathBuf {
    fixture_path("../../../shared/tokenizers/t5-v1_1.tokenizer.json")
}

#[test]
fn umt5_states_match_the_wan_pipeline() {
    let dir = fixture_path(FIX);
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let store = TensorStore::open(&dir.join("text_encoder/model.safetensors")).unwrap();
    let source = T5Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let model = T5Encoder::new(
        &loader.root(""),
        T5Config::detect(&loader.root("")).unwrap(),
    )
    .unwrap();
    assert!(model.is_umt5(), "per-block position tables");
    let backend = cpu();
    let weights = loader.finish(&backend, "umt5").unwrap();
    let runner = Runner::new("umt5", backend, Some(weights), RunOptions::default());
    let tok = load_t5_tokenizer(&tokenizer_path()).unwrap();
    for (case, text) in [("prompt_states", PROMPT), ("negative_states", "")] {
        let chunks = t5_weighted_chunks(&tok, text, 512).unwrap();
        assert_eq!(chunks.len(), 1);
        let c = &chunks[0];
        let mut h = t5::encode(&runner, &model, &c.ids, c.real).unwrap();
        let d = h.ne[0];
        h.data[c.real * d..].iter_mut().for_each(|v| *v = 0.0);
        assert_close(case, &h, &tensor(&r, case), f16_weight_tolerance());
    }
}

/// The umT5 weights are f16: our blocked kernels (AVX-512, in-process CPU only) widen them
/// exactly; without them (another CPU class, or the CPU served over RPC) ggml's own f16 matmul
/// runs, which rounds the activations to f16 as well (as upstream does), worth about 1e-3 of
/// the states' scale.
fn f16_weight_tolerance() -> f32 {
    if sd_cli::cpu_info::kernel_may_use("avx512f") && !device::on_device() {
        1e-4
    } else {
        2e-3
    }
}

fn run(out: &str, extra: &[&str], tmp: &Path) -> std::process::Output {
    let dir = fixture_path(FIX);
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen"])
        .args([
            "--diffusion-model",
            s(&dir.join("transformer/diffusion_pytorch_model.safetensors")),
        ])
        .args(["--t5xxl", s(&dir.join("text_encoder/model.safetensors"))])
        .args(["--t5xxl-tokenizer", s(&tokenizer_path())])
        .args([
            "--vae",
            s(&dir.join("vae/diffusion_pytorch_model.safetensors")),
        ])
        .args(["-p", PROMPT, "--steps", "4", "--cfg-scale", "5"])
        .args(["-W", "64", "-H", "48", "--video-frames", "9", "--fps", "8"])
        .args(["-s", "42", "--rng", "cpu", "-t", "2"])
        .args(extra)
        .args(["-o", s(&tmp.join(out))])
        .output()
        .unwrap()
}

/// The reference frames [F, 3, H, W] as 8-bit RGB per frame.
fn reference_frames() -> Vec<Vec<u8>> {
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let v = tensor(&r, "video_cfg");
    let [w, h, c, f] = v.ne;
    (0..f)
        .map(|i| {
            let one = sd_cli::tensor::HostTensor {
                ne: [w, h, c, 1],
                data: v.data[i * w * h * c..(i + 1) * w * h * c].to_vec(),
            };
            image_bytes(&one)
        })
        .collect()
}

#[test]
fn video_matches_the_wan_pipeline_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run("frame_%02d.png", &[], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = reference_frames();
    assert_eq!(want.len(), 9);
    let mut got_all = Vec::new();
    let mut want_all = Vec::new();
    for (i, w) in want.iter().enumerate() {
        let img = read_png(&tmp.path().join(format!("frame_{i:02}.png"))).unwrap();
        assert_eq!((img.width, img.height), (64, 48));
        got_all.extend_from_slice(&img.data);
        want_all.extend_from_slice(w);
    }
    let p = psnr(&got_all, &want_all);
    eprintln!("Wan 9 frames vs diffusers: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(55.0), "video: PSNR {p:.1} dB");
}

#[test]
fn video_containers_hold_the_frames() {
    let tmp = tempfile::tempdir().unwrap();
    // An image extension becomes .avi, as upstream.
    let o = run("clip.png", &[], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let avi = std::fs::read(tmp.path().join("clip.avi")).unwrap();
    assert_eq!(&avi[..4], b"RIFF");
    assert_eq!(&avi[8..12], b"AVI ");
    // WebM: EBML magic, a VP8 track (tests/video_io.rs decodes such files frame by frame).
    let o = run("clip.webm", &[], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let webm = std::fs::read(tmp.path().join("clip.webm")).unwrap();
    assert_eq!(&webm[..4], [0x1a, 0x45, 0xdf, 0xa3]);
    assert!(webm.windows(5).any(|w| w == b"V_VP8"));
    let o = run("clip.webp", &[], tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use image::AnimationDecoder;
    let file = std::io::BufReader::new(std::fs::File::open(tmp.path().join("clip.webp")).unwrap());
    let frames = image::codecs::webp::WebPDecoder::new(file)
        .unwrap()
        .into_frames()
        .collect_frames()
        .unwrap();
    let want = reference_frames();
    assert_eq!(frames.len(), want.len());
    let got: Vec<u8> = frames
        .iter()
        .flat_map(|f| {
            image::DynamicImage::ImageRgba8(f.buffer().clone())
                .to_rgb8()
                .into_raw()
        })
        .collect();
    let p = psnr(&got, &want.concat());
    eprintln!("Wan .webp vs diffusers: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(55.0), "webp: PSNR {p:.1} dB");
}

/// Image families refuse `-M vid_gen` with a message naming the family.
#[test]
fn image_families_refuse_video() {
    let tmp = tempfile::tempdir().unwrap();
    let q = fixture_path("qwen_image_v1");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--video-frames", "5"])
        .args(["--diffusion-model", s(&q.join("qwen_image.safetensors"))])
        .args(["--llm", s(&q.join("text_encoder/model.safetensors"))])
        .args([
            "--vae",
            s(&fixture_path("wan_vae").join("a/diffusion_pytorch_model.safetensors")),
        ])
        .args(["-p", "x", "-o", s(&tmp.path().join("x.avi"))])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not video"), "{err}");
}

/// `-M img_gen` with a Wan model makes one frame (one latent frame through the VAE's image
/// path), as WanPipeline with `num_frames=1`.
#[test]
fn one_frame_image_matches_the_wan_pipeline_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path(FIX);
    let out = tmp.path().join("one.png");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args([
            "--diffusion-model",
            s(&dir.join("transformer/diffusion_pytorch_model.safetensors")),
        ])
        .args(["--t5xxl", s(&dir.join("text_encoder/model.safetensors"))])
        .args(["--t5xxl-tokenizer", s(&tokenizer_path())])
        .args([
            "--vae",
            s(&dir.join("vae/diffusion_pytorch_model.safetensors")),
        ])
        .args(["-p", PROMPT, "--steps", "4", "--cfg-scale", "5"])
        .args([
            "-W", "64", "-H", "48", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["-o", s(&out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let img = read_png(&out).unwrap();
    let p = psnr(&img.data, &image_bytes(&tensor(&r, "image_cfg")));
    eprintln!("Wan one frame (img_gen) vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 55.0, "one frame: PSNR {p:.1} dB");
}

#[test]
fn video_decode_tiles_spatially_and_ignores_temporal_tiling() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        "tiled_%02d.png",
        &[
            "--vae-tiling",
            "--vae-tile-size",
            "32x32",
            "--temporal-tiling",
            "--extra-tiling-args",
            "temporal_tile_frames=2,bogus=1",
            "-v",
        ],
        tmp.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("only the LTX video VAE tiles time"), "{err}");
    assert!(err.contains("unknown key 'bogus'"), "{err}");
    assert!(err.contains("VAE video decode: 6 tiles of 32x32"), "{err}");
    let want = reference_frames();
    let mut got = Vec::new();
    for i in 0..want.len() {
        let img = read_png(&tmp.path().join(format!("tiled_{i:02}.png"))).unwrap();
        assert_eq!((img.width, img.height), (64, 48));
        got.extend_from_slice(&img.data);
    }
    // Tiles see less context than the whole frame, so the clip moves away from the untiled
    // reference (82 dB) but stays the same picture.
    let p = psnr(&got, &want.concat());
    eprintln!("Wan 9 frames, 32x32 VAE tiles, vs untiled diffusers: PSNR {p:.1} dB");
    assert!((15.0..70.0).contains(&p), "tiled video: PSNR {p:.1} dB");
}
