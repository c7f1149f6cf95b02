//! LoRA from the prompt (`<lora:NAME:W>`) against diffusers' `load_lora_weights` /
//! `set_adapters` (PEFT) on the tiny SD1, SDXL and PixArt pipelines (tests/reference/
//! lora_fixtures.py): kohya and PEFT files, LDM-named modules on a diffusers folder and
//! diffusers-named modules on an LDM single file, two LoRAs at different weights, a negative
//! weight, LyCORIS LoHa/LoKr and full differences, text-encoder LoRAs, a diffusers-named LoRA
//! on an original-layout PixArt (row slices of its fused qkv), merged (`immediately`) and at
//! run time, f32 and q8_0; and the errors for LoRAs that do not fit.
//!
//! Tolerances: ≥ 60 dB PSNR against diffusers' 8-bit picture in f32 (seen: ∞, i.e. identical
//! bytes, except LyCORIS 78.7 dB), merged vs at run time ≥ 60 dB; q8_0 at run time vs the f32
//! reference: printed, must stay ≥ 30 dB (seen 46.9 dB).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use sd_cli::image_io::read_png;

const PROMPT: &str = "A lovely cat, holding a sign.";
const NEGATIVE: &str = "blurry, low quality";

fn lora_dir() -> PathBuf {
    fixture_path("lora")
}

