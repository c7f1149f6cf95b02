//! Z-Image against diffusers on tiny random-weight models (tests/reference/z_image_fixtures.py):
//! transformer calls in the diffusers layout and in the released single-file names, with a
//! caption that needs padding to 32 tokens and one that does not; the Qwen3 caption states of
//! the chat template; whole `sd-cli` runs against `ZImagePipeline` (CFG with a negative
//! prompt, and Turbo's cfg 1) under sd-cli's schedule.
//!
//! Tolerances: transformer 1e-4 × max(1, max |reference|); caption states 1e-4 (× scale);
//! images ≥ 60 dB PSNR (8-bit PNG).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::models::dit::sd3::unpatchify;
use sd_cli::models::dit::z_image::{patchify, ZImage, ZImageConfig, ZImageInputs, ZImageLayout};
use sd_cli::models::te::qwen3::{self, Qwen3Config, Qwen3Source, Qwen3TextModel};
use sd_cli::pipeline::z_image::{weighted_ids, TEMPLATE};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::tokenizers::load_qwen_tokenizer;
use sd_cli::weights::TensorStore;

fn model(path: &Path, prefix: &str) -> (ZImage, Runner) {
    let backend = cpu();
    let store = TensorStore::open(path).unwrap();
    let source = StoreSource::new(&store, prefix);
    let loader = WeightLoader::new(&source, None);
    let config = ZImageConfig::detect(&loader.root("")).unwrap();
    let m = ZImage::new(&loader.root(""), config).unwrap();
    let weights = loader.finish(&backend, "zimage").unwrap();
    (
        m,
        Runner::new("zimage", backend, Some(weights), RunOptions::default()),
    )
}

fn check_calls(what: &str, m: &ZImage, runner: &Runner) {
    let r = open_fixture("z_image/reference.safetensors");
    for i in 0..2 {
        let x = tensor(&r, &format!("call{i}_x"));
        let cap = tensor(&r, &format!("call{i}_cap"));
        let sigma = tensor(&r, &format!("call{i}_sigma")).data[0];
        let [w, h, c, _] = x.ne;
        let p = m.config().patch_size;
        let tokens = patchify(&x, p);
        let mut out = runner
            .compute(|g| {
                let inputs = ZImageInputs {
                    img: g.input_f32("img", tokens.ne, tokens.data.clone()),
                    grid: (h / p, w / p),
                    cap: g.input_f32("cap", cap.ne, cap.data.clone()),
                    sigmas: &[sigma],
                };
                vec![m.forward(g, &inputs).unwrap()]
            })
            .unwrap();
        let got = unpatchify(&out.pop().unwrap().data, w, h, c, p);
        assert_close(
            &format!("{what} call {i}"),
            &got,
            &tensor(&r, &format!("call{i}_out")),
            1e-4,
        );
    }
}

#[test]
fn transformer_matches_diffusers_in_both_layouts() {
    let dir = fixture_path("z_image");
    let (m, runner) = model(
        &dir.join("transformer/diffusion_pytorch_model.safetensors"),
        "",
    );
    let c = m.config();
    assert_eq!(c.layout, ZImageLayout::Diffusers);
    assert_eq!(
        (c.dim, c.heads, c.layers, c.refiner_layers, c.cap_dim),
        (32, 2, 2, 1, 24)
    );
    check_calls("diffusers", &m, &runner);
    let (m, runner) = model(&dir.join("z_image.safetensors"), "model.diffusion_model.");
    assert_eq!(m.config().layout, ZImageLayout::Original);
    check_calls("single file", &m, &runner);
}

