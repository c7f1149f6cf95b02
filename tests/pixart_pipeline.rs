//! A full PixArt-Σ text-to-image run against diffusers' `PixArtSigmaPipeline` on a tiny
//! random-weight model (tests/reference/pixart_pipeline_fixtures.py): tokens, T5 hidden
//! states, the final latent, and the PNG written by the `sd-cli` binary.
//! Tolerances: hidden states 1e-4 × scale; latent 1e-3 × scale; image PSNR ≥ 40 dB (8-bit).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::pipeline::components::{ComponentFiles, ComponentId, Needs};
use sd_cli::pipeline::pixart::{PixArtPipeline, PixArtRequest};
use sd_cli::pipeline::{LoadContext, ModelArgs};
use sd_cli::rng::RngKind;
use sd_cli::runner::{BackendPlan, MemoryOptions};
use sd_cli::sampling::{Guidance, SamplerKind, SamplingPlan, ScheduleKind};
use sd_cli::tensor::HostTensor;

const PROMPT: &str = "A Lovely cat, holding a sign!  ";
const NEGATIVE: &str = "blurry";

fn dir() -> PathBuf {
    fixture_path("pixart_pipeline")
}

fn tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tokenizers/t5-v1_1.tokenizer.json")
}

fn store() -> ComponentFiles {
    let d = dir();
    ComponentFiles::new("PixArt-α/Σ")
        .with(
            ComponentId::Diffusion,
            component(ComponentId::Diffusion, &d.join("transformer")),
        )
        .with(
            ComponentId::T5,
            component(ComponentId::T5, &d.join("text_encoder")),
        )
        .with(
            ComponentId::Vae,
            component(ComponentId::Vae, &d.join("vae")),
        )
}

fn load(files: &ComponentFiles, plan: &BackendPlan) -> PixArtPipeline {
    let tok = tokenizer();
    PixArtPipeline::load(
        files,
        &LoadContext {
            backends: plan,
            memory: MemoryOptions::default(),
            wtype: None,
            flash_attn: false,
            model_args: &ModelArgs::default(),
            needs: Needs::default(),
            t5_tokenizer: Some(&tok),
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

#[test]
fn stages_match_diffusers() {
    let reference = open_fixture("pixart_pipeline/reference.safetensors");
    let s = store();
    let plan = common::device::test_plan(2);
    let pipe = load(&s, &plan);

    let want_ids: Vec<i32> = tensor(&reference, "token_ids")
        .data
        .iter()
        .map(|&v| v as i32)
        .collect();
    assert_eq!(pipe.tokens(PROMPT), want_ids);

    for (name, text) in [("cond", PROMPT), ("uncond", NEGATIVE)] {
        let got = pipe.encode_prompt(text).unwrap();
        assert_close(&format!("T5 {name}"), &got, &tensor(&reference, name), 1e-4);
    }

    let splan = SamplingPlan::new(SamplerKind::Euler, ScheduleKind::Discrete, 4);
    let mut noise = RngKind::Cpu.create(42);
    let mut srng = RngKind::Cpu.create(42);
    let z = pipe
        .sample(PixArtRequest {
            prompt: PROMPT,
            negative_prompt: NEGATIVE,
            width: 24,
            height: 16,
            guidance: Guidance::cfg(4.5),
            plan: &splan,
            noise_rng: noise.as_mut(),
            sampler_rng: srng.as_mut(),
            vae_tiling: None,
            init: None,
            preview: None,
            mask: None,
        })
        .unwrap();
    let got = HostTensor::new(z.ne, z.data.clone()).unwrap();
    assert_close("final latent", &got, &tensor(&reference, "latent"), 1e-3);

    let img = pipe.decode(&z, None).unwrap();
    let got = HostTensor::new(img.ne, img.data).unwrap();
    assert_close(
        "decoded image (float)",
        &got,
        &tensor(&reference, "image"),
        1e-3,
    );
}

#[test]
fn sd_cli_run_matches_diffusers_image() {
    let reference = open_fixture("pixart_pipeline/reference.safetensors");
    let want = tensor(&reference, "image"); // [W, H, 3] planar
    let (w, h) = (want.ne[0], want.ne[1]);
    let want_u8 = image_bytes(&want);
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("cat.png");
    let d = dir();
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", d.join("transformer").to_str().unwrap()])
        .args(["--t5xxl", d.join("text_encoder").to_str().unwrap()])
        .args(["--vae", d.join("vae").to_str().unwrap()])
        .args(["--t5xxl-tokenizer", tokenizer().to_str().unwrap()])
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--steps",
            "4",
            "--cfg-scale",
            "4.5",
        ])
        .args([
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
        ])
        .args([
            "--scheduler",
            "discrete",
            "-t",
            "2",
            "-o",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let img = read_png(&out).unwrap();
    assert_eq!((img.width as usize, img.height as usize), (w, h));
    let p = psnr(&img.data, &want_u8);
    eprintln!("sd-cli vs diffusers PNG: PSNR {p:.1} dB");
    assert!(p >= 40.0, "PSNR {p:.1} dB");
}

/// Runs sd-cli on PixArt components at the given paths; returns the PNG's pixels.
fn run_components(transformer: &Path, t5: &Path, vae: &Path, out: &Path) -> Vec<u8> {
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", transformer.to_str().unwrap()])
        .args(["--t5xxl", t5.to_str().unwrap()])
        .args(["--vae", vae.to_str().unwrap()])
        .args(["--t5xxl-tokenizer", tokenizer().to_str().unwrap()])
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--steps",
            "2",
            "--cfg-scale",
            "4.5",
        ])
        .args([
            "-W", "24", "-H", "16", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_png(out).unwrap().data
}

/// A component's weights file given inside its diffusers folder reads the `config.json` beside
/// it, as the folder itself does: with a non-default config (4 heads of 4 instead of 2 of 8,
/// position grid 16 instead of 8) the file and the folder give the same image, which differs
/// from the one the original config gives.
#[test]
fn a_weights_file_in_its_diffusers_folder_reads_the_config_beside_it() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("transformer");
    std::fs::create_dir(&folder).unwrap();
    let weights = "diffusion_pytorch_model.safetensors";
    std::fs::copy(d.join("transformer").join(weights), folder.join(weights)).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("transformer/config.json")).unwrap()).unwrap();
    config["attention_head_dim"] = 4.into();
    config["num_attention_heads"] = 4.into();
    config["sample_size"] = 16.into();
    std::fs::write(folder.join("config.json"), config.to_string()).unwrap();

    let t5_file = d.join("text_encoder/model.safetensors");
    let vae_file = d.join("vae").join(weights);
    let out = |n: &str| tmp.path().join(n);
    let from_file = run_components(&folder.join(weights), &t5_file, &vae_file, &out("f.png"));
    let from_folder = run_components(
        &folder,
        &d.join("text_encoder"),
        &d.join("vae"),
        &out("d.png"),
    );
    assert_eq!(
        from_file, from_folder,
        "weights file and folder read the same config"
    );
    let original = run_components(&d.join("transformer"), &t5_file, &vae_file, &out("o.png"));
    assert_ne!(from_file, original, "the modified config.json was not used");
}