fn sd_dir() -> PathBuf {
    fixture_path("sd_pipeline")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The reference picture `name` as interleaved bytes.
fn reference(name: &str) -> Vec<u8> {
    image_bytes(&tensor(&open_fixture("lora/reference.safetensors"), name))
}

/// The seed, sampler, steps and thread flags every run here shares, with `size` and `cfg`.
fn sd_cli(size: (&str, &str), cfg: &str, args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(args)
        .args([
            "--steps",
            "4",
            "--cfg-scale",
            cfg,
            "-W",
            size.0,
            "-H",
            size.1,
        ])
        .args(["-s", "42", "--rng", "cpu", "-t", "2"])
        .args(["--lora-model-dir", s(&lora_dir()), "-o", s(out)])
        .output()
        .unwrap()
}

/// Runs the SD fixtures' generation (tests/sd_pipeline.rs) with `prompt`.
fn sd_run(model: &[&str], prompt: &str, extra: &[&str], out: &Path) -> Output {
    let mut args = model.to_vec();
    args.extend(["-p", prompt, "-n", NEGATIVE]);
    args.extend(["--sampling-method", "euler", "--scheduler", "discrete"]);
    args.extend(extra);
    sd_cli(("24", "16"), "5", &args, out)
}

fn image(o: &Output, out: &Path, what: &str) -> Vec<u8> {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    read_png(out).unwrap().data
}

fn check(got: &[u8], want: &[u8], what: &str, floor: f64) -> f64 {
    let p = psnr(got, want);
    eprintln!("{what}: PSNR {p:.1} dB");
    let floor = common::device::psnr_floor(floor);
    assert!(p >= floor, "{what}: PSNR {p:.1} dB < {floor}");
    p
}

fn sd1_folder() -> PathBuf {
    sd_dir().join("sd1")
}

#[test]
fn sd1_kohya_lora_matches_diffusers_on_folder_and_single_file() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = sd1_folder();
    // The LDM single file: the kohya (diffusers block names) LoRA finds its LDM weights.
    let single = assemble_checkpoint(&sd_dir(), "sd1.single", tmp.path());
    // The same LoRA as a GGUF, named by its absolute path (outside --lora-model-dir).
    let gguf = tmp.path().join("kohya_gguf.gguf");
    let kohya = lora_dir().join("sd1_kohya.safetensors");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args([
            "-M",
            "convert",
            "-m",
            s(&kohya),
            "--type",
            "f16",
            "-o",
            s(&gguf),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cases = [
        ("diffusers folder", &folder, "sd1_kohya:0.8", "sd1_kohya"),
        ("LDM single file", &single, "sd1_kohya:0.8", "sd1_kohya"),
        (
            "LDM-named modules",
            &folder,
            "sd1_kohya_ldm:0.8",
            "sd1_kohya",
        ),
        // Found by its `.pt` extension.
        (
            "PyTorch checkpoint",
            &folder,
            "sd1_kohya_pt:0.8",
            "sd1_kohya",
        ),
        ("GGUF", &folder, &format!("{}:0.8", s(&gguf)), "sd1_kohya"),
        ("weight -0.5", &folder, "sd1_kohya:-0.5", "sd1_kohya_neg"),
    ];
    for (i, (what, model, tag, want)) in cases.iter().enumerate() {
        let prompt = format!("{PROMPT}<lora:{tag}>");
        let out = tmp.path().join(format!("{i}.png"));
        let o = sd_run(&["-m", s(model)], &prompt, &[], &out);
        check(
            &image(&o, &out, what),
            &reference(want),
            &format!("sd1 kohya, {what}"),
            60.0,
        );
    }
}

/// The SD1 folder with `prompt` merged and at run time, each checked against `want` (≥ 60
/// dB); returns both pictures.
fn both_modes(dir: &Path, prompt: &str, want: &[u8], what: &str) -> Vec<Vec<u8>> {
    ["immediately", "at_runtime"]
        .iter()
        .map(|mode| {
            let out = dir.join(format!("{mode}.png"));
            let extra = ["--lora-apply-mode", mode];
            let o = sd_run(&["-m", s(&sd1_folder())], prompt, &extra, &out);
            let img = image(&o, &out, mode);
            check(&img, want, &format!("{what} {mode}"), 60.0);
            img
        })
        .collect()
}

#[test]
fn two_loras_merged_and_at_runtime_match_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let want = reference("sd1_two");
    // The kohya file named twice: its weights add up (0.5 + 0.3).
    let prompt = format!("<lora:sd1_kohya:0.5>{PROMPT}<lora:sd1_peft:0.6><lora:sd1_kohya:0.3>");
    let got = both_modes(tmp.path(), &prompt, &want, "sd1 kohya+peft");
    check(&got[0], &got[1], "merged vs at run time", 60.0);

    // At run time with the weights (and factors) offloaded and run segment by segment. Without
    // our AVX-512 kernels ggml's f16 matmul needs a larger work buffer per segment.
    let budget = if sd_cli::cpu_info::kernel_may_use("avx512f") {
        "0.0012"
    } else {
        "0.0028"
    };
    let out = tmp.path().join("segments.png");
    let o = sd_run(
        &["-m", s(&sd1_folder())],
        &prompt,
        &[
            "--lora-apply-mode",
            "at_runtime",
            "--offload-to-cpu",
            "--max-vram",
            budget,
            "-v",
        ],
        &out,
    );
    let img = image(&o, &out, "segments");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("segment 2/"),
        "the run is segmented"
    );
    check(
        &img,
        &got[1],
        "at run time, offloaded and segmented vs whole",
        60.0,
    );

    // q8_0 weights: `auto` applies the LoRAs at run time.
    let out = tmp.path().join("q8.png");
    let o = sd_run(
        &["-m", s(&sd1_folder())],
        &prompt,
        &["--type", "q8_0", "-v"],
        &out,
    );
    let img = image(&o, &out, "q8_0");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("at run time"),
        "auto with q8_0 weights applies at run time"
    );
    check(
        &img,
        &want,
        "sd1 kohya+peft, q8_0 at run time vs f32 diffusers",
        30.0,
    );
}

#[test]
fn lycoris_loha_lokr_and_full_differences() {
    let tmp = tempfile::tempdir().unwrap();
    let want = reference("sd1_lycoris");
    let prompt = format!("{PROMPT}<lora:sd1_lycoris:0.7>");
    both_modes(tmp.path(), &prompt, &want, "LoHa/LoKr/diff");
}

/// PEFT DoRA: the magnitudes need the weight, so at run time they are merged too.
#[test]
fn dora_magnitudes_match_peft() {
    let tmp = tempfile::tempdir().unwrap();
    let want = reference("sd1_dora");
    let base = tensor(
        &open_fixture("sd_pipeline/sd1/reference.safetensors"),
        "image",
    );
    let dora = tensor(&open_fixture("lora/reference.safetensors"), "sd1_dora");
    assert!(
        max_abs_diff(&dora, &base) > 0.05,
        "the DoRA changes the picture"
    );
    let prompt = format!("{PROMPT}<lora:sd1_dora:0.8>");
    both_modes(tmp.path(), &prompt, &want, "DoRA");
}

