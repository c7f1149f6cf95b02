//! Stable Diffusion beyond the plain runs of tests/sd_pipeline.rs, on the same tiny fixtures
//! (tests/reference/sd_extras_fixtures.py → tests/fixtures/sd_extras/, reusing
//! tests/fixtures/sd_pipeline/ by path):
//!
//! - textual inversion from `--embd-dir` (A1111 safetensors and `.pt`, SDXL `clip_l`/`clip_g`)
//!   against diffusers' `load_textual_inversion`;
//! - emphasis, prompts past 75 tokens and `BREAK` through the whole conditioner against
//!   upstream's rules transcribed in Python over transformers' encoders;
//! - TAESD encode / decode against diffusers' `AutoencoderTiny`, and img2img with `--taesd`;
//! - `-M convert` to GGUF (f32, f16, q8_0) and runs from the GGUF;
//! - a Lightning `.ckpt` (torch.save's own pickle; the ZIP is written here);
//! - upstream's SD2 v-prediction probe, both outcomes.
//!
//! Tolerances: conditionings 1e-4 × scale; TAESD 1e-4 × scale; images ≥ 60 dB PSNR where the
//! weights are the reference's, lower stated bounds for f16 / q8_0 GGUFs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::image_io::read_png;
use sd_cli::models::vae::taesd::Taesd;
use sd_cli::models::vae::Vae;
use sd_cli::pipeline::components::{ComponentFiles, ComponentId, ComponentStore, Needs};
use sd_cli::pipeline::sd::SdPipeline;
use sd_cli::pipeline::{LoadContext, ModelArgs};
use sd_cli::runner::MemoryOptions;
use sd_cli::sampling::Prediction;
use sd_cli::tensor::HostTensor;
use sd_cli::weights::safetensors::{parse_safetensors, write_safetensors, SafetensorsItem};
use sd_cli::weights::TensorStore;

const PROMPT: &str = "A lovely cat, holding a sign.";
const NEGATIVE: &str = "blurry, low quality";
// The prompts of sd_extras_fixtures.py.
const TI_PROMPT: &str = "a photo of mystyle cat";
const TI_PT_PROMPT: &str = "ptstyle, a dog by MyStyle in oldstyle";
const TI_XL_PROMPT: &str = "a xlstyle cat holding a sign";
const EMPHASIS: &str = "a (lovely:1.3) cat, [holding] a sign";
const BREAK: &str = "a lovely cat BREAK holding a (sign:1.2)";
const XL_BREAK: &str = "a (lovely:1.3) cat BREAK [holding] a sign";

fn long_prompt() -> String {
    "a lovely cat holding a sign in the garden, ".repeat(9) + "(bright sun:1.2)"
}

fn sdp() -> PathBuf {
    fixture_path("sd_pipeline")
}