#[test]
fn img2img_runs_from_an_init_image() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let init = tmp.path().join("init.png");
    // A 30x20 gradient: resized to -W/-H 24x16 before encoding.
    let data: Vec<u8> = (0..30 * 20)
        .flat_map(|i| [(i % 30 * 8) as u8, (i / 30 * 12) as u8, 128])
        .collect();
    let img = sd_cli::image_io::Image::new(30, 20, sd_cli::image_io::Channels::Rgb, data).unwrap();
    sd_cli::image_io::write_png_atomic(&init, &img, &[]).unwrap();
    let run = |strength: &str, out: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args(["--diffusion-model", d.join("transformer").to_str().unwrap()])
            .args(["--t5xxl", d.join("text_encoder").to_str().unwrap()])
            .args(["--vae", d.join("vae").to_str().unwrap()])
            .args(["--t5xxl-tokenizer", tokenizer().to_str().unwrap()])
            .args([
                "-p", PROMPT, "--steps", "4", "-W", "24", "-H", "16", "--rng", "cpu",
            ])
            .args(["--init-img", init.to_str().unwrap(), "--strength", strength])
            .args([
                "--vae-tiling",
                "--vae-tile-size",
                "16x16",
                "-o",
                out.to_str().unwrap(),
            ])
            .output()
            .unwrap()
    };
    let (a, b) = (tmp.path().join("a.png"), tmp.path().join("b.png"));
    let o = run("0.5", &a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run("1.0", &b);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ia, ib) = (read_png(&a).unwrap(), read_png(&b).unwrap());
    assert_eq!((ia.width, ia.height), (24, 16));
    assert_ne!(ia.data, ib.data, "strength must change the result");
    let text = sd_cli::image_io::read_png_text_pairs(&a).unwrap();
    assert!(
        text.iter().any(|(_, v)| v.contains("0.5")),
        "strength recorded in metadata"
    );
}