#[test]
fn caption_states_match_the_qwen3_hidden_states() {
    let dir = fixture_path("z_image");
    let r = open_fixture("z_image/reference.safetensors");
    let tok = load_qwen_tokenizer(&dir.join("tokenizer/tokenizer.json")).unwrap();
    let store = TensorStore::open(&dir.join("text_encoder/model.safetensors")).unwrap();
    let source = Qwen3Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config = Qwen3Config::detect(&loader.root(""), Some(1e6), Some(1e-6)).unwrap();
    let layers = config.layers - 1;
    let model = Qwen3TextModel::new(&loader.root(""), config).unwrap();
    let backend = cpu();
    let weights = loader.finish(&backend, "qwen3").unwrap();
    let runner = Runner::new("qwen3", backend, Some(weights), RunOptions::default());
    for (case, text) in [
        ("prompt", "A lovely cat, holding a sign."),
        ("negative", "blurry"),
        ("empty", ""),
    ] {
        let ids: Vec<i32> = tok
            .encode(&TEMPLATE.render(text, ""))
            .into_iter()
            .map(|t| t as i32)
            .collect();
        let want: Vec<i32> = tensor(&r, &format!("{case}_ids"))
            .data
            .iter()
            .map(|&v| v as i32)
            .collect();
        assert_eq!(ids, want, "{case}: template token ids");
        let got = qwen3::encode_layers(&runner, &model, &ids, Some(layers)).unwrap();
        assert_close(case, &got, &tensor(&r, &format!("{case}_states")), 1e-4);
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(model: &Path, extra: &[&str], out: &Path) -> sd_cli::image_io::Image {
    run_prompt(model, "A lovely cat, holding a sign.", extra, out)
}

fn run_prompt(model: &Path, prompt: &str, extra: &[&str], out: &Path) -> sd_cli::image_io::Image {
    let dir = fixture_path("z_image");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", s(model)])
        .args(["--llm", s(&dir.join("text_encoder/model.safetensors"))])
        .args(["--vae", s(&fixture_path("flux").join("vae"))])
        .args(["-p", prompt, "--steps", "4"])
        .args([
            "-W", "48", "-H", "32", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_png(out).unwrap()
}

#[test]
fn runs_match_the_diffusers_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path("z_image");
    let r = open_fixture("z_image/reference.safetensors");
    let folder: PathBuf = dir.join("transformer/diffusion_pytorch_model.safetensors");
    let cases: [(&str, &Path, &[&str]); 3] = [
        (
            "image_cfg",
            &folder,
            &["-n", "blurry", "--cfg-scale", "4.5"],
        ),
        ("image_turbo", &folder, &["--cfg-scale", "1"]),
        (
            "image_cfg",
            &dir.join("z_image.safetensors"),
            &["-n", "blurry", "--cfg-scale", "4.5"],
        ),
    ];
    for (i, (name, model, extra)) in cases.into_iter().enumerate() {
        let img = run(model, extra, &tmp.path().join(format!("{i}.png")));
        let p = psnr(&img.data, &image_bytes(&tensor(&r, name)));
        eprintln!("Z-Image {name} ({}): PSNR {p:.1} dB", model.display());
        assert!(p >= 60.0, "{name}: PSNR {p:.1} dB");
    }
}

/// `-M convert` to a q8_0 GGUF runs (≥ 35 dB against the f32 reference); a budget forcing
/// the transformer into several segments (and small enough that the VAE still decodes
/// untiled) gives the monolithic picture exactly.
#[test]
fn q8_0_gguf_and_segmented_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path("z_image");
    let r = open_fixture("z_image/reference.safetensors");
    let want = image_bytes(&tensor(&r, "image_turbo"));
    let gguf = tmp.path().join("z_image-q8_0.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "convert", "-m", s(&dir.join("z_image.safetensors"))])
        .args(["-o", s(&gguf), "--type", "q8_0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q8 = run(&gguf, &["--cfg-scale", "1"], &tmp.path().join("q8.png"));
    let p = psnr(&q8.data, &want);
    eprintln!("Z-Image q8_0 GGUF: PSNR {p:.1} dB");
    assert!(p >= 35.0, "q8_0: PSNR {p:.1} dB");

    let model = dir.join("z_image.safetensors");
    let whole = run(&model, &["--cfg-scale", "1"], &tmp.path().join("whole.png"));
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", s(&model)])
        .args(["--llm", s(&dir.join("text_encoder/model.safetensors"))])
        .args(["--vae", s(&fixture_path("flux").join("vae"))])
        .args(["-p", "A lovely cat, holding a sign.", "--steps", "4"])
        .args([
            "-W", "48", "-H", "32", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args([
            "--cfg-scale",
            "1",
            "--offload-to-cpu",
            "--max-vram",
            "0.003",
        ])
        .args(["-v", "-o", s(&tmp.path().join("seg.png"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("z_image segment 2/"),
        "the transformer runs in segments: {err}"
    );
    assert!(
        !err.contains("spatial tiling"),
        "the VAE is not tiled: {err}"
    );
    let seg = read_png(&tmp.path().join("seg.png")).unwrap();
    assert_eq!(seg.data, whole.data, "segmented == whole");
}

/// A diffusers/PEFT LoRA (split q/k/v, the output projection, a feed-forward, a refiner, the
/// patch embedder) on the released single file, whose fused `qkv` takes it on row thirds, and on
/// the diffusers folder.
#[test]
fn peft_lora_lands_on_both_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path("z_image");
    let r = open_fixture("z_image/reference.safetensors");
    let loras = dir.join("loras");
    for (i, model) in [
        dir.join("z_image.safetensors"),
        dir.join("transformer/diffusion_pytorch_model.safetensors"),
    ]
    .iter()
    .enumerate()
    {
        let img = run_prompt(
            model,
            "A lovely cat, holding a sign.<lora:z_image_peft:1>",
            &["--cfg-scale", "1", "--lora-model-dir", s(&loras)],
            &tmp.path().join(format!("lora{i}.png")),
        );
        let p = psnr(&img.data, &image_bytes(&tensor(&r, "lora_image")));
        eprintln!("Z-Image LoRA ({}): PSNR {p:.1} dB", model.display());
        assert!(p >= 60.0, "LoRA: PSNR {p:.1} dB");
    }
}

/// Emphasis as upstream: `(cat:1.5)` tokenized apart from the rest and its state rows weighted
/// (the chunk's mean kept), the template's pieces too.
#[test]
fn emphasis_weights_the_caption_as_upstream() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path("z_image");
    let r = open_fixture("z_image/reference.safetensors");
    let tok = load_qwen_tokenizer(&dir.join("tokenizer/tokenizer.json")).unwrap();
    let prompt = "A lovely (cat:1.5), holding a sign.";
    let (ids, weights) = weighted_ids(&tok, prompt).unwrap();
    let want: Vec<i32> = tensor(&r, "weighted_ids")
        .data
        .iter()
        .map(|&v| v as i32)
        .collect();
    assert_eq!(ids, want, "piecewise token ids");
    assert!(weights.contains(&1.5));
    let img = run_prompt(
        &dir.join("z_image.safetensors"),
        prompt,
        &["--cfg-scale", "1"],
        &tmp.path().join("w.png"),
    );
    let p = psnr(&img.data, &image_bytes(&tensor(&r, "image_weighted")));
    eprintln!("Z-Image weighted prompt: PSNR {p:.1} dB");
    assert!(p >= 60.0, "weighted prompt: PSNR {p:.1} dB");
}

/// The diffusers folder as `-m` (model_index.json, transformer/, text_encoder/, tokenizer/,
/// vae/), as the Hugging Face repository ships it.
#[test]
fn diffusers_folder_runs_as_one_model() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("Z-Image-Turbo");
    let dir = fixture_path("z_image");
    let copy = |from: &Path, to: &str| {
        let to = root.join(to);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    copy(&dir.join("transformer"), "transformer");
    copy(&dir.join("text_encoder"), "text_encoder");
    copy(&dir.join("tokenizer"), "tokenizer");
    copy(&fixture_path("flux").join("vae"), "vae");
    std::fs::write(
        root.join("model_index.json"),
        r#"{"_class_name": "ZImagePipeline", "text_encoder": ["transformers", "Qwen3Model"],
            "tokenizer": ["transformers", "Qwen2Tokenizer"],
            "transformer": ["diffusers", "ZImageTransformer2DModel"],
            "vae": ["diffusers", "AutoencoderKL"]}"#,
    )
    .unwrap();
    let out = tmp.path().join("folder.png");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-m", s(&root)])
        .args(["-p", "A lovely cat, holding a sign.", "--steps", "4"])
        .args([
            "-W", "48", "-H", "32", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["--cfg-scale", "1", "-o", s(&out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = open_fixture("z_image/reference.safetensors");
    let p = psnr(
        &read_png(&out).unwrap().data,
        &image_bytes(&tensor(&r, "image_turbo")),
    );
    eprintln!("Z-Image diffusers folder: PSNR {p:.1} dB");
    assert!(p >= 60.0, "folder: PSNR {p:.1} dB");
}
