//! SD3 / SD3.5 against diffusers on tiny random-weight models (tests/reference/sd3_fixtures.py):
//! one MMDiT call of an SD3 model (Stability single-file names) and an SD3.5-medium-like model
//! (diffusers folder: q/k RMS norms, a dual-attention block), the three-encoder conditioning,
//! and whole `sd-cli` runs against `StableDiffusion3Pipeline` with CFG under sd-cli's rules.
//!
//! Tolerances: MMDiT 1e-4 × max(1, max |reference|); context 1e-4, pooled 1e-5 (× scale);
//! images ≥ 60 dB PSNR (8-bit PNG).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::models::dit::sd3::{unpatchify, Sd3, Sd3Config, Sd3Layout};
use sd_cli::runner::{RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::weights::TensorStore;

const PROMPT: &str = "A lovely cat, holding a sign.";

fn dir() -> PathBuf {
    fixture_path("sd3")
}

fn refs() -> TensorStore {
    open_fixture("sd3/reference.safetensors")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn model(path: &Path, prefix: &str, head_dim: Option<usize>) -> (Sd3, Runner) {
    let backend = cpu();
    let store = TensorStore::open(path).unwrap();
    let source = StoreSource::new(&store, prefix);
    let loader = WeightLoader::new(&source, None);
    let mut config = Sd3Config::detect(&loader.root("")).unwrap();
    if let Some(h) = head_dim {
        config = config.with_head_dim(h).unwrap();
    }
    let m = Sd3::new(&loader.root(""), config).unwrap();
    let weights = loader.finish(&backend, "sd3").unwrap();
    (
        m,
        Runner::new("sd3", backend, Some(weights), RunOptions::default()),
    )
}

fn check_call(name: &str, m: &Sd3, runner: &Runner) {
    let r = refs();
    let x = tensor(&r, &format!("{name}_call_x"));
    let ctx = tensor(&r, &format!("{name}_call_ctx"));
    let pooled = tensor(&r, &format!("{name}_call_pooled"));
    let c = m.config();
    let mut out = runner
        .compute(|g| {
            let lat = g.input_f32("x", x.ne, x.data.clone());
            let context = g.input_f32("ctx", [c.context_dim, ctx.ne[1], 1, 1], ctx.data.clone());
            let p = g.input_f32("pooled", [c.pooled_dim, 1, 1, 1], pooled.data.clone());
            vec![m.forward(g, lat, context, p, &[0.7], &[]).unwrap()]
        })
        .unwrap();
    let tokens = out.pop().unwrap();
    let got = unpatchify(&tokens.data, x.ne[0], x.ne[1], x.ne[2], c.patch_size);
    assert_close(name, &got, &tensor(&r, &format!("{name}_call_out")), 1e-4);
}

#[test]
fn mmdit_matches_diffusers_in_both_layouts() {
    let (m, runner) = model(
        &dir().join("sd3.safetensors"),
        "model.diffusion_model.",
        None,
    );
    assert_eq!(m.config().layout, Sd3Layout::Sai);
    assert!(!m.config().qk_norm && m.config().dual_blocks == 0);
    check_call("sd3", &m, &runner);
    let (m, runner) = model(
        &dir().join("sd35/transformer/diffusion_pytorch_model.safetensors"),
        "",
        Some(16),
    );
    assert_eq!(m.config().layout, Sd3Layout::Diffusers);
    assert!(m.config().qk_norm && m.config().dual_blocks == 1);
    check_call("sd35", &m, &runner);
    // The same model in Stability's names (x_block.attn2 / ln_q / ln_k), as
    // sd3.5_medium.safetensors ships.
    let (m, runner) = model(
        &dir().join("sd35.safetensors"),
        "model.diffusion_model.",
        Some(16),
    );
    assert_eq!(m.config().layout, Sd3Layout::Sai);
    assert!(m.config().qk_norm && m.config().dual_blocks == 1);
    check_call("sd35", &m, &runner);
}

fn run(model: &Path, out: &Path) -> sd_cli::image_io::Image {
    run_with(model, &[], out)
}

fn run_with(model: &Path, extra: &[&str], out: &Path) -> sd_cli::image_io::Image {
    let sdp = fixture_path("sd_pipeline");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", s(model)])
        .args([
            "--clip_l",
            s(&sdp.join("sd1/text_encoder/model.safetensors")),
        ])
        .args([
            "--clip_g",
            s(&sdp.join("sdxl/text_encoder_2/model.safetensors")),
        ])
        .args([
            "--t5xxl",
            s(&fixture_path("pixart_pipeline").join("text_encoder/model.safetensors")),
        ])
        .args([
            "--t5xxl-tokenizer",
            s(&PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../shared/tokenizers/t5-v1_1.tokenizer.json")),
        ])
        .args(["--vae", s(&fixture_path("flux").join("vae"))])
        .args([
            "-p",
            PROMPT,
            "-n",
            "blurry",
            "--cfg-scale",
            "4.5",
            "--steps",
            "4",
        ])
        .args([
            "-W", "24", "-H", "16", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_png(out).unwrap()
}

#[test]
fn sd3_and_sd35_runs_match_the_diffusers_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, path) in [
        ("sd3", dir().join("sd3.safetensors")),
        ("sd35", dir().join("sd35/transformer")),
    ] {
        let img = run(&path, &tmp.path().join(format!("{name}.png")));
        let want = tensor(&refs(), &format!("{name}_image"));
        let p = psnr(&img.data, &image_bytes(&want));
        eprintln!("{name}: PSNR {p:.1} dB vs StableDiffusion3Pipeline");
        assert!(p >= device::psnr_floor(60.0), "{name}: PSNR {p:.1} dB");
    }
}

/// TAESD3 (`--taesd`, a 16-channel tiny autoencoder) decodes instead of the VAE.
#[test]
fn taesd3_decodes_instead_of_the_vae() {
    let tmp = tempfile::tempdir().unwrap();
    let tae = fixture_path("flux").join("taef1");
    let img = run_with(
        &dir().join("sd3.safetensors"),
        &["--taesd", s(&tae)],
        &tmp.path().join("tae.png"),
    );
    let p = psnr(&img.data, &image_bytes(&tensor(&refs(), "taesd3_image")));
    eprintln!("TAESD3: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(60.0), "TAESD3: PSNR {p:.1} dB");
}

/// Skip-layer guidance (`--slg-scale 2.5 --skip-layers [1] --skip-layer-start 0.2
/// --skip-layer-end 0.9`: steps 2 and 3 of 4) against the reference loop.
#[test]
fn skip_layer_guidance_matches_the_reference_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let slg = [
        "--slg-scale",
        "2.5",
        "--skip-layers",
        "[1]",
        "--skip-layer-start",
        "0.2",
        "--skip-layer-end",
        "0.9",
    ];
    let img = run_with(
        &dir().join("sd35/transformer"),
        &slg,
        &tmp.path().join("slg.png"),
    );
    let p = psnr(&img.data, &image_bytes(&tensor(&refs(), "slg_image")));
    eprintln!("SLG: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(60.0), "SLG: PSNR {p:.1} dB");
    let plain = run(
        &dir().join("sd35/transformer"),
        &tmp.path().join("plain.png"),
    );
    assert!(psnr(&img.data, &plain.data) < 50.0, "SLG changed nothing");
}

/// `--flow-shift 2` replaces SD3's shift 3 in the `discrete` schedule.
#[test]
fn flow_shift_overrides_the_default_shift() {
    let tmp = tempfile::tempdir().unwrap();
    let img = run_with(
        &dir().join("sd3.safetensors"),
        &["--flow-shift", "2"],
        &tmp.path().join("shift.png"),
    );
    let p = psnr(
        &img.data,
        &image_bytes(&tensor(&refs(), "sd3_shift2_image")),
    );
    eprintln!("--flow-shift 2: PSNR {p:.1} dB");
    assert!(
        p >= device::psnr_floor(60.0),
        "--flow-shift 2: PSNR {p:.1} dB"
    );
}

/// A diffusers/PEFT LoRA (split q/k/v, a feed-forward, the patch convolution) on the
/// Stability single file, whose fused `qkv` takes it on row thirds.
#[test]
fn peft_lora_lands_on_the_fused_single_file() {
    let tmp = tempfile::tempdir().unwrap();
    let loras = dir().join("loras");
    let prompt = format!("{PROMPT}<lora:sd3_peft:1>");
    let img = run_with(
        &dir().join("sd3.safetensors"),
        &["--lora-model-dir", s(&loras), "-p", &prompt],
        &tmp.path().join("lora.png"),
    );
    let p = psnr(&img.data, &image_bytes(&tensor(&refs(), "lora_image")));
    eprintln!("SD3 LoRA: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(60.0), "SD3 LoRA: PSNR {p:.1} dB");
}

/// `-M convert` to q8_0 GGUF runs (≥ 35 dB); a budget forcing several segments gives the
/// monolithic picture exactly.
#[test]
fn q8_0_gguf_and_segmented_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("sd3-q8_0.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "convert", "-m", s(&dir().join("sd3.safetensors"))])
        .args(["-o", s(&gguf), "--type", "q8_0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q8 = run(&gguf, &tmp.path().join("q8.png"));
    let want = image_bytes(&tensor(&refs(), "sd3_image"));
    let p = psnr(&q8.data, &want);
    eprintln!("SD3 q8_0 GGUF: PSNR {p:.1} dB");
    assert!(p >= 35.0, "q8_0: PSNR {p:.1} dB");

    // An f16 file keeps its position grid in f16 (the crop is widened in the graph).
    let f16 = tmp.path().join("sd3-f16.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "convert", "-m", s(&dir().join("sd3.safetensors"))])
        .args(["-o", s(&f16), "--type", "f16"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = psnr(&run(&f16, &tmp.path().join("f16.png")).data, &want);
    eprintln!("SD3 f16 GGUF: PSNR {p:.1} dB");
    assert!(p >= 45.0, "f16: PSNR {p:.1} dB");

    // Text encoders left out (zeros stand in): their token tables alone exceed a budget that
    // splits this tiny MMDiT.
    let model = dir().join("sd3.safetensors");
    let bare = |extra: &[&str], out: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args([
                "--diffusion-model",
                s(&model),
                "--vae",
                s(&fixture_path("flux").join("vae")),
            ])
            .args(["-p", PROMPT, "--cfg-scale", "4.5", "--steps", "4"])
            .args([
                "-W", "24", "-H", "16", "-s", "42", "--rng", "cpu", "-t", "2",
            ])
            .args(extra)
            .args(["-o", s(out)])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        (read_png(out).unwrap(), err)
    };
    let (whole, _) = bare(&[], &tmp.path().join("whole.png"));
    let (seg, err) = bare(
        &["--offload-to-cpu", "--max-vram", "0.0012", "-v"],
        &tmp.path().join("seg.png"),
    );
    assert!(err.contains("segment 2/"), "the run is segmented: {err}");
    assert_eq!(seg.data, whole.data, "segmented == whole");
}
