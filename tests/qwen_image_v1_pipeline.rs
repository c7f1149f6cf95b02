//! Qwen Image (v1) against diffusers on tiny random-weight models
//! (tests/reference/qwen_image_v1_fixtures.py): transformer calls in the diffusers folder and
//! the single-file names (an even grid with diffusers' rope, an odd one with sd-cli's
//! centring); the Qwen2.5-VL text states of the template (final norm, 34 rows dropped), plain
//! and with upstream's emphasis; whole `sd-cli` runs against `QwenImagePipeline` (cfg 1) and
//! against its components in sd-cli's CFG loop, on the Wan VAE fixture.
//!
//! Tolerances: transformer 1e-4 × max(1, max |reference|); text states 1e-4 (× scale);
//! images ≥ 60 dB PSNR (8-bit PNG).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::models::dit::flux::packing::{pack, unpack};
use sd_cli::models::dit::qwen_image::{QwenImage, QwenImageConfig, QwenImageInputs, RefIndex};
use sd_cli::models::te::qwen3::{self, qwen3_heads, Qwen3Config, Qwen3Source, Qwen3TextModel};
use sd_cli::pipeline::qwen_image::{DROP_TOKENS, PROMPT_PREFIX, PROMPT_SUFFIX, TEMPLATE};
use sd_cli::pipeline::text::{apply_token_weights, weighted_template_ids};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::tokenizers::load_qwen_tokenizer;
use sd_cli::weights::TensorStore;

const FIX: &str = "qwen_image_v1";
const PROMPT: &str = "A lovely cat, holding a sign.";

fn model(path: &Path, prefix: &str) -> (QwenImage, Runner) {
    let backend = cpu();
    let store = TensorStore::open(path).unwrap();
    let source = StoreSource::new(&store, prefix);
    let loader = WeightLoader::new(&source, None);
    let config = QwenImageConfig::detect(&loader.root(""))
        .unwrap()
        .with_axes_dims([4, 6, 6])
        .unwrap();
    let m = QwenImage::new(&loader.root(""), config).unwrap();
    let weights = loader.finish(&backend, "qwen_image").unwrap();
    (
        m,
        Runner::new("qwen_image", backend, Some(weights), RunOptions::default()),
    )
}

