//! Qwen Image 2.1 editing with reference images against diffusers' `QwenImage21Pipeline(image=…)`
//! on a tiny random-weight model with a real Qwen3-VL vision tower
//! (tests/reference/qwen_edit_pipeline_fixtures.py): reference latents, the prompt embedding
//! with vision embeddings in its slots and the slot mask, the final latent, the decoded RGBA
//! image, and the PNG written by `sd-cli -r`. Runs: one RGB reference (`one`) and an RGB plus
//! an RGBA reference with varied alpha (`two`); 96x64 target, true CFG 4 with a negative
//! prompt, 4 Euler steps, seed 42 on torch's CPU generator.
//! Tolerances: reference latents and embeddings 1e-4 × scale; latent and image 1e-3 × scale;
//! PNG PSNR ≥ 40 dB; cache on vs off 1e-4 × scale.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use sd_cli::image_io::{read_png, Image};
use sd_cli::pipeline::components::ComponentFiles;
use sd_cli::pipeline::qwen_image_2_1::{
    schedule_options, EditInputs, QwenImage21Pipeline, QwenImage21Request, DEFAULT_SAMPLER,
    DEFAULT_SCHEDULE,
};
use sd_cli::rng::RngKind;
use sd_cli::runner::BackendPlan;
use sd_cli::sampling::Guidance;
use sd_cli::sampling::SamplingPlan;
use sd_cli::tensor::HostTensor;

const PROMPT: &str = "change 'qwen2.1.cpp' to 'sd.cpp'";
const NEGATIVE: &str = "blurry, low quality";
const RUNS: [(&str, &[&str]); 2] = [
    ("one", &["ref_rgb.png"]),
    ("two", &["ref_rgb.png", "ref_rgba.png"]),
];

fn dir() -> PathBuf {
    fixture_path("qwen_edit_pipeline")
}

fn store(vision: bool) -> ComponentFiles {
    qwen_store(&dir(), vision)
}

fn load(files: &ComponentFiles, plan: &BackendPlan, cache: bool) -> QwenImage21Pipeline {
    let parts = QwenParts {
        encoder: true,
        vision: true,
    };
    qwen_pipeline(files, plan, cache, parts)
}

fn refs(files: &[&str]) -> Vec<Image> {
    files
        .iter()
        .map(|f| read_png(&dir().join(f)).unwrap())
        .collect()
}

fn sample(pipe: &QwenImage21Pipeline, edit: &EditInputs) -> HostTensor {
    sample_with(pipe, Some(edit), None, 42)
}

/// One 4-step run at 96x64 (true CFG 4) from `seed`, optionally editing and/or from an init
/// latent; returns the final latent.
fn sample_with(
    pipe: &QwenImage21Pipeline,
    edit: Option<&EditInputs>,
    init: Option<(&HostTensor, f32)>,
    seed: u64,
) -> HostTensor {
    let mut plan = SamplingPlan::new(DEFAULT_SAMPLER, DEFAULT_SCHEDULE, 4);
    plan.schedule_opts = schedule_options();
    let mut noise = RngKind::Cpu.create(seed);
    let mut srng = RngKind::Cpu.create(seed);
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
            init,
            edit,
            preview: None,
            mask: None,
        })
        .unwrap();
    HostTensor::new(x.ne, x.data).unwrap()
}