#[test]
fn sdxl_kohya_with_both_text_encoders() {
    let tmp = tempfile::tempdir().unwrap();
    let want = reference("sdxl_kohya");
    let prompt = format!("{PROMPT}<lora:sdxl_kohya:1>");
    let out = tmp.path().join("folder.png");
    let o = sd_run(&["-m", s(&sd_dir().join("sdxl"))], &prompt, &[], &out);
    check(
        &image(&o, &out, "sdxl folder"),
        &want,
        "sdxl kohya, folder",
        60.0,
    );
    let single = assemble_checkpoint(&sd_dir(), "sdxl.single", tmp.path());
    let out = tmp.path().join("single.png");
    let o = sd_run(
        &["-m", s(&single)],
        &prompt,
        &["--lora-apply-mode", "at_runtime"],
        &out,
    );
    check(
        &image(&o, &out, "sdxl single"),
        &want,
        "sdxl kohya, single file (OpenCLIP bigG), at run time",
        60.0,
    );
}

fn pixart_run(transformer: &Path, extra: &[&str], out: &Path) -> Output {
    let d = fixture_path("pixart_pipeline");
    let tokenizer = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/tokenizers/t5-v1_1.tokenizer.json");
    let (t5, vae) = (d.join("text_encoder"), d.join("vae"));
    let mut args = vec!["--diffusion-model", s(transformer), "--t5xxl", s(&t5)];
    args.extend(["--vae", s(&vae), "--t5xxl-tokenizer", s(&tokenizer)]);
    args.extend([
        "-p",
        "A Lovely cat, holding a sign!  <lora:pixart_peft:0.9>",
        "-n",
        "blurry",
    ]);
    args.extend(["--sampling-method", "euler", "--scheduler", "discrete"]);
    args.extend(extra);
    sd_cli(("24", "16"), "4.5", &args, out)
}

#[test]
fn pixart_peft_lora_on_both_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let want = reference("pixart_peft");
    let diffusers = fixture_path("pixart_pipeline/transformer");
    // The original-layout file as a folder's weights file, so that the config.json beside it
    // gives the tiny model's head size (released PixArt files need none: 72).
    let original_dir = tmp.path().join("original");
    std::fs::create_dir(&original_dir).unwrap();
    std::fs::copy(
        diffusers.join("config.json"),
        original_dir.join("config.json"),
    )
    .unwrap();
    let original = original_dir.join("diffusion_pytorch_model.safetensors");
    std::fs::copy(lora_dir().join("pixart_original.safetensors"), &original).unwrap();
    let mut got = Vec::new();
    for (what, t, mode) in [
        ("diffusers layout", &diffusers, "immediately"),
        ("original layout (fused qkv)", &original, "immediately"),
        ("original layout, at run time", &original, "at_runtime"),
    ] {
        let out = tmp.path().join(format!("{}.png", got.len()));
        let o = pixart_run(t, &["--lora-apply-mode", mode], &out);
        let img = image(&o, &out, what);
        check(&img, &want, &format!("PixArt PEFT LoRA, {what}"), 60.0);
        got.push(img);
    }
    check(&got[0], &got[1], "PixArt layouts agree", 60.0);
    check(&got[1], &got[2], "PixArt merged vs at run time", 60.0);
}

fn qwen_run(transformer: &Path, extra: &[&str], out: &Path) -> Output {
    let d = fixture_path("qwen_image_pipeline");
    let (vae, llm) = (d.join("vae.safetensors"), d.join("llm.safetensors"));
    let mut args = vec!["--diffusion-model", s(transformer), "--vae", s(&vae)];
    args.extend(["--llm", s(&llm), "-n", "blurry, low quality"]);
    args.extend([
        "-p",
        "a lovely cat holding a sign says 'qwen2.1.cpp'<lora:qwen_peft:0.7>",
    ]);
    args.extend(extra);
    sd_cli(("96", "64"), "4", &args, out)
}

/// ComfyUI-prefixed (`diffusion_model.`) PEFT names on Qwen Image 2.1, on the diffusers layout
/// and on a single file whose `img_mlp.gate_up` fuses the two LoRA'd projections; at run time
/// the prefix K/V cache holds the adapted keys and values.
#[test]
fn qwen_image_2_1_lora_on_split_and_fused_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let want = reference("qwen_peft");
    let split = fixture_path("qwen_image_pipeline/diffusion_model.safetensors");
    let fused = lora_dir().join("qwen_fused.safetensors");
    let mut got = Vec::new();
    for (what, t, mode) in [
        ("diffusers layout", &split, "immediately"),
        ("fused gate_up", &fused, "immediately"),
        ("fused gate_up, at run time", &fused, "at_runtime"),
    ] {
        let out = tmp.path().join(format!("{}.png", got.len()));
        let o = qwen_run(t, &["--lora-apply-mode", mode], &out);
        let img = image(&o, &out, what);
        check(&img, &want, &format!("Qwen Image 2.1 LoRA, {what}"), 60.0);
        got.push(img);
    }
    check(
        &got[1],
        &got[2],
        "Qwen Image 2.1 merged vs at run time",
        60.0,
    );
}