fn extras() -> PathBuf {
    fixture_path("sd_extras")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Each component of a diffusers folder or a single file, as `-m` opens them.
fn model_files(model: &Path) -> ComponentFiles {
    let mut files = ComponentFiles::new("Stable Diffusion");
    for id in [
        ComponentId::Diffusion,
        ComponentId::ClipL,
        ComponentId::ClipG,
        ComponentId::Vae,
    ] {
        let store = ComponentStore::open(id, model, true).unwrap();
        if !store.is_empty() {
            files.insert(id, store);
        }
    }
    files
}

fn load(model: &Path, embd_dir: Option<&Path>) -> SdPipeline {
    let plan = common::device::test_plan(2);
    SdPipeline::load(
        &model_files(model),
        &LoadContext {
            backends: &plan,
            memory: MemoryOptions::default(),
            wtype: None,
            flash_attn: false,
            model_args: &ModelArgs::default(),
            needs: Needs::default(),
            t5_tokenizer: None,
            prediction: None,
            clip_skip: None,
            embd_dir,
            lora: None,
            taesd_preview_only: false,
            flow_shift: None,
        },
    )
    .expect("pipeline loads")
}

fn refs() -> TensorStore {
    open_fixture("sd_extras/reference.safetensors")
}

/// A reference image [3, H, W] in [0, 1] as interleaved RGB bytes.
fn reference_png(store: &TensorStore, name: &str) -> Vec<u8> {
    image_bytes(&tensor(store, name))
}

fn sd_cli(args: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "sd-cli {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs the binary with sd_pipeline's generation settings; returns the PNG's bytes.
fn run(model_args: &[&str], prompt: &str, extra: &[&str], out: &Path) -> Vec<u8> {
    let mut args: Vec<&str> = model_args.to_vec();
    args.extend([
        "-p",
        prompt,
        "-n",
        NEGATIVE,
        "--steps",
        "4",
        "--cfg-scale",
        "5",
    ]);
    args.extend(["-W", "24", "-H", "16", "-s", "42", "--rng", "cpu"]);
    args.extend(["--sampling-method", "euler", "--scheduler", "discrete"]);
    args.extend(["-t", "2"]);
    args.extend(extra);
    args.extend(["-o", s(out)]);
    sd_cli(&args);
    let img = read_png(out).unwrap();
    assert_eq!((img.width, img.height), (24, 16));
    img.data
}

fn context_rows(t: &HostTensor) -> usize {
    t.ne[1]
}

// ---- 1. Textual inversion ----

#[test]
fn sd1_textual_inversion_conditioning_matches_diffusers() {
    let r = refs();
    let embd = extras().join("embd_sd1");
    let pipe = load(&sdp().join("sd1"), Some(&embd));
    // The embedding's two rows take ids past the vocabulary where diffusers put them.
    for (prompt, key) in [(TI_PROMPT, "ids_ti"), (TI_PT_PROMPT, "ids_ti_pt")] {
        let chunks = pipe.conditioner().tokenize(prompt).unwrap();
        let want: Vec<i32> = tensor(&r, key).data.iter().map(|&v| v as i32).collect();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].ids, want, "token ids of {prompt:?}");
    }

    let (cond, _) = pipe.conditions(TI_PROMPT, "", false).unwrap();
    assert_close(
        "sd1 TI (safetensors)",
        &cond.context,
        &tensor(&r, "cond_ti"),
        1e-4,
    );
    // A1111's .pt (ZIP and legacy torch.save) through the PyTorch reader. Names match
    // case-insensitively, as upstream
    // (diffusers expands only the lowercase spelling to both rows: its reference prompt is
    // lowercased).
    let (cond, _) = pipe.conditions(TI_PT_PROMPT, "", false).unwrap();
    assert_close(
        "sd1 TI (.pt)",
        &cond.context,
        &tensor(&r, "cond_ti_pt"),
        1e-4,
    );
}

/// Two files whose names differ only in case: the later in byte order is the word's embedding
/// (upstream's map of lowercased stems), here the real 2-vector `mystyle` over a 1-vector
/// `MyStyle`.
#[test]
fn sd1_textual_inversion_same_name_in_two_cases_keeps_the_later_file() {
    let tmp = tempfile::tempdir().unwrap();
    let real = extras().join("embd_sd1/mystyle.safetensors");
    std::fs::copy(&real, tmp.path().join("mystyle.safetensors")).unwrap();
    let junk: Vec<u8> = (0..8)
        .flat_map(|i| (i as f32 * 0.3).to_le_bytes())
        .collect();
    let item = SafetensorsItem {
        name: "emb_params",
        dtype: "F32",
        shape: &[1, 8],
        data: &junk,
    };
    let other = tmp.path().join("MyStyle.safetensors");
    write_safetensors(&other, &Default::default(), &[item]).unwrap();
    let pipe = load(&sdp().join("sd1"), Some(tmp.path()));
    let (cond, _) = pipe.conditions(TI_PROMPT, "", false).unwrap();
    assert_close(
        "sd1 TI, two cases",
        &cond.context,
        &tensor(&refs(), "cond_ti"),
        1e-4,
    );
}

#[test]
fn sd1_textual_inversion_image_matches_diffusers() {
    let tmp = tempfile::tempdir().unwrap();
    let embd = extras().join("embd_sd1");
    let got = run(
        &["-m", s(&sdp().join("sd1"))],
        TI_PROMPT,
        &["--embd-dir", s(&embd)],
        &tmp.path().join("ti.png"),
    );
    let p = psnr(&got, &reference_png(&refs(), "ti_image"));
    eprintln!("sd1 + --embd-dir vs diffusers load_textual_inversion: PSNR {p:.1} dB");
    assert!(p >= 60.0, "textual inversion image: PSNR {p:.1} dB");
}

