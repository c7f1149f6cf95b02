//! A full Qwen Image 2.1 text-to-image run against diffusers' `QwenImage21Pipeline` on a tiny
//! random-weight model (tests/reference/qwen_image_pipeline_fixtures.py): prompt embeddings,
//! the final latent, the decoded RGBA image, and the PNG written by the `sd-cli` binary.
//! The run uses true CFG (4.0, a negative prompt), 4 Euler steps on the flux schedule with the
//! Qwen Image 2.1 parameters, 96x64 (6x4 tokens), seed 42 on torch's CPU generator.
//! Tolerances: embeddings 1e-4 × scale; latent and image 1e-3 × scale; PNG PSNR ≥ 40 dB.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::pipeline::components::{ComponentFiles, ComponentId, ComponentStore};
use sd_cli::pipeline::qwen_image_2_1::{
    schedule_options, QwenImage21Pipeline, QwenImage21Request, DEFAULT_SAMPLER, DEFAULT_SCHEDULE,
};
use sd_cli::rng::RngKind;
use sd_cli::runner::BackendPlan;
use sd_cli::sampling::Guidance;
use sd_cli::sampling::SamplingPlan;
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

const PROMPT: &str = "a lovely cat holding a sign says 'qwen2.1.cpp'";
const NEGATIVE: &str = "blurry, low quality";

fn dir() -> PathBuf {
    fixture_path("qwen_image_pipeline")
}

fn store() -> ComponentFiles {
    qwen_store(&dir(), false)
}

fn load(files: &ComponentFiles, plan: &BackendPlan, cache: bool) -> QwenImage21Pipeline {
    let parts = QwenParts {
        encoder: false,
        vision: false,
    };
    qwen_pipeline(files, plan, cache, parts)
}

fn sample_plan() -> SamplingPlan {
    let mut plan = SamplingPlan::new(DEFAULT_SAMPLER, DEFAULT_SCHEDULE, 4);
    plan.schedule_opts = schedule_options();
    plan
}

#[test]
fn stages_match_diffusers() {
    let reference = open_fixture("qwen_image_pipeline/reference.safetensors");
    let s = store();
    let backends = common::device::test_plan(2);
    let pipe = load(&s, &backends, true);

    for (name, text) in [("cond", PROMPT), ("uncond", NEGATIVE)] {
        let got = pipe.encode_prompt(text).unwrap();
        assert_close(
            &format!("prompt embeds {name}"),
            &got,
            &tensor(&reference, name),
            1e-4,
        );
    }

    let plan = sample_plan();
    let mut noise = RngKind::Cpu.create(42);
    let mut srng = RngKind::Cpu.create(42);
    let x = pipe
        .sample(QwenImage21Request {
            prompt: PROMPT,
            negative_prompt: NEGATIVE,
            width: 96,
            height: 64,
            guidance: Guidance::cfg(4.0),
            plan: &plan,
            noise_rng: noise.as_mut(),
            sampler_rng: srng.as_mut(),
            vae_tiling: None,
            keep_prefix_cache: false,
            init: None,
            edit: None,
            preview: None,
            mask: None,
        })
        .unwrap();
    assert_eq!(pipe.prefix_cache_bytes(), 0, "cache freed after sampling");
    let got = HostTensor::new(x.ne, x.data.clone()).unwrap();
    assert_close("final latent", &got, &tensor(&reference, "latent"), 1e-3);

    let img = pipe.decode(&x, None).unwrap();
    assert_eq!(img.channels(), 4, "RGBA");
    let got = HostTensor::new(img.ne, img.data).unwrap();
    assert_close(
        "decoded image (float)",
        &got,
        &tensor(&reference, "image"),
        1e-3,
    );
}