fn check_calls(what: &str, m: &QwenImage, runner: &Runner) {
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    for (i, grid) in [(4usize, 6usize), (3, 5)].into_iter().enumerate() {
        let x = tensor(&r, &format!("call{i}_x"));
        let txt = tensor(&r, &format!("call{i}_txt"));
        let sigma = tensor(&r, &format!("call{i}_sigma")).data[0];
        let got = runner
            .compute_one(|g| {
                let inputs = QwenImageInputs {
                    img: g.input_f32("img", x.ne, x.data.clone()),
                    grids: &[grid],
                    txt: g.input_f32("txt", txt.ne, txt.data.clone()),
                    timesteps: &[sigma],
                    ref_index: RefIndex::Increase,
                    zero_cond_t: false,
                };
                m.forward(g, &inputs)
            })
            .unwrap();
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
    let dir = fixture_path(FIX);
    let (m, runner) = model(
        &dir.join("transformer/diffusion_pytorch_model.safetensors"),
        "",
    );
    let c = m.config();
    assert_eq!(
        (
            c.hidden_size,
            c.heads,
            c.layers,
            c.text_dim,
            c.latent_channels()
        ),
        (32, 2, 2, 24, 16)
    );
    check_calls("diffusers", &m, &runner);
    let (m, runner) = model(
        &dir.join("qwen_image.safetensors"),
        "model.diffusion_model.",
    );
    check_calls("single file", &m, &runner);
}

#[test]
fn packing_round_trips() {
    let lat = HostTensor::image(6, 4, 3, (0..72).map(|i| i as f32).collect()).unwrap();
    assert_eq!(unpack(&pack(&lat), 6, 4, 3), lat);
}

fn text_encoder() -> (Qwen3TextModel, Runner) {
    let dir = fixture_path(FIX);
    let store = TensorStore::open(&dir.join("text_encoder/model.safetensors")).unwrap();
    let heads = qwen3_heads(&store);
    assert_eq!(heads, Some(2), "heads from config.json's text_config");
    let source = Qwen3Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let config =
        Qwen3Config::detect_with_heads(&loader.root(""), Some(1e6), Some(1e-6), heads).unwrap();
    assert!(!config.qk_norm && config.qkv_bias);
    assert_eq!(
        (config.head_dim, config.kv_heads, config.layers),
        (12, 1, 2)
    );
    let model = Qwen3TextModel::new(&loader.root(""), config).unwrap();
    let backend = cpu();
    let weights = loader.finish(&backend, "qwen2.5-vl").unwrap();
    (
        model,
        Runner::new("qwen2.5-vl", backend, Some(weights), RunOptions::default()),
    )
}

fn dropped(states: HostTensor) -> HostTensor {
    let [w, n, ..] = states.ne;
    HostTensor {
        ne: [w, n - DROP_TOKENS, 1, 1],
        data: states.data[DROP_TOKENS * w..].to_vec(),
    }
}

#[test]
fn text_states_match_qwen2_5_vl() {
    let dir = fixture_path(FIX);
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let tok = load_qwen_tokenizer(&dir.join("tokenizer/tokenizer.json")).unwrap();
    let (model, runner) = text_encoder();
    for (case, text) in [("prompt", PROMPT), ("negative", "blurry"), ("empty", "")] {
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
        let got = dropped(qwen3::encode_normed(&runner, &model, &ids).unwrap());
        assert_close(case, &got, &tensor(&r, &format!("{case}_states")), 1e-4);
    }
    let (ids, weights) = weighted_template_ids(
        &tok,
        PROMPT_PREFIX,
        "A lovely (cat:1.5), holding a sign.",
        PROMPT_SUFFIX,
    )
    .unwrap();
    let want: Vec<i32> = tensor(&r, "weighted_ids")
        .data
        .iter()
        .map(|&v| v as i32)
        .collect();
    assert_eq!(ids, want, "piecewise token ids");
    let mut states = qwen3::encode_normed(&runner, &model, &ids).unwrap();
    apply_token_weights(&mut states.data, states.ne[0], &weights);
    assert_close(
        "weighted",
        &dropped(states),
        &tensor(&r, "weighted_states"),
        1e-4,
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(model: &Path, extra: &[&str], out: &Path) -> std::process::Output {
    let dir = fixture_path(FIX);
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", s(model)])
        .args(["--llm", s(&dir.join("text_encoder/model.safetensors"))])
        .args([
            "--vae",
            s(&fixture_path("wan_vae").join("a/diffusion_pytorch_model.safetensors")),
        ])
        .args(["-p", PROMPT, "--steps", "4"])
        .args([
            "-W", "64", "-H", "32", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap()
}

fn run_image(model: &Path, extra: &[&str], out: &Path) -> sd_cli::image_io::Image {
    let o = run(model, extra, out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_png(out).unwrap()
}

#[test]
fn runs_match_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path(FIX);
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let folder = dir.join("transformer/diffusion_pytorch_model.safetensors");
    let single = dir.join("qwen_image.safetensors");
    let cases: [(&str, &Path, &[&str]); 3] = [
        ("image_nocfg", &folder, &["--cfg-scale", "1"]),
        ("image_cfg", &single, &["-n", "blurry", "--cfg-scale", "4"]),
        ("image_cfg", &folder, &["-n", "blurry", "--cfg-scale", "4"]),
    ];
    for (i, (name, model, extra)) in cases.into_iter().enumerate() {
        let img = run_image(model, extra, &tmp.path().join(format!("{i}.png")));
        let p = psnr(&img.data, &image_bytes(&tensor(&r, name)));
        eprintln!("Qwen Image {name} ({}): PSNR {p:.1} dB", model.display());
        assert!(p >= device::psnr_floor(60.0), "{name}: PSNR {p:.1} dB");
    }
}

/// img2img (`--init-img`, `--strength 0.6`) against the diffusers transformer and VAE in
/// sd-cli's loop: the init latent noised to the first sigma of the schedule's last 3 steps.
#[test]
fn img2img_matches_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path(FIX);
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let model = dir.join("transformer/diffusion_pytorch_model.safetensors");
    let init = dir.join("init.png");
    let extra = [
        "-n",
        "blurry",
        "--cfg-scale",
        "4",
        "--init-img",
        s(&init),
        "--strength",
        "0.6",
    ];
    let img = run_image(&model, &extra, &tmp.path().join("i2i.png"));
    let p = psnr(&img.data, &image_bytes(&tensor(&r, "image_img2img")));
    eprintln!("Qwen Image img2img: PSNR {p:.1} dB");
    assert!(p >= 60.0, "img2img: PSNR {p:.1} dB");
    // Strength changes the picture (the init image is not the text-to-image result).
    let t2i = psnr(&img.data, &image_bytes(&tensor(&r, "image_cfg")));
    assert!(t2i < 40.0, "img2img equals text-to-image ({t2i:.1} dB)");
}

/// `-M convert` to a q8_0 GGUF runs (≥ 35 dB against the f32 reference); a budget forcing the
/// transformer into several segments gives the monolithic picture exactly.
#[test]
fn q8_0_gguf_and_segmented_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path(FIX);
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let want = image_bytes(&tensor(&r, "image_nocfg"));
    let gguf = tmp.path().join("qwen_image-q8_0.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args([
            "-M",
            "convert",
            "-m",
            s(&dir.join("qwen_image.safetensors")),
        ])
        .args(["-o", s(&gguf), "--type", "q8_0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q8 = run_image(&gguf, &["--cfg-scale", "1"], &tmp.path().join("q8.png"));
    let p = psnr(&q8.data, &want);
    eprintln!("Qwen Image q8_0 GGUF: PSNR {p:.1} dB");
    assert!(p >= 35.0, "q8_0: PSNR {p:.1} dB");

    let model = dir.join("qwen_image.safetensors");
    let whole = run_image(&model, &["--cfg-scale", "1"], &tmp.path().join("whole.png"));
    let seg_out = tmp.path().join("seg.png");
    let o = run(
        &model,
        &[
            "--cfg-scale",
            "1",
            "--offload-to-cpu",
            "--max-vram",
            "0.002",
            "-v",
        ],
        &seg_out,
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("qwen_image segment 2/"),
        "the transformer runs in segments: {err}"
    );
    let seg = read_png(&seg_out).unwrap();
    assert_eq!(seg.data, whole.data, "segmented == whole");
}

/// The text encoder's hidden size must match the transformer's text input: a clear error, not
/// a crash.
#[test]
fn mismatched_text_encoder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path(FIX);
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", s(&dir.join("qwen_image.safetensors"))])
        .args([
            "--llm",
            s(&fixture_path("qwen3_te").join("qwen3_plain.safetensors")),
        ])
        .args([
            "--vae",
            s(&fixture_path("wan_vae").join("a/diffusion_pytorch_model.safetensors")),
        ])
        .args(["-p", PROMPT, "--steps", "1", "-W", "32", "-H", "32"])
        .args(["-o", s(&tmp.path().join("x.png"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("hidden size") || err.contains("q_proj"),
        "{err}"
    );
}

/// A diffusers/PEFT LoRA (`transformer.<module>.lora_A/B`) on the single file's names (the
/// ComfyUI prefix stripped) and on the diffusers folder.
#[test]
fn peft_lora_lands_on_both_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path(FIX);
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let loras = dir.join("loras");
    for (i, model) in [
        dir.join("qwen_image.safetensors"),
        dir.join("transformer/diffusion_pytorch_model.safetensors"),
    ]
    .iter()
    .enumerate()
    {
        let out = tmp.path().join(format!("lora{i}.png"));
        let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args(["--diffusion-model", s(model)])
            .args(["--llm", s(&dir.join("text_encoder/model.safetensors"))])
            .args([
                "--vae",
                s(&fixture_path("wan_vae").join("a/diffusion_pytorch_model.safetensors")),
            ])
            .args(["-p", &format!("{PROMPT}<lora:qwen_image_peft:1>")])
            .args(["--steps", "4", "-W", "64", "-H", "32", "-s", "42"])
            .args(["--rng", "cpu", "-t", "2", "--cfg-scale", "1"])
            .args(["--lora-model-dir", s(&loras), "-o", s(&out)])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let img = read_png(&out).unwrap();
        let p = psnr(&img.data, &image_bytes(&tensor(&r, "lora_image")));
        eprintln!("Qwen Image LoRA ({}): PSNR {p:.1} dB", model.display());
        assert!(p >= 60.0, "LoRA: PSNR {p:.1} dB");
    }
}

/// The diffusers folder as `-m` (model_index.json, transformer/, text_encoder/, tokenizer/,
/// vae/), as the Hugging Face repository ships it.
#[test]
fn diffusers_folder_runs_as_one_model() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("Qwen-Image");
    let dir = fixture_path(FIX);
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
    copy(&fixture_path("wan_vae").join("a"), "vae");
    std::fs::write(
        root.join("model_index.json"),
        r#"{"_class_name": "QwenImagePipeline",
            "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
            "tokenizer": ["transformers", "Qwen2Tokenizer"],
            "transformer": ["diffusers", "QwenImageTransformer2DModel"],
            "vae": ["diffusers", "AutoencoderKLQwenImage"]}"#,
    )
    .unwrap();
    let out = tmp.path().join("folder.png");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-m", s(&root)])
        .args(["-p", PROMPT, "--steps", "4"])
        .args([
            "-W", "64", "-H", "32", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["--cfg-scale", "1", "-o", s(&out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let p = psnr(
        &read_png(&out).unwrap().data,
        &image_bytes(&tensor(&r, "image_nocfg")),
    );
    eprintln!("Qwen Image diffusers folder: PSNR {p:.1} dB");
    assert!(p >= 60.0, "folder: PSNR {p:.1} dB");
}

/// Editing as upstream sd-cli runs it (Edit Plus template, vision embeddings at sequential
/// positions, the reference's latent tokens after the target's): CFG with a negative prompt,
/// and Edit 2511's `qwen_image_zero_cond_t`, against diffusers' components in sd-cli's loop.
#[test]
fn edits_match_diffusers_components_under_sd_cli_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path(FIX);
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let single = dir.join("qwen_image.safetensors");
    let reference = dir.join("ref.png");
    let cases: [(&str, &[&str]); 2] = [
        ("edit_cfg", &["-n", "blurry", "--cfg-scale", "4"]),
        (
            "edit_zero_cond",
            &[
                "--cfg-scale",
                "1",
                "--model-args",
                "qwen_image_zero_cond_t=true",
            ],
        ),
    ];
    for (i, (name, extra)) in cases.into_iter().enumerate() {
        let mut args = vec!["-r", s(&reference)];
        args.extend_from_slice(extra);
        let img = run_image(&single, &args, &tmp.path().join(format!("e{i}.png")));
        let p = psnr(&img.data, &image_bytes(&tensor(&r, name)));
        eprintln!("Qwen Image {name}: PSNR {p:.1} dB");
        assert!(p >= device::psnr_floor(60.0), "{name}: PSNR {p:.1} dB");
    }
}
