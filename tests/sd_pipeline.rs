//! Whole Stable Diffusion 1.x / 2.x / SDXL runs against diffusers' `StableDiffusionPipeline` /
//! `StableDiffusionXLPipeline` on tiny random-weight models (tests/reference/
//! sd_pipeline_fixtures.py): the text conditioning, the final latent, and the PNG the `sd-cli`
//! binary writes from a diffusers pipeline folder, from the original single-file checkpoint and
//! from per-component files (the three give the same picture), and TAESD decoding.
//!
//! Tolerances: text states 1e-4 × scale; latent 1e-3 × scale; images ≥ 60 dB PSNR (8-bit PNG).
//! sd-cli semantics where they differ from diffusers (REFERENCE-NOTES 26–28): `--clip-skip 2`
//! is diffusers' `clip_skip=1`; the fixtures use a non-empty SDXL negative prompt.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::pipeline::components::{ComponentFiles, ComponentId, ComponentStore, Needs};
use sd_cli::pipeline::sd::{SdPipeline, SdRequest, SdVersion};
use sd_cli::pipeline::{LoadContext, ModelArgs};
use sd_cli::rng::RngKind;
use sd_cli::runner::{BackendPlan, MemoryOptions};
use sd_cli::sampling::{Guidance, Prediction, SamplerKind, SamplingPlan, ScheduleKind};
use sd_cli::tensor::HostTensor;

const PROMPT: &str = "A lovely cat, holding a sign.";
const NEGATIVE: &str = "blurry, low quality";

fn dir() -> PathBuf {
    fixture_path("sd_pipeline")
}

/// A variant's components from its diffusers folder, as `-m <folder>` opens them.
fn folder_files(variant: &str) -> ComponentFiles {
    let root = dir().join(variant);
    let mut files = ComponentFiles::new("Stable Diffusion");
    for id in [
        ComponentId::Diffusion,
        ComponentId::ClipL,
        ComponentId::ClipG,
        ComponentId::Vae,
    ] {
        let store = ComponentStore::open(id, &root, true).unwrap();
        if !store.is_empty() {
            files.insert(id, store);
        }
    }
    files
}

fn load(files: &ComponentFiles, plan: &BackendPlan, clip_skip: Option<u32>) -> SdPipeline {
    SdPipeline::load(
        files,
        &LoadContext {
            backends: plan,
            memory: MemoryOptions::default(),
            wtype: None,
            flash_attn: false,
            model_args: &ModelArgs::default(),
            needs: Needs::default(),
            t5_tokenizer: None,
            prediction: None,
            clip_skip,
            embd_dir: None,
            lora: None,
            taesd_preview_only: false,
            flow_shift: None,
        },
    )
    .expect("pipeline loads")
}

/// A reference image [3, H, W] in [0, 1] as interleaved RGB bytes.
fn reference_png(rel: &str) -> (usize, usize, Vec<u8>) {
    let want = tensor(&open_fixture(rel), "image");
    (want.ne[0], want.ne[1], image_bytes(&want))
}