fn stderr_of(o: &Output) -> String {
    assert!(!o.status.success(), "the run should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A safetensors file of f32 tensors.
fn write_lora(path: &Path, tensors: &[(&str, Vec<u64>)]) {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, shape)| vec![0u8; 4 * shape.iter().product::<u64>() as usize])
        .collect();
    let items: Vec<_> = tensors
        .iter()
        .zip(&data)
        .map(
            |((name, shape), d)| sd_cli::weights::safetensors::SafetensorsItem {
                name,
                dtype: "F32",
                shape,
                data: d,
            },
        )
        .collect();
    sd_cli::weights::safetensors::write_safetensors(path, &Default::default(), &items).unwrap();
}

#[test]
fn loras_that_do_not_fit_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.png");
    let folder = sd1_folder();
    let model = ["-m", s(&folder)];

    // A LoRA for another family.
    let e = stderr_of(&sd_run(&model, "<lora:pixart_peft:1>", &[], &out));
    assert!(
        e.contains("pixart_peft") && e.contains("another model family"),
        "{e}"
    );

    // A missing file.
    let e = stderr_of(&sd_run(&model, "<lora:no_such_lora:1>", &[], &out));
    assert!(e.contains("no_such_lora"), "{e}");

    // A truncated file.
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(lora_dir().join("sd1_kohya.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("cut.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let run_in = |prompt: &str| {
        Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args(model)
            .args(["-p", prompt, "--steps", "1", "-W", "24", "-H", "16"])
            .args(["--lora-model-dir", s(dir.path()), "-o", s(&out)])
            .output()
            .unwrap()
    };
    let e = stderr_of(&run_in("<lora:cut:1>"));
    assert!(e.contains("cut.safetensors"), "{e}");

    // Shapes that do not fit a weight it names: rank-2 matrices of the wrong width.
    let key = "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q";
    write_lora(
        &dir.path().join("wide.safetensors"),
        &[
            (&format!("{key}.lora_down.weight"), vec![2, 33]),
            (&format!("{key}.lora_up.weight"), vec![32, 2]),
        ],
    );
    let e = stderr_of(&run_in("<lora:wide:1>"));
    assert!(
        e.contains("wide.safetensors") && e.contains(key) && e.contains("lora_down"),
        "{e}"
    );

    // No adapter tensor at all.
    write_lora(
        &dir.path().join("plain.safetensors"),
        &[("w.weight", vec![2, 2])],
    );
    let e = stderr_of(&run_in("<lora:plain:1>"));
    assert!(e.contains("no LoRA tensors"), "{e}");

    // A high-noise tag without a high-noise expert changes nothing (upstream): a warning.
    let o = sd_run(&model, "<lora:|high_noise|sd1_kohya:1>", &[], &out);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("high-noise") && e.contains("ignored"), "{e}");
}

#[test]
fn metadata_records_the_loras_and_tags_stay_in_negative_prompts() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("meta.png");
    let prompt = format!("{PROMPT}<lora:sd1_kohya:0.8>");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-m", s(&sd1_folder()), "-p", &prompt])
        .args(["-n", "<lora:sd1_peft:1> blurry"])
        .args(["--steps", "1", "-W", "24", "-H", "16"])
        .args(["--lora-model-dir", s(&lora_dir()), "-o", s(&out)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("negative prompt"),
        "warns about the tag in -n: {err}"
    );
    let text = sd_cli::image_io::read_png_text_pairs(&out).unwrap();
    let params = &text.iter().find(|(k, _)| k == "parameters").unwrap().1;
    assert!(params.starts_with(&prompt), "{params}");
    let hash = params
        .split("Lora hashes: \"sd1_kohya: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no Lora hashes in {params}"));
    assert!(
        hash[..12].chars().all(|c| c.is_ascii_hexdigit()),
        "{params}"
    );
    assert_eq!(&hash[12..13], "\"");
}