#[test]
fn stages_match_diffusers() {
    let reference = open_fixture("qwen_edit_pipeline/reference.safetensors");
    let s = store(true);
    let backends = common::device::test_plan(2);
    let pipe = load(&s, &backends, true);
    for (run, files) in RUNS {
        let edit = pipe
            .prepare_edit(&refs(files), 96 * 64, true, None)
            .unwrap();
        assert_eq!(edit.len(), files.len());
        for i in 0..files.len() {
            let want = tensor(&reference, &format!("{run}.ref{i}"));
            let got = edit.latent(i);
            assert_close(&format!("{run} reference latent {i}"), got, &want, 1e-4);
        }
        let (cond, pads) = pipe.edit_embedding(PROMPT, &edit).unwrap();
        assert_close(
            &format!("{run} cond embeds"),
            &cond,
            &tensor(&reference, &format!("{run}.cond")),
            1e-4,
        );
        let want_pads: Vec<bool> = tensor(&reference, &format!("{run}.cond_pads"))
            .data
            .iter()
            .map(|&v| v > 0.5)
            .collect();
        assert_eq!(pads, want_pads, "{run} image-slot mask");
        let (uncond, _) = pipe.edit_embedding(NEGATIVE, &edit).unwrap();
        assert_close(
            &format!("{run} uncond embeds"),
            &uncond,
            &tensor(&reference, &format!("{run}.uncond")),
            1e-4,
        );

        let x = sample(&pipe, &edit);
        assert_eq!(pipe.prefix_cache_bytes(), 0, "cache freed after sampling");
        assert_close(
            &format!("{run} final latent"),
            &x,
            &tensor(&reference, &format!("{run}.latent")),
            1e-3,
        );
    }
}

#[test]
fn prefix_cache_on_and_off_agree() {
    let s = store(true);
    let backends = common::device::test_plan(2);
    let on = load(&s, &backends, true);
    let off = load(&s, &backends, false);
    let r = refs(RUNS[1].1);
    let a = sample(&on, &on.prepare_edit(&r, 96 * 64, true, None).unwrap());
    let b = sample(&off, &off.prepare_edit(&r, 96 * 64, true, None).unwrap());
    assert_close("cache on vs off", &a, &b, 1e-4);
}