/// Runs the binary with the fixtures' generation flags plus `model_args`; returns the PNG.
fn run(model_args: &[&str], extra: &[&str], out: &Path) -> Vec<u8> {
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(model_args)
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--steps",
            "4",
            "--cfg-scale",
            "5",
        ])
        .args(["-W", "24", "-H", "16", "-s", "42", "--rng", "cpu"])
        .args([
            "--sampling-method",
            "euler",
            "--scheduler",
            "discrete",
            "-t",
            "2",
        ])
        .args(extra)
        .args(["-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "sd-cli {model_args:?} {extra:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let img = read_png(out).unwrap();
    assert_eq!((img.width, img.height), (24, 16));
    img.data
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The three ways to give a variant: its pipeline folder, its single file, its components.
fn check_variant(variant: &str, extra: &[&str]) {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let (_, _, want) = reference_png(&format!("sd_pipeline/{variant}/reference.safetensors"));
    let folder = d.join(variant);
    let single = assemble_checkpoint(&d, &format!("{variant}.single"), tmp.path());

    let from_folder = run(&["-m", s(&folder)], extra, &tmp.path().join("folder.png"));
    let p = psnr(&from_folder, &want);
    eprintln!("{variant}: -m <diffusers folder> vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 60.0, "{variant} folder: PSNR {p:.1} dB");

    let from_single = run(&["-m", s(&single)], extra, &tmp.path().join("single.png"));
    let p = psnr(&from_single, &want);
    eprintln!("{variant}: -m <single file> vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 60.0, "{variant} single file: PSNR {p:.1} dB");

    let unet = folder.join("unet/diffusion_pytorch_model.safetensors");
    let vae = folder.join("vae/diffusion_pytorch_model.safetensors");
    let te = folder.join("text_encoder/model.safetensors");
    let mut args = vec![
        "--diffusion-model",
        s(&unet),
        "--vae",
        s(&vae),
        "--clip_l",
        s(&te),
    ];
    let te2 = folder.join("text_encoder_2/model.safetensors");
    if te2.exists() {
        args.extend(["--clip_g", s(&te2)]);
    }
    let from_parts = run(&args, extra, &tmp.path().join("parts.png"));
    let p = psnr(&from_parts, &want);
    eprintln!("{variant}: per-component files vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 60.0, "{variant} components: PSNR {p:.1} dB");
}

#[test]
fn sd1_folder_single_file_and_components_match_diffusers() {
    check_variant("sd1", &[]);
}

/// SD2-v: the pipeline folder's scheduler config says v-prediction; the single file and the
/// loose components do not (upstream would run its probe), so the run says `--prediction v`.
#[test]
fn sd2_v_folder_single_file_and_components_match_diffusers() {
    check_variant("sd2", &["--prediction", "v"]);
}

#[test]
fn sdxl_folder_single_file_and_components_match_diffusers() {
    check_variant("sdxl", &[]);
}

#[test]
fn sd2_folder_reads_v_prediction_from_its_scheduler_config() {
    let plan = common::device::test_plan(2);
    let pipe = load(&folder_files("sd2"), &plan, None);
    assert_eq!(pipe.version(), SdVersion::Sd2);
    assert_eq!(pipe.prediction(), Prediction::V);
    let pipe = load(&folder_files("sd1"), &plan, None);
    assert_eq!(pipe.version(), SdVersion::Sd1);
    assert_eq!(pipe.prediction(), Prediction::Eps);
}

#[test]
fn conditioning_and_latent_match_diffusers() {
    let plan = common::device::test_plan(2);
    for variant in ["sd1", "sd2", "sdxl"] {
        let reference = open_fixture(&format!("sd_pipeline/{variant}/reference.safetensors"));
        let pipe = load(&folder_files(variant), &plan, None);
        let (cond, uncond) = pipe.conditions(PROMPT, NEGATIVE, true).unwrap();
        let uncond = uncond.unwrap();
        assert_close(
            &format!("{variant} cond"),
            &cond.context,
            &tensor(&reference, "cond"),
            1e-4,
        );
        assert_close(
            &format!("{variant} uncond"),
            &uncond.context,
            &tensor(&reference, "uncond"),
            1e-4,
        );
        if variant == "sdxl" {
            for (name, got) in [("pooled", &cond.pooled), ("uncond_pooled", &uncond.pooled)] {
                let got = got.clone().expect("SDXL pools");
                let got = HostTensor::new([got.len(), 1, 1, 1], got).unwrap();
                assert_close(name, &got, &tensor(&reference, name), 1e-4);
            }
        }

        let splan = SamplingPlan::new(SamplerKind::Euler, ScheduleKind::Discrete, 4);
        let mut noise = RngKind::Cpu.create(42);
        let mut srng = RngKind::Cpu.create(42);
        let z = pipe
            .sample(SdRequest {
                prompt: PROMPT,
                negative_prompt: NEGATIVE,
                width: 24,
                height: 16,
                guidance: Guidance::cfg(5.0),
                plan: &splan,
                noise_rng: noise.as_mut(),
                sampler_rng: srng.as_mut(),
                init: None,
                preview: None,
                mask: None,
                concat: None,
                condition_size: None,
            })
            .unwrap();
        assert_close(
            &format!("{variant} final latent"),
            &z,
            &tensor(&reference, "latent"),
            1e-3,
        );
    }
}

/// `--clip-skip 2` on SD1 is the penultimate layer with the final LayerNorm (diffusers'
/// `clip_skip=1`).
#[test]
fn sd1_clip_skip_two_is_the_penultimate_layer_with_the_final_norm() {
    let plan = common::device::test_plan(2);
    let reference = open_fixture("sd_pipeline/sd1/reference.safetensors");
    let pipe = load(&folder_files("sd1"), &plan, Some(2));
    let (cond, _) = pipe.conditions(PROMPT, "", false).unwrap();
    assert_close(
        "sd1 clip skip 2",
        &cond.context,
        &tensor(&reference, "cond_clip_skip_2"),
        1e-4,
    );
}

/// SDXL with CFG and an empty negative prompt: upstream zeroes the unconditional context but
/// keeps the pooled embedding of "" (diffusers zeroes both).
#[test]
fn sdxl_empty_negative_prompt_zeroes_the_context_only() {
    let plan = common::device::test_plan(2);
    let pipe = load(&folder_files("sdxl"), &plan, None);
    let (_, uncond) = pipe.conditions(PROMPT, "", true).unwrap();
    let uncond = uncond.unwrap();
    assert!(uncond.context.data.iter().all(|&v| v == 0.0));
    let pooled = uncond.pooled.unwrap();
    assert!(pooled.iter().any(|&v| v != 0.0), "pooled of \"\" is kept");
}

#[test]
fn taesd_decodes_instead_of_the_vae() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let (_, _, want) = reference_png("sd_pipeline/taesd/reference.safetensors");
    let got = run(
        &["-m", s(&d.join("sd1")), "--taesd", s(&d.join("taesd"))],
        &[],
        &tmp.path().join("tae.png"),
    );
    let p = psnr(&got, &want);
    eprintln!("sd1 + --taesd vs diffusers AutoencoderTiny: PSNR {p:.1} dB");
    assert!(p >= 60.0, "taesd: PSNR {p:.1} dB");
}

#[test]
fn img2img_and_batches_run_and_name_the_model_in_the_metadata() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let init = tmp.path().join("init.png");
    let data: Vec<u8> = (0..30 * 20)
        .flat_map(|i| [(i % 30 * 8) as u8, (i / 30 * 12) as u8, 128])
        .collect();
    let img = sd_cli::image_io::Image::new(30, 20, sd_cli::image_io::Channels::Rgb, data).unwrap();
    sd_cli::image_io::write_png_atomic(&init, &img, &[]).unwrap();
    let single = assemble_checkpoint(&d, "sd1.single", tmp.path());
    let out = tmp.path().join("out.png");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args([
            "-m",
            s(&single),
            "-p",
            PROMPT,
            "--steps",
            "3",
            "-W",
            "24",
            "-H",
            "16",
        ])
        .args([
            "--init-img",
            s(&init),
            "--strength",
            "0.6",
            "-b",
            "2",
            "--clip-skip",
            "2",
        ])
        .args(["-o", s(&out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut written: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("out") && n.ends_with(".png")
        })
        .collect();
    written.sort();
    assert_eq!(written.len(), 2, "two images written: {written:?}");
    let (a, b) = (
        read_png(&written[0]).unwrap(),
        read_png(&written[1]).unwrap(),
    );
    assert_ne!(a.data, b.data, "each image of a batch has its own seed");
    let text = sd_cli::image_io::read_png_text_pairs(&written[0]).unwrap();
    let params = text
        .iter()
        .map(|(_, v)| v.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(params.contains("Model: sd1.single"), "{params}");
    assert!(params.contains("Clip skip: 2"), "{params}");
}

/// `-M convert -m <diffusers pipeline folder>` writes one GGUF with each component under its
/// prefix; run as a single file it gives the folder's picture.
#[test]
fn a_converted_pipeline_folder_runs_as_a_single_file() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("sdxl.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "convert", "-m", s(&d.join("sdxl")), "-o", s(&gguf)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, _, want) = reference_png("sd_pipeline/sdxl/reference.safetensors");
    let got = run(&["-m", s(&gguf)], &[], &tmp.path().join("gguf.png"));
    let p = psnr(&got, &want);
    eprintln!("sdxl: converted pipeline folder (GGUF) vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 60.0, "converted folder: PSNR {p:.1} dB");
}