/// SDXL's file carries `clip_l` and `clip_g`; the fixture's encoders are both 8 wide, so the
/// tensor names decide which encoder each goes to.
#[test]
fn sdxl_textual_inversion_reaches_both_encoders() {
    let r = refs();
    let embd = extras().join("embd_sdxl");
    let pipe = load(&sdp().join("sdxl"), Some(&embd));
    let (cond, _) = pipe.conditions(TI_XL_PROMPT, "", false).unwrap();
    assert_close(
        "sdxl TI context",
        &cond.context,
        &tensor(&r, "cond_ti_xl"),
        1e-4,
    );
    let pooled = cond.pooled.expect("SDXL pools");
    let pooled = HostTensor::new([pooled.len(), 1, 1, 1], pooled).unwrap();
    assert_close("sdxl TI pooled", &pooled, &tensor(&r, "pooled_ti_xl"), 1e-4);
}

// ---- 2. Emphasis, long prompts, BREAK ----

/// Our chunks equal the fixture's transcription of upstream's tokenization.
fn check_chunks(pipe: &SdPipeline, prompt: &str, key: &str, r: &TensorStore) {
    let chunks = pipe.conditioner().tokenize(prompt).unwrap();
    let ids = tensor(r, &format!("ids_{key}"));
    let weights = tensor(r, &format!("w_{key}"));
    assert_eq!(chunks.len(), ids.ne[1], "{key}: chunks");
    for (i, chunk) in chunks.iter().enumerate() {
        let want_ids: Vec<i32> = ids.data[i * 77..(i + 1) * 77]
            .iter()
            .map(|&v| v as i32)
            .collect();
        assert_eq!(chunk.ids, want_ids, "{key}: ids of chunk {i}");
        for (j, (&got, &want)) in chunk
            .weights
            .iter()
            .zip(&weights.data[i * 77..])
            .enumerate()
        {
            assert!(
                (got - want).abs() <= 1e-6,
                "{key}: weight {j} of chunk {i}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn sd1_emphasis_long_prompts_and_break_match_upstream_rules() {
    let r = refs();
    let pipe = load(&sdp().join("sd1"), None);
    let long = long_prompt();
    for (key, prompt, rows) in [
        ("emphasis", EMPHASIS, 77),
        ("long", long.as_str(), 154),
        ("break", BREAK, 154),
    ] {
        check_chunks(&pipe, prompt, key, &r);
        let (cond, _) = pipe.conditions(prompt, "", false).unwrap();
        assert_eq!(context_rows(&cond.context), rows, "{key}: context rows");
        assert_close(
            &format!("sd1 {key}"),
            &cond.context,
            &tensor(&r, &format!("cond_{key}")),
            1e-4,
        );
    }
}

/// SDXL: weights apply to the concatenated CLIP-L + bigG rows; the second chunk's bigG ids are
/// zeroed after its EOS; the pooled embedding comes from the first chunk.
#[test]
fn sdxl_emphasis_with_break_matches_upstream_rules() {
    let r = refs();
    let pipe = load(&sdp().join("sdxl"), None);
    check_chunks(&pipe, XL_BREAK, "xl_break", &r);
    let (cond, _) = pipe.conditions(XL_BREAK, "", false).unwrap();
    assert_eq!(context_rows(&cond.context), 154);
    assert_close(
        "sdxl break",
        &cond.context,
        &tensor(&r, "cond_xl_break"),
        1e-4,
    );
    let pooled = cond.pooled.expect("SDXL pools");
    let pooled = HostTensor::new([pooled.len(), 1, 1, 1], pooled).unwrap();
    assert_close(
        "sdxl break pooled",
        &pooled,
        &tensor(&r, "pooled_xl_break"),
        1e-4,
    );
}

// ---- 3. TAESD ----

#[test]
fn taesd_encode_and_decode_match_diffusers() {
    let r = open_fixture("sd_pipeline/taesd/reference.safetensors");
    let mut store = TensorStore::new();
    let prefix = ComponentId::Taesd.prefix();
    let weights = sdp().join("taesd/diffusion_pytorch_model.safetensors");
    store.add_file(&weights, prefix).unwrap();
    let (tae, w, backend) = load_block(&store, prefix, |wb| Taesd::new(wb, true).unwrap());
    assert!(tae.has_encoder() && tae.has_decoder());
    let x = tensor(&r, "encode_in");
    let z = tensor(&r, "encode_out");
    let rn = runner(Some(w), Rc::clone(&backend), false);
    let out = rn
        .compute(|g| {
            let x = g.input_f32("x", x.ne, x.data.clone());
            let z = g.input_f32("z", z.ne, z.data.clone());
            vec![tae.encode_mean(g, x), tae.decode(g, z)]
        })
        .unwrap();
    assert_close("taesd encode", &out[0], &z, 1e-4);
    assert_close("taesd decode", &out[1], &tensor(&r, "decode_out"), 1e-4);
}

#[test]
fn taesd_img2img_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let init = tmp.path().join("init.png");
    let data: Vec<u8> = (0..24 * 16)
        .flat_map(|i| [(i % 24 * 10) as u8, (i / 24 * 15) as u8, 90])
        .collect();
    let img = sd_cli::image_io::Image::new(24, 16, sd_cli::image_io::Channels::Rgb, data).unwrap();
    sd_cli::image_io::write_png_atomic(&init, &img, &[]).unwrap();
    let (sd1, taesd) = (sdp().join("sd1"), sdp().join("taesd"));
    let model = ["-m", s(&sd1), "--taesd", s(&taesd)];
    let extra = ["--init-img", s(&init), "--strength", "0.6"];
    let a = run(&model, PROMPT, &extra, &tmp.path().join("a.png"));
    let b = run(&model, PROMPT, &[], &tmp.path().join("b.png"));
    assert!(a.iter().any(|&v| v != a[0]), "img2img image is not flat");
    assert_ne!(a, b, "the init image changes the picture");
}

// ---- 4. GGUF conversions ----

/// Converts `src` with `type_flag` (None: keep the file's types), runs the GGUF, returns the
/// PSNR against `variant`'s diffusers image and the GGUF's tensor types.
fn convert_and_run(
    variant: &str,
    src: &Path,
    type_flag: Option<&str>,
    dir: &Path,
) -> (f64, Vec<DType>) {
    let name = type_flag.unwrap_or("default");
    let gguf = dir.join(format!("{variant}-{name}.gguf"));
    let mut args = vec!["-M", "convert", "-m", s(src), "-o", s(&gguf)];
    if let Some(t) = type_flag {
        args.extend(["--type", t]);
    }
    sd_cli(&args);
    let types = TensorStore::open(&gguf)
        .unwrap()
        .iter()
        .map(|t| t.dtype)
        .collect();
    let got = run(
        &["-m", s(&gguf)],
        PROMPT,
        &[],
        &dir.join(format!("{variant}-{name}.png")),
    );
    let want = reference_png(
        &open_fixture(&format!("sd_pipeline/{variant}/reference.safetensors")),
        "image",
    );
    let p = psnr(&got, &want);
    eprintln!("{variant} GGUF ({name}) vs diffusers: PSNR {p:.1} dB");
    (p, types)
}

#[test]
fn sd1_gguf_conversions_run() {
    let tmp = tempfile::tempdir().unwrap();
    let single = assemble_checkpoint(&sdp(), "sd1.single", tmp.path());
    let (p, types) = convert_and_run("sd1", &single, None, tmp.path());
    assert!(p >= 60.0, "f32 GGUF: PSNR {p:.1} dB");
    assert!(types.iter().all(|&t| t == DType::F32 || t == DType::F16));
    // Seen: 62.0 dB.
    let (p, types) = convert_and_run("sd1", &single, Some("f16"), tmp.path());
    assert!(p >= device::psnr_floor(55.0), "f16 GGUF: PSNR {p:.1} dB");
    assert!(types.contains(&DType::F16));
    // Seen: 51.6 dB (rows of 8 cannot be q8_0 blocks: those matrices are f16).
    let (p, types) = convert_and_run("sd1", &single, Some("q8_0"), tmp.path());
    assert!(p >= 45.0, "q8_0 GGUF: PSNR {p:.1} dB");
    assert!(types.contains(&DType::Q8_0));
}

#[test]
fn sdxl_q8_0_gguf_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let single = assemble_checkpoint(&sdp(), "sdxl.single", tmp.path());
    // Seen: 47.3 dB.
    let (p, types) = convert_and_run("sdxl", &single, Some("q8_0"), tmp.path());
    assert!(p >= 40.0, "sdxl q8_0 GGUF: PSNR {p:.1} dB");
    assert!(types.contains(&DType::Q8_0));
}

// ---- 5. A Lightning .ckpt ----

#[path = "sd_extras/torch_zip.rs"]
mod torch_zip;

#[test]
fn sd1_lightning_ckpt_reads_and_runs_like_the_single_file() {
    let tmp = tempfile::tempdir().unwrap();
    let single = assemble_checkpoint(&sdp(), "sd1.single", tmp.path());
    let ckpt = tmp.path().join("sd1.ckpt");
    torch_zip::write_ckpt(
        &extras().join("sd1.ckpt.json"),
        &extras().join("sd1.ckpt.pkl"),
        &single,
        &ckpt,
    );
    // Every tensor of the single file, with the same type, shape and bytes.
    let a = TensorStore::open(&single).unwrap();
    let b = TensorStore::open(&ckpt).unwrap();
    assert_eq!(a.len(), b.len());
    for t in a.iter() {
        let u = b
            .get(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!((t.dtype, t.ne), (u.dtype, u.ne), "{}", t.name);
        assert_eq!(
            a.get_bytes(t).unwrap(),
            b.get_bytes(u).unwrap(),
            "{}",
            t.name
        );
    }
    let want = reference_png(
        &open_fixture("sd_pipeline/sd1/reference.safetensors"),
        "image",
    );
    let got = run(&["-m", s(&ckpt)], PROMPT, &[], &tmp.path().join("ckpt.png"));
    let p = psnr(&got, &want);
    eprintln!("sd1 .ckpt vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 60.0, ".ckpt: PSNR {p:.1} dB");
}

// ---- 6. SD2's v-prediction probe ----

/// Writes `src` (a safetensors file) to `out` with `add` added to the f32 tensor `name`.
fn shift_tensor(src: &Path, name: &str, add: f32, out: &Path) {
    let bytes = std::fs::read(src).unwrap();
    let header = parse_safetensors(&bytes, src).unwrap();
    let mut parts: Vec<(String, String, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut found = false;
    for t in &header.tensors {
        let start = t.offset as usize;
        let mut data = bytes[start..start + t.len as usize].to_vec();
        let dtype = t.dtype.name().to_uppercase();
        if t.name == name {
            assert_eq!(dtype, "F32", "{name}");
            for v in data.chunks_exact_mut(4) {
                let x = f32::from_le_bytes([v[0], v[1], v[2], v[3]]) + add;
                v.copy_from_slice(&x.to_le_bytes());
            }
            found = true;
        }
        parts.push((t.name.clone(), dtype, t.shape.clone(), data));
    }
    assert!(found, "{} has no {name}", src.display());
    let items: Vec<_> = parts
        .iter()
        .map(|(name, dtype, shape, data)| SafetensorsItem {
            name,
            dtype,
            shape,
            data,
        })
        .collect();
    write_safetensors(out, &Default::default(), &items).unwrap();
}

/// Without `--prediction` and a scheduler config, an SD2 single file is v when the UNet's
/// mean(out − x) on upstream's constant input is below −1 (probe.json: diffusers' UNet).
#[test]
fn sd2_probe_decides_like_upstream_both_ways() {
    let probe: serde_json::Value =
        serde_json::from_slice(&std::fs::read(extras().join("probe.json")).unwrap()).unwrap();
    let expect = |key: &str| match probe[key].as_bool().unwrap() {
        true => Prediction::V,
        false => Prediction::Eps,
    };
    let tmp = tempfile::tempdir().unwrap();
    let single = assemble_checkpoint(&sdp(), "sd2.single", tmp.path());
    let pipe = load(&single, None);
    eprintln!(
        "sd2 probe: diffusers mean {} → {}",
        probe["mean"],
        pipe.prediction()
    );
    assert_eq!(pipe.prediction(), expect("v"));

    let shifted = tmp.path().join("sd2-shifted.safetensors");
    let name = probe["tensor"].as_str().unwrap();
    shift_tensor(
        &single,
        name,
        probe["shift"].as_f64().unwrap() as f32,
        &shifted,
    );
    let pipe = load(&shifted, None);
    eprintln!(
        "sd2 probe, output bias shifted: diffusers mean {} → {}",
        probe["shifted_mean"],
        pipe.prediction()
    );
    assert_eq!(pipe.prediction(), expect("shifted_v"));
    assert_ne!(expect("v"), expect("shifted_v"), "both branches");
}