#[test]
fn sizes_must_be_multiples_of_32() {
    let s = store();
    let backends = common::device::test_plan(2);
    let pipe = load(&s, &backends, false);
    let plan = sample_plan();
    let mut noise = RngKind::Cpu.create(1);
    let mut srng = RngKind::Cpu.create(1);
    let e = pipe
        .sample(QwenImage21Request {
            prompt: PROMPT,
            negative_prompt: "",
            width: 80,
            height: 64,
            guidance: Guidance::cfg(1.0),
            plan: &plan,
            noise_rng: noise.as_mut(),
            sampler_rng: srng.as_mut(),
            vae_tiling: None,
            keep_prefix_cache: false,
            init: None,
            edit: None,
            preview: None,
            mask: None,
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of 32"), "{e}");
}

fn sd_cli(out: &Path, extra: &[&str]) -> Output {
    sd_cli_seed(out, "42", extra)
}

fn sd_cli_seed(out: &Path, seed: &str, extra: &[&str]) -> Output {
    let d = dir();
    let path = |f: &str| d.join(f).to_str().unwrap().to_string();
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", &path("diffusion_model.safetensors")])
        .args(["--vae", &path("vae.safetensors")])
        .args(["--llm", &path("llm.safetensors")])
        .args([
            "-p",
            PROMPT,
            "-n",
            NEGATIVE,
            "--cfg-scale",
            "4",
            "--steps",
            "4",
        ])
        .args([
            "-W", "96", "-H", "64", "-s", seed, "--rng", "cpu", "-t", "2",
        ])
        .args(["-o", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

fn run_ok(out: &Path, extra: &[&str]) -> sd_cli::image_io::Image {
    let o = sd_cli(out, extra);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_png(out).unwrap()
}

#[test]
fn sd_cli_run_matches_diffusers_image() {
    let reference = open_fixture("qwen_image_pipeline/reference.safetensors");
    let want = tensor(&reference, "image"); // [W, H, 4] planar
    let (w, h, c) = (want.ne[0], want.ne[1], want.ne[2]);
    assert_eq!(c, 4);
    let mut want_u8 = vec![0u8; w * h * c];
    for ch in 0..c {
        for y in 0..h {
            for x in 0..w {
                want_u8[(y * w + x) * c + ch] =
                    (want.data[ch * w * h + y * w + x] * 255.0).round() as u8;
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    // Defaults: euler + flux(Qwen Image 2.1) schedule, prefix cache on (f32 without flash
    // attention).
    let img = run_ok(&tmp.path().join("cat.png"), &[]);
    assert_eq!((img.width as usize, img.height as usize), (w, h));
    assert_eq!(img.data.len(), w * h * 4, "RGBA PNG");
    let p = psnr(&img.data, &want_u8);
    eprintln!("sd-cli vs diffusers PNG: PSNR {p:.1} dB");
    assert!(p >= 40.0, "PSNR {p:.1} dB");
}

#[test]
fn prefix_cache_on_off_and_batch_give_the_same_images() {
    let tmp = tempfile::tempdir().unwrap();
    let off = run_ok(
        &tmp.path().join("off.png"),
        &["--model-args", "qwen_image_2_1_prefix_cache=false"],
    );
    let on = run_ok(
        &tmp.path().join("on.png"),
        &[
            "--model-args",
            "qwen_image_2_1_prefix_cache=true,qwen_image_2_1_prefix_cache_type=f32",
        ],
    );
    let p = psnr(&on.data, &off.data);
    eprintln!("prefix cache on vs off: PSNR {p:.1} dB");
    assert!(p >= 50.0, "cache on vs off: PSNR {p:.1} dB");

    // f16 storage: a small rounding of the cached K/V only.
    let f16 = run_ok(
        &tmp.path().join("f16.png"),
        &["--model-args", "qwen_image_2_1_prefix_cache_type=f16"],
    );
    let p16 = psnr(&f16.data, &off.data);
    eprintln!("prefix cache f16 vs off: PSNR {p16:.1} dB");
    assert!(p16 >= 40.0, "f16 cache vs off: PSNR {p16:.1} dB");

    // Two images with the cache kept between them: the second equals a run with seed 43.
    let batch = tmp.path().join("batch.png");
    let o = sd_cli(&batch, &["-b", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Batch outputs are named batch_0.png, batch_1.png (begin index 0).
    let mut names: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("batch")
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    let first = read_png(&names[0]).unwrap();
    assert_eq!(first.data, on.data, "first image of the batch");
    let second_path = names[1].clone();
    let second = read_png(&second_path).unwrap();
    let single = sd_cli_seed(&tmp.path().join("s43.png"), "43", &[]);
    assert!(single.status.success());
    let s43 = read_png(&tmp.path().join("s43.png")).unwrap();
    let p = psnr(&second.data, &s43.data);
    eprintln!("batch image 2 (kept cache) vs seed 43: PSNR {p:.1} dB");
    assert!(p >= 50.0, "PSNR {p:.1} dB");
    assert_ne!(second.data, first.data);
}

#[test]
fn bad_prefix_cache_type_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let o = sd_cli(
        &tmp.path().join("x.png"),
        &["--model-args", "qwen_image_2_1_prefix_cache_type=q8_1"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("q8_1"), "{err}");
}

fn one_step(pipe: &QwenImage21Pipeline) -> Vec<f32> {
    let mut plan = sample_plan();
    plan.steps = 2;
    let mut noise = RngKind::Cpu.create(7);
    let mut srng = RngKind::Cpu.create(7);
    pipe.sample(QwenImage21Request {
        prompt: PROMPT,
        negative_prompt: "",
        width: 64,
        height: 32,
        guidance: Guidance::cfg(1.0),
        plan: &plan,
        noise_rng: noise.as_mut(),
        sampler_rng: srng.as_mut(),
        vae_tiling: None,
        keep_prefix_cache: false,
        init: None,
        edit: None,
        preview: None,
        mask: None,
    })
    .unwrap()
    .data
}

/// A store whose transformer sits one `model.diffusion_model.` deeper than the component
/// prefix (a hand-built store of single-file names) loads the same; also the conditional-only
/// path (cfg 1) with the prefix cache on vs off.
#[test]
fn single_file_diffusion_prefix_loads_the_same() {
    let d = dir();
    let backends = common::device::test_plan(2);
    let plain = store();
    let want = one_step(&load(&plain, &backends, true));

    let mut nested = TensorStore::new();
    let deep = format!("{}model.diffusion_model.", Component::Diffusion.prefix());
    let path = d.join("diffusion_model.safetensors");
    nested.add_file(&path, &deep).unwrap();
    let nested = ComponentFiles::new("Qwen Image 2.1")
        .with(
            ComponentId::Diffusion,
            ComponentStore {
                store: nested,
                path,
            },
        )
        .with(
            ComponentId::Llm,
            component(ComponentId::Llm, &d.join("llm.safetensors")),
        )
        .with(
            ComponentId::Vae,
            component(ComponentId::Vae, &d.join("vae.safetensors")),
        );
    let got = one_step(&load(&nested, &backends, false));
    assert_eq!(got.len(), 4 * 2 * 64);
    let err = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        err <= 1e-5,
        "nested prefix / cache off vs plain / cache on: {err}"
    );
}
