//! Wan image-to-video against diffusers on tiny random-weight models
//! (tests/reference/wan_i2v_fixtures.py): `sd-cli -M vid_gen --init-img` (and `--end-img`)
//! with an I2V transformer and a CLIP vision tower, a first/last-frame (FLF2V) transformer, and
//! a transformer that reads only the concatenated condition (Wan 2.2 I2V style), each against
//! `WanImageToVideoPipeline`'s conditioning in its loop on sd-cli's sigmas; the CLIP tower's
//! tokens alone; and the errors a user meets.
//!
//! Tolerances: frames ≥ 55 dB PSNR over all frames (8-bit), CLIP tokens 1e-4 × scale.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;

const FIX: &str = "wan_i2v";
const PROMPT: &str = "A lovely cat walking on the grass.";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn fix(name: &str) -> PathBuf {
    fixture_path(FIX).join(name)
}

/// `sd-cli -M vid_gen` with the shared text encoder and VAE of the text-to-video fixtures,
/// 5 frames of 32×32, frames written as a PNG sequence in `tmp`.
fn run(transformer: &Path, extra: &[&str], tmp: &Path) -> std::process::Output {
    run_prompt(transformer, PROMPT, extra, tmp)
}

/// [`run`] with another prompt.
fn run_prompt(
    transformer: &Path,
    prompt: &str,
    extra: &[&str],
    tmp: &Path,
) -> std::process::Output {
    let t2v = fixture_path("wan");
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--diffusion-model", s(transformer)])
        .args(["--t5xxl", s(&t2v.join("text_encoder/model.safetensors"))])
        .args([
            "--t5xxl-tokenizer",
            s(&fixture_path(
                "../../../shared/tokenizers/t5-v1_1.tokenizer.json",
            )),
        ])
        .args([
            "--vae",
            s(&t2v.join("vae/diffusion_pytorch_model.safetensors")),
        ])
        .args(["-p", prompt, "--steps", "4", "--cfg-scale", "5"])
        .args(["-W", "32", "-H", "32", "--video-frames", "5"])
        .args(["-s", "42", "--rng", "cpu", "-t", "2"])
        .args(extra)
        .args(["-o", s(&tmp.join("frame_%d.png"))])
        .output()
        .unwrap()
}

/// PSNR of the written frames against reference `name` [W, H, 3, F].
fn frames_psnr(name: &str, tmp: &Path) -> f64 {
    let r = open_fixture(&format!("{FIX}/reference.safetensors"));
    let v = tensor(&r, name);
    let [w, h, c, f] = v.ne;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for i in 0..f {
        let one = sd_cli::tensor::HostTensor {
            ne: [w, h, c, 1],
            data: v.data[i * w * h * c..(i + 1) * w * h * c].to_vec(),
        };
        want.extend(image_bytes(&one));
        let img = read_png(&tmp.join(format!("frame_{i}.png"))).unwrap();
        assert_eq!((img.width as usize, img.height as usize), (w, h));
        got.extend_from_slice(&img.data);
    }
    psnr(&got, &want)
}