fn sd_cli(out: &Path, extra: &[&str]) -> Output {
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
            "-W", "96", "-H", "64", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["-o", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn sd_cli_edit_matches_diffusers_image() {
    let reference = open_fixture("qwen_edit_pipeline/reference.safetensors");
    let d = dir();
    let vision = d.join("llm_vision");
    let tmp = tempfile::tempdir().unwrap();
    for (run, files) in RUNS {
        let want = tensor(&reference, &format!("{run}.image")); // [W, H, 4] planar
        let (w, h, c) = (want.ne[0], want.ne[1], want.ne[2]);
        let mut want_u8 = vec![0u8; w * h * c];
        for ch in 0..c {
            for i in 0..w * h {
                want_u8[i * c + ch] = (want.data[ch * w * h + i] * 255.0).round() as u8;
            }
        }
        let mut args = vec![
            "--llm_vision".to_string(),
            vision.to_str().unwrap().to_string(),
        ];
        for f in files {
            args.push("-r".into());
            args.push(d.join(f).to_str().unwrap().to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = tmp.path().join(format!("{run}.png"));
        let o = sd_cli(&out, &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let img = read_png(&out).unwrap();
        assert_eq!((img.width as usize, img.height as usize), (w, h));
        let p = psnr(&img.data, &want_u8);
        eprintln!("{run}: sd-cli -r vs diffusers PNG: PSNR {p:.1} dB");
        assert!(p >= 40.0, "{run}: PSNR {p:.1} dB");
    }
}

/// diffusers resizes references to `output_resolution`² pixels (1024² by default) whatever the
/// output size; sd-cli to the output's area. `--ref-image-args ref_resolution=96` reproduces
/// `output_resolution=96` on a 64×32 output (the fixture's `outres` run); without it the
/// reference is smaller and the picture differs.
#[test]
fn ref_resolution_reproduces_diffusers_output_resolution() {
    let reference = open_fixture("qwen_edit_pipeline/reference.safetensors");
    let want = tensor(&reference, "outres.image");
    let (w, h, c) = (want.ne[0], want.ne[1], want.ne[2]);
    let want_u8: Vec<u8> = (0..w * h * c)
        .map(|i| (want.data[(i % c) * w * h + i / c] * 255.0).round() as u8)
        .collect();
    let d = dir();
    let path = |f: &str| d.join(f).to_str().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let out = tmp.path().join(name);
        let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args(["--diffusion-model", &path("diffusion_model.safetensors")])
            .args(["--vae", &path("vae.safetensors")])
            .args(["--llm", &path("llm.safetensors")])
            .args(["--llm_vision", &path("llm_vision")])
            .args(["-r", &path("ref_rgb.png")])
            .args(["-p", PROMPT, "-n", NEGATIVE, "--cfg-scale", "4"])
            .args(["--steps", "4", "-W", "64", "-H", "32", "-s", "42"])
            .args(["--rng", "cpu", "-t", "2", "-o", out.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let img = read_png(&out).unwrap();
        assert_eq!((img.width as usize, img.height as usize), (w, h));
        psnr(&img.data, &want_u8)
    };
    let with = run("with.png", &["--ref-image-args", "ref_resolution=96"]);
    let without = run("without.png", &[]);
    eprintln!("ref_resolution=96 vs diffusers output_resolution=96: PSNR {with:.1} dB (sd-cli's output area: {without:.1} dB)");
    assert!(with >= device::psnr_floor(70.0), "PSNR {with:.1} dB");
    assert!(
        without < with - 10.0,
        "the reference area must matter ({without:.1} dB)"
    );
}

/// Every component as its diffusers folder, as `QwenImage21Pipeline.save_pretrained` lays them
/// out: `transformer/` (its config.json says patch_size 1), `text_encoder/` (the language model
/// and the vision tower in one file, with the Qwen3VLConfig), `vae/`, and the tokenizer and
/// image processor in `processor/`. Each component reads only its own config.json: the vision
/// tower's patch 16 must not come from the transformer's patch 1.
#[test]
fn diffusers_folders_edit_matches_diffusers_image() {
    let d = dir();
    let configs = d.join("diffusers");
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("Qwen-Image-2.1");
    for sub in ["transformer", "text_encoder", "vae", "processor"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
        for f in std::fs::read_dir(configs.join(sub)).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, root.join(sub).join(f.file_name().unwrap())).unwrap();
        }
    }
    let weights = "diffusion_pytorch_model.safetensors";
    std::fs::copy(
        d.join("diffusion_model.safetensors"),
        root.join("transformer").join(weights),
    )
    .unwrap();
    std::fs::copy(d.join("vae.safetensors"), root.join("vae").join(weights)).unwrap();
    merge_safetensors(
        &root.join("text_encoder/model.safetensors"),
        &[
            &d.join("llm.safetensors"),
            &d.join("llm_vision/model.safetensors"),
        ],
    );
    std::fs::copy(
        d.join("tokenizer.json"),
        root.join("processor/tokenizer.json"),
    )
    .unwrap();

    let reference = open_fixture("qwen_edit_pipeline/reference.safetensors");
    let want = tensor(&reference, "one.image"); // [W, H, 4] planar
    let (w, h, c) = (want.ne[0], want.ne[1], want.ne[2]);
    let mut want_u8 = vec![0u8; w * h * c];
    for ch in 0..c {
        for i in 0..w * h {
            want_u8[i * c + ch] = (want.data[ch * w * h + i] * 255.0).round() as u8;
        }
    }
    let out = tmp.path().join("edit.png");
    let folder = |s: &str| root.join(s).to_str().unwrap().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", &folder("transformer")])
        .args(["--llm", &folder("text_encoder")])
        .args(["--vae", &folder("vae")])
        .args(["-r", d.join("ref_rgb.png").to_str().unwrap()])
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
            "-W", "96", "-H", "64", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["-o", out.to_str().unwrap(), "-v"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains("processor/preprocessor_config.json"),
        "the image processor comes from processor/: {log}"
    );
    let img = read_png(&out).unwrap();
    let p = psnr(&img.data, &want_u8);
    eprintln!("diffusers folders: sd-cli -r vs diffusers PNG: PSNR {p:.1} dB");
    assert!(p >= 40.0, "PSNR {p:.1} dB");
}

#[test]
fn edit_without_vision_weights_is_a_clear_error() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let o = sd_cli(
        &tmp.path().join("x.png"),
        &["-r", d.join("ref_rgb.png").to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("vision"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn corrupt_reference_png_is_a_clear_error() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.png");
    let mut bytes = std::fs::read(d.join("ref_rgb.png")).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&bad, bytes).unwrap();
    let vision = d.join("llm_vision");
    let o = sd_cli(
        &tmp.path().join("x.png"),
        &[
            "--llm_vision",
            vision.to_str().unwrap(),
            "-r",
            bad.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.png"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn mmproj_gguf_vision_weights_give_the_same_image() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let run = |vision: &str, name: &str| {
        let out = tmp.path().join(name);
        let o = sd_cli(
            &out,
            &[
                "--llm_vision",
                d.join(vision).to_str().unwrap(),
                "-r",
                d.join("ref_rgb.png").to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        read_png(&out).unwrap()
    };
    let hf = run("llm_vision", "hf.png");
    let gguf = run("mmproj.gguf", "gguf.png");
    let p = psnr(&hf.data, &gguf.data);
    eprintln!("mmproj GGUF vs HF vision weights: PSNR {p:.1} dB");
    assert!(p >= 60.0, "PSNR {p:.1} dB");
}

/// `--init-img`: strength 1 starts from pure noise at σ = 1, so it must equal text-to-image;
/// a lower strength starts later in the schedule from the noised init latent and differs.
#[test]
fn init_image_strength_one_equals_text_to_image() {
    let s = store(false);
    let backends = common::device::test_plan(2);
    let parts = QwenParts {
        encoder: true,
        vision: false,
    };
    let pipe = qwen_pipeline(&s, &backends, true, parts);
    let init = read_png(&dir().join("ref_rgb.png")).unwrap();
    let prepared = sd_cli::pipeline::qwen_image_2_1::prepare_reference(&init, 96, 64).unwrap();
    let x = HostTensor::image(96, 64, 4, prepared.vae_input).unwrap();
    let z = pipe.encode_image(&x, None).unwrap();
    assert_eq!((z.width(), z.height(), z.channels()), (6, 4, 64));
    let run = |init| sample_with(&pipe, None, init, 7);
    let t2i = run(None);
    assert_close("strength 1 vs txt2img", &run(Some((&z, 1.0))), &t2i, 1e-6);
    let half = run(Some((&z, 0.5)));
    let diff = half
        .data
        .iter()
        .zip(&t2i.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        diff > 1e-2,
        "strength 0.5 should differ from txt2img ({diff})"
    );
}

#[test]
fn init_image_sets_the_output_size() {
    let d = dir();
    let path = |f: &str| d.join(f).to_str().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("i2i.png");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", &path("diffusion_model.safetensors")])
        .args(["--vae", &path("vae.safetensors")])
        .args(["--llm", &path("llm.safetensors")])
        .args(["-p", PROMPT, "--steps", "2", "--strength", "0.5", "-t", "2"])
        .args(["--init-img", &path("ref_rgb.png")])
        .args(["-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let img = read_png(&out).unwrap();
    // 80x48 floored to multiples of 32.
    assert_eq!((img.width, img.height), (64, 32));
}

#[test]
fn unresized_reference_must_be_a_multiple_of_32() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let vision = d.join("llm_vision");
    let o = sd_cli(
        &tmp.path().join("x.png"),
        &[
            "--llm_vision",
            vision.to_str().unwrap(),
            "--disable-auto-resize-ref-image",
            "-r",
            d.join("ref_rgb.png").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("80x48") && err.contains("multiples of 32"),
        "{err}"
    );
}

#[test]
fn ref_image_args_cap_the_reference_area() {
    let d = dir();
    let tmp = tempfile::tempdir().unwrap();
    let vision = d.join("llm_vision");
    let reference = d.join("ref_rgb.png");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--llm_vision",
            vision.to_str().unwrap(),
            "-r",
            reference.to_str().unwrap(),
            "-v",
        ];
        args.extend_from_slice(extra);
        sd_cli(&tmp.path().join("x.png"), &args)
    };
    // 80x48 at a 2048-pixel cap: round(√(2048·5/3)/32)·32 = 64 wide, 32 high.
    let o = run(&["--ref-image-args", "vae_input_max_pixels=2048,preset=qwen"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.contains("80x48 -> 64x32"), "{log}");
    assert!(log.contains("preset has no effect"), "{log}");
    let o = run(&["--ref-image-args", "pass_to_dit=false"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("pass_to_dit"));
}