fn check_run(case: &str, transformer: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&fix(transformer), extra, tmp.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = frames_psnr(case, tmp.path());
    eprintln!("Wan {case}: 5 frames vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 55.0, "{case}: PSNR {p:.1} dB");
}

#[test]
fn i2v_matches_diffusers() {
    let start = fix("start.png");
    let clip = fix("image_encoder");
    let args = ["--init-img", s(&start), "--clip_vision", s(&clip)];
    check_run("i2v", "i2v", &args);
    // diffusers' own choice of layer (the penultimate) through --clip-skip 2.
    let mut penultimate = args.to_vec();
    penultimate.extend(["--clip-skip", "2"]);
    check_run("i2v_penultimate", "i2v", &penultimate);
}

#[test]
fn first_last_frame_matches_diffusers() {
    let (start, end, clip) = (fix("start.png"), fix("end.png"), fix("image_encoder"));
    check_run(
        "flf2v",
        "flf2v",
        &[
            "--init-img",
            s(&start),
            "--end-img",
            s(&end),
            "--clip_vision",
            s(&clip),
        ],
    );
}

#[test]
fn concat_only_model_needs_no_clip_vision() {
    let start = fix("start.png");
    check_run("concat_only", "concat_only", &["--init-img", s(&start)]);
}

#[test]
fn user_errors_are_clear() {
    let tmp = tempfile::tempdir().unwrap();
    let start = fix("start.png");
    // An image branch without its CLIP tower.
    let o = run(&fix("i2v"), &["--init-img", s(&start)], tmp.path());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--clip_vision"), "{err}");
    // --end-img on a text-to-video model.
    let t2v = fixture_path("wan/transformer/diffusion_pytorch_model.safetensors");
    let o = run(&t2v, &["--end-img", s(&start)], tmp.path());
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--end-img"), "{err}");
    // A CLIP tower of the wrong width: the T5 encoder's file is no CLIP tower at all.
    let o = run(
        &fix("i2v"),
        &[
            "--init-img",
            s(&start),
            "--clip_vision",
            s(&fixture_path("wan/text_encoder/model.safetensors")),
        ],
        tmp.path(),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
}

/// Wan 2.2 A14B's two experts: `--high-noise-diffusion-model` with its own CFG on the steps at
/// or above `--moe-boundary` (2 of 4 here), then the main model, against WanPipeline's
/// `transformer` / `transformer_2` switch.
#[test]
fn two_experts_match_diffusers() {
    let start = fix("start.png");
    let expert = fix("moe_high");
    check_run(
        "moe",
        "concat_only",
        &[
            "--init-img",
            s(&start),
            "--high-noise-diffusion-model",
            s(&expert),
            "--high-noise-cfg-scale",
            "3",
        ],
    );
    // The boundary matters: with the expert on every step the picture differs.
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        &fix("concat_only"),
        &[
            "--init-img",
            s(&start),
            "--high-noise-diffusion-model",
            s(&expert),
            "--high-noise-cfg-scale",
            "3",
            "--high-noise-steps",
            "4",
        ],
        tmp.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The expert's settings are in the metadata (no boundary: --high-noise-steps decides).
    let text = png_parameters(&tmp.path().join("frame_0.png"));
    let want = "High noise model: moe_high, High noise steps: 4, High noise CFG scale: 3.000000";
    assert!(text.contains(want), "{text:?}");
    assert!(
        !text.contains("MoE boundary") && !text.contains("VACE"),
        "{text:?}"
    );
    let p = frames_psnr("moe", tmp.path());
    assert!(
        p < 40.0,
        "8 steps with 4 on the expert gave the same video ({p:.1} dB)"
    );
}

/// A diffusers Wan 2.2 A14B pipeline folder as `-m`: `transformer` is the high-noise expert and
/// `transformer_2` the model that finishes (WanPipeline's switch), and the folder's
/// `boundary_ratio` is the MoE boundary unless `--moe-boundary` is given. Same video as the two
/// files passed by flag.
#[test]
fn diffusers_moe_folder_runs_as_the_pair() {
    let tmp = tempfile::tempdir().unwrap();
    let t2v = fixture_path("wan");
    let folder = |name: &str, ratio: f32| {
        let root = tmp.path().join(name);
        std::fs::create_dir_all(&root).unwrap();
        let index = format!(
            r#"{{"_class_name": "WanImageToVideoPipeline", "boundary_ratio": {ratio},
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "transformer_2": ["diffusers", "WanTransformer3DModel"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "vae": ["diffusers", "AutoencoderKLWan"]}}"#
        );
        std::fs::write(root.join("model_index.json"), index).unwrap();
        for (sub, target) in [
            ("transformer", fix("moe_high")),
            ("transformer_2", fix("concat_only")),
            ("text_encoder", t2v.join("text_encoder")),
            ("vae", t2v.join("vae")),
        ] {
            std::os::unix::fs::symlink(target.canonicalize().unwrap(), root.join(sub)).unwrap();
        }
        root
    };
    let start = fix("start.png");
    let video = |root: &Path, extra: &[&str]| {
        let out = tempfile::tempdir_in(tmp.path()).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args(["-M", "vid_gen", "-m", s(root)])
            .args([
                "--t5xxl-tokenizer",
                s(&fixture_path(
                    "../../../shared/tokenizers/t5-v1_1.tokenizer.json",
                )),
            ])
            .args(["-p", PROMPT, "--steps", "4", "--cfg-scale", "5"])
            .args(["-W", "32", "-H", "32", "--video-frames", "5"])
            .args(["-s", "42", "--rng", "cpu", "-t", "2"])
            .args(["--init-img", s(&start), "--high-noise-cfg-scale", "3"])
            .args(extra)
            .args(["-o", s(&out.path().join("frame_%d.png"))])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let p = frames_psnr("moe", out.path());
        (p, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    // diffusers' own A14B ratio for T2V, the boundary the reference ran with.
    let (p, _) = video(&folder("t2v_ratio", 0.875), &[]);
    eprintln!("Wan 2.2 pipeline folder as -m: {p:.1} dB against the two-expert reference");
    assert!(p >= 55.0, "folder as the pair: {p:.1} dB");
    // Another ratio in the folder moves the switch; --moe-boundary overrides it.
    let low = folder("low_ratio", 0.3);
    let (p_low, err) = video(&low, &["-v"]);
    assert!(
        p_low < 40.0,
        "boundary_ratio 0.3 was not used ({p_low:.1} dB)"
    );
    assert!(err.contains("boundary_ratio"), "{err}");
    let (p_flag, _) = video(&low, &["--moe-boundary", "0.875"]);
    eprintln!("boundary_ratio 0.3: {p_low:.1} dB; with --moe-boundary 0.875: {p_flag:.1} dB");
    assert!(p_flag >= 55.0, "--moe-boundary did not win: {p_flag:.1} dB");
}

/// The 5 frames a run wrote into `dir`, as one byte string.
fn frames_of(dir: &Path) -> Vec<u8> {
    (0..5)
        .flat_map(|i| read_png(&dir.join(format!("frame_{i}.png"))).unwrap().data)
        .collect()
}

/// A small deterministic pattern in [-0.5, 0.5).
fn pattern(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `<lora:|high_noise|NAME:W>` reaches the high-noise expert only (upstream's syntax for Wan
/// 2.2 A14B): the video equals one made with the LoRA merged into the expert's file by hand
/// (merged at load and applied at run time alike), and the same LoRA as a plain tag goes to
/// `--diffusion-model` instead. Without an expert the tag is ignored with a warning.
#[test]
fn high_noise_lora_tags_reach_the_expert_only() {
    use sd_cli::weights::safetensors::{write_safetensors, SafetensorsItem};
    let tmp = tempfile::tempdir().unwrap();
    let loras = tmp.path().join("loras");
    std::fs::create_dir_all(&loras).unwrap();
    // A PEFT LoRA (no alpha: scale 1) on the first block's query projection.
    let module = "blocks.0.attn1.to_q";
    let expert_file = fix("moe_high").join("diffusion_pytorch_model.safetensors");
    let store = sd_cli::weights::TensorStore::open(&expert_file).unwrap();
    let w = tensor(&store, &format!("{module}.weight"));
    let [cols, rows, ..] = w.ne;
    let rank = 2;
    let down: Vec<f32> = pattern(rank * cols, 1).iter().map(|v| v * 1.5).collect();
    let up: Vec<f32> = pattern(rows * rank, 2).iter().map(|v| v * 1.5).collect();
    let (down_b, up_b) = (f32_bytes(&down), f32_bytes(&up));
    let (down_name, up_name) = (
        format!("transformer.{module}.lora_A.weight"),
        format!("transformer.{module}.lora_B.weight"),
    );
    let (down_shape, up_shape) = ([rank as u64, cols as u64], [rows as u64, rank as u64]);
    let items = [
        SafetensorsItem {
            name: &down_name,
            dtype: "F32",
            shape: &down_shape,
            data: &down_b,
        },
        SafetensorsItem {
            name: &up_name,
            dtype: "F32",
            shape: &up_shape,
            data: &up_b,
        },
    ];
    write_safetensors(&loras.join("hn.safetensors"), &Default::default(), &items).unwrap();
    // The same LoRA named for the original (ComfyUI) layout of the Wan files.
    let (comfy_down, comfy_up) = (
        "diffusion_model.blocks.0.self_attn.q.lora_A.weight",
        "diffusion_model.blocks.0.self_attn.q.lora_B.weight",
    );
    let comfy = [
        SafetensorsItem {
            name: comfy_down,
            ..items[0]
        },
        SafetensorsItem {
            name: comfy_up,
            ..items[1]
        },
    ];
    write_safetensors(
        &loras.join("comfy.safetensors"),
        &Default::default(),
        &comfy,
    )
    .unwrap();

    // The expert with W + up · down written into its file.
    let merged_dir = tmp.path().join("merged_expert");
    std::fs::create_dir_all(&merged_dir).unwrap();
    std::fs::copy(
        fix("moe_high").join("config.json"),
        merged_dir.join("config.json"),
    )
    .unwrap();
    let names: Vec<String> = store.iter().map(|t| t.name.clone()).collect();
    let tensors: Vec<(Vec<u64>, Vec<u8>)> = names
        .iter()
        .map(|n| {
            let mut t = tensor(&store, n);
            if *n == format!("{module}.weight") {
                for r in 0..rows {
                    for c in 0..cols {
                        let d: f32 = (0..rank)
                            .map(|k| up[r * rank + k] * down[k * cols + c])
                            .sum();
                        t.data[r * cols + c] += d;
                    }
                }
            }
            let dims = t.ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
            let shape = t.ne[..dims].iter().rev().map(|&d| d as u64).collect();
            (shape, f32_bytes(&t.data))
        })
        .collect();
    let items: Vec<_> = names
        .iter()
        .zip(&tensors)
        .map(|(n, (shape, data))| SafetensorsItem {
            name: n,
            dtype: "F32",
            shape,
            data,
        })
        .collect();
    write_safetensors(
        &merged_dir.join("diffusion_pytorch_model.safetensors"),
        &Default::default(),
        &items,
    )
    .unwrap();

    let start = fix("start.png");
    let video = |name: &str, expert: &Path, prompt: &str, extra: &[&str]| {
        let out = tmp.path().join(name);
        std::fs::create_dir_all(&out).unwrap();
        let mut args = vec![
            "--init-img",
            s(&start),
            "--high-noise-diffusion-model",
            s(expert),
            "--high-noise-cfg-scale",
            "3",
            "--lora-model-dir",
            s(&loras),
        ];
        args.extend(extra);
        let o = run_prompt(&fix("concat_only"), prompt, &args, &out);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        frames_of(&out)
    };
    let tagged = format!("{PROMPT}<lora:|high_noise|hn:1>");
    let by_hand = video("by_hand", &merged_dir, PROMPT, &[]);
    let merged = video("merged", &fix("moe_high"), &tagged, &[]);
    let runtime = video(
        "runtime",
        &fix("moe_high"),
        &tagged,
        &["--lora-apply-mode", "at_runtime"],
    );
    let comfy = video(
        "comfy",
        &fix("moe_high"),
        &format!("{PROMPT}<lora:|high_noise|comfy:1>"),
        &[],
    );
    let plain = video("plain", &fix("moe_high"), PROMPT, &[]);
    let to_main = video(
        "to_main",
        &fix("moe_high"),
        &format!("{PROMPT}<lora:hn:1>"),
        &[],
    );
    let (p_merged, p_runtime) = (psnr(&merged, &by_hand), psnr(&runtime, &by_hand));
    let (p_plain, p_main) = (psnr(&plain, &by_hand), psnr(&to_main, &by_hand));
    let p_comfy = psnr(&comfy, &by_hand);
    eprintln!(
        "high-noise LoRA vs merged by hand: merged {p_merged:.1} dB, at run time {p_runtime:.1} dB, \
         original-layout names {p_comfy:.1} dB; without it {p_plain:.1} dB, as a plain tag \
         {p_main:.1} dB"
    );
    assert!(p_merged >= 60.0 && p_runtime >= 55.0 && p_comfy >= 60.0);
    assert!(p_plain < 45.0, "the LoRA changed nothing ({p_plain:.1} dB)");
    assert!(
        p_main < 45.0,
        "a plain tag reached the expert ({p_main:.1} dB)"
    );

    // No expert: the tag is ignored, with a warning.
    let out = tmp.path().join("no_expert");
    std::fs::create_dir_all(&out).unwrap();
    let o = run_prompt(
        &fix("concat_only"),
        &tagged,
        &["--init-img", s(&start), "--lora-model-dir", s(&loras)],
        &out,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("high-noise") && err.contains("ignored"),
        "{err}"
    );
}

/// `sd-cli -M vid_gen` on the TI2V-style transformer over the tiny Wan 2.2 VAE (64×32, 5 frames).
fn ti2v_run(extra: &[&str], tmp: &Path) -> std::process::Output {
    let t2v = fixture_path("wan");
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen", "--diffusion-model", s(&fix("ti2v"))])
        .args(["--t5xxl", s(&t2v.join("text_encoder/model.safetensors"))])
        .args([
            "--t5xxl-tokenizer",
            s(&fixture_path(
                "../../../shared/tokenizers/t5-v1_1.tokenizer.json",
            )),
        ])
        .args(["--vae", s(&fixture_path("wan22_vae/diffusers"))])
        .args(["-p", PROMPT, "--steps", "4", "--cfg-scale", "5"])
        .args(["-W", "64", "-H", "32", "--video-frames", "5"])
        .args(["-s", "42", "--rng", "cpu", "-t", "2"])
        .args(extra)
        .args(["-o", s(&tmp.join("frame_%d.png"))])
        .output()
        .unwrap()
}

/// Wan 2.2 TI2V-5B style text-to-video and image-to-video: the Wan 2.2 VAE (16×, patchified,
/// picked from its weights) under a transformer of its latent width, against WanPipeline's loop
/// and WanImageToVideoPipeline's `expand_timesteps` loop (the init image's latent as the first
/// frame, clean, at timestep 0).
#[test]
fn wan22_ti2v_matches_diffusers() {
    let start = fix("start_wide.png");
    for (case, extra) in [
        ("ti2v_t2v", vec![]),
        ("ti2v_i2v", vec!["--init-img", s(&start)]),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let o = ti2v_run(&extra, tmp.path());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let p = frames_psnr(case, tmp.path());
        eprintln!("Wan 2.2 {case}: 5 frames vs diffusers: PSNR {p:.1} dB");
        assert!(p >= 55.0, "{case}: PSNR {p:.1} dB");
    }
}
