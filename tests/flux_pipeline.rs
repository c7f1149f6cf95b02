//! FLUX.1 against diffusers on tiny random-weight models (tests/reference/flux_fixtures.py):
//! one transformer call of a dev model (diffusers folder, guidance embedding) and a schnell
//! model (BFL single-file names: fused qkv / linear1, (shift, scale) final modulation), the
//! prompt conditioning (T5 over 256 tokens unmasked, pooled CLIP-L), and whole `sd-cli` runs
//! against `FluxPipeline` under sd-cli's schedule rule (REFERENCE-NOTES 29).
//!
//! Tolerances: transformer 1e-4 × max(1, max |reference|); T5 states 1e-4, pooled 1e-5 (×
//! scale); images ≥ 60 dB PSNR (8-bit PNG).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::models::dit::flux::{packing, Flux, FluxConfig, FluxInputs, FluxLayout};
use sd_cli::pipeline::components::{ComponentFiles, ComponentId, ComponentStore, Needs};
use sd_cli::pipeline::flux::FluxPipeline;
use sd_cli::pipeline::{LoadContext, ModelArgs};
use sd_cli::runner::{BackendPlan, MemoryOptions, RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const PROMPT: &str = "A lovely cat, holding a sign.";

fn dir() -> PathBuf {
    fixture_path("flux")
}

fn refs() -> TensorStore {
    open_fixture("flux/reference.safetensors")
}

fn t5_tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tokenizers/t5-v1_1.tokenizer.json")
}

fn clip_l() -> PathBuf {
    fixture_path("sd_pipeline").join("sd1/text_encoder/model.safetensors")
}

fn t5() -> PathBuf {
    fixture_path("pixart_pipeline").join("text_encoder/model.safetensors")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The transformer of `path` (prefix `prefix`) with rope axes [4, 6, 6].
fn transformer(path: &Path, prefix: &str) -> (Flux, Runner) {
    let backend = cpu();
    let store = TensorStore::open(path).unwrap();
    let source = StoreSource::new(&store, prefix);
    let loader = WeightLoader::new(&source, None);
    let config = FluxConfig::detect(&loader.root(""))
        .unwrap()
        .with_axes_dims([4, 6, 6])
        .unwrap();
    let model = Flux::new(&loader.root(""), config).unwrap();
    let weights = loader.finish(&backend, "flux").unwrap();
    (
        model,
        Runner::new("flux", backend, Some(weights), RunOptions::default()),
    )
}

fn call(model: &Flux, runner: &Runner, guidance: f32, skip: &[usize]) -> HostTensor {
    let r = refs();
    let (x, txt, pooled) = (
        tensor(&r, "call_x"),
        tensor(&r, "call_txt"),
        tensor(&r, "call_pooled"),
    );
    let pos = packing::positions(12, 8, 0.0, (0.0, 0.0));
    let n = pos.len();
    let c = model.config();
    let mut out = runner
        .compute(|g| {
            let inputs = FluxInputs {
                img: g.input_f32("img", [c.in_channels, n, 1, 1], x.data.clone()),
                img_pos: &pos,
                targets: n,
                txt: g.input_f32("txt", [c.text_dim, txt.ne[1], 1, 1], txt.data.clone()),
                pooled: Some(g.input_f32("pooled", [c.pooled_dim, 1, 1, 1], pooled.data.clone())),
                txt_mask: None,
                timesteps: &[0.7],
                guidance: &[guidance],
                skip_layers: skip,
            };
            vec![model.forward(g, &inputs).unwrap()]
        })
        .unwrap();
    out.pop().unwrap()
}

#[test]
fn transformer_matches_diffusers_in_both_layouts() {
    let (dev, runner) = transformer(
        &dir().join("dev/transformer/diffusion_pytorch_model.safetensors"),
        "",
    );
    assert_eq!(dev.config().layout, FluxLayout::Diffusers);
    assert!(dev.config().guidance_embed);
    let want = tensor(&refs(), "call_dev");
    let got = call(&dev, &runner, 3.5, &[]);
    assert_close("dev (diffusers names)", &got, &want, 1e-4);
    // --skip-layers [0,3]: double block 0 and single block 1 (numbered after the doubles).
    let want = tensor(&refs(), "call_dev_skip");
    let got = call(&dev, &runner, 3.5, &[0, 3]);
    assert_close("dev without blocks 0 and 3", &got, &want, 1e-4);

    let (schnell, runner) =
        transformer(&dir().join("schnell.safetensors"), "model.diffusion_model.");
    assert_eq!(schnell.config().layout, FluxLayout::Bfl);
    assert!(!schnell.config().guidance_embed);
    let want = tensor(&refs(), "call_schnell");
    let got = call(&schnell, &runner, 0.0, &[]);
    assert_close("schnell (BFL names)", &got, &want, 1e-4);
}

fn pipeline() -> FluxPipeline {
    pipeline_of(&dir().join("dev/transformer"))
}

fn pipeline_of(transformer: &Path) -> FluxPipeline {
    let mut files = ComponentFiles::new("FLUX.1");
    let open = |id, p: &Path| ComponentStore::open(id, p, false).unwrap();
    files.insert(
        ComponentId::Diffusion,
        open(ComponentId::Diffusion, transformer),
    );
    files.insert(ComponentId::ClipL, open(ComponentId::ClipL, &clip_l()));
    files.insert(ComponentId::T5, open(ComponentId::T5, &t5()));
    files.insert(ComponentId::Vae, open(ComponentId::Vae, &dir().join("vae")));
    let plan = BackendPlan::new(Default::default(), 2);
    let tok = t5_tokenizer();
    FluxPipeline::load(
        &files,
        &LoadContext {
            backends: &plan,
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
    .expect("FLUX pipeline loads")
}

#[test]
fn conditioning_matches_diffusers() {
    let pipe = pipeline();
    let c = pipe.condition(PROMPT).unwrap();
    let r = refs();
    let want_t5 = tensor(&r, "t5");
    assert_eq!(c.text.ne[1], 256, "T5 runs over 256 tokens");
    assert_close("T5 states", &c.text, &want_t5, 1e-4);
    let pooled = HostTensor::new([c.pooled.len(), 1, 1, 1], c.pooled.clone()).unwrap();
    assert_close("pooled CLIP", &pooled, &tensor(&r, "pooled"), 1e-5);
}

/// `sd-cli` on a FLUX model given as `model_args`; returns the image.
fn run(model_args: &[&str], extra: &[&str], out: &Path) -> sd_cli::image_io::Image {
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(model_args)
        .args(["--clip_l", s(&clip_l()), "--t5xxl", s(&t5())])
        .args(["--t5xxl-tokenizer", s(&t5_tokenizer())])
        .args(["--vae", s(&dir().join("vae"))])
        .args(["-p", PROMPT, "--cfg-scale", "1", "--steps", "4"])
        .args([
            "-W", "24", "-H", "16", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "sd-cli {model_args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    read_png(out).unwrap()
}

fn check_image(what: &str, img: &sd_cli::image_io::Image, key: &str) {
    let want = tensor(&refs(), key);
    let p = psnr(&img.data, &image_bytes(&want));
    eprintln!("{what}: PSNR {p:.1} dB vs FluxPipeline");
    assert!(p >= 60.0, "{what}: PSNR {p:.1} dB");
}

#[test]
fn dev_and_schnell_runs_match_flux_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = run(
        &["--diffusion-model", s(&dir().join("dev/transformer"))],
        &[],
        &tmp.path().join("dev.png"),
    );
    check_image("dev (diffusers folder)", &dev, "dev_image");
    let schnell = run(
        &["--diffusion-model", s(&dir().join("schnell.safetensors"))],
        &[],
        &tmp.path().join("schnell.png"),
    );
    check_image("schnell (BFL single file)", &schnell, "schnell_image");
}

/// FLUX.1 Kontext: `-r` reference latents after the target's tokens at rope index 1, against
/// `FluxKontextPipeline` (guidance 2.5; the 32x16 reference keeps its size under both rules).
#[test]
fn kontext_reference_image_matches_flux_kontext_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let img = run(
        &["--diffusion-model", s(&dir().join("dev/transformer"))],
        &["-r", s(&dir().join("kontext_ref.png")), "--guidance", "2.5"],
        &tmp.path().join("kontext.png"),
    );
    check_image("Kontext (-r)", &img, "kontext_image");
}

/// FLUX Fill: `--init-img` + `--mask` into the masked-image latent and mask channels, with
/// sd-cli's dilated-mask blend, against the reference loop over diffusers' modules.
#[test]
fn fill_inpainting_matches_the_reference_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let img = run(
        &["--diffusion-model", s(&dir().join("fill/transformer"))],
        &[
            "--init-img",
            s(&dir().join("fill_init.png")),
            "--mask",
            s(&dir().join("fill_mask.png")),
            "--strength",
            "1",
        ],
        &tmp.path().join("fill.png"),
    );
    check_image("FLUX Fill", &img, "fill_image");
}

/// TAEF1 (`--taesd`, a 16-channel tiny autoencoder) decodes instead of the `ae`.
#[test]
fn taef1_decodes_instead_of_the_vae() {
    let tmp = tempfile::tempdir().unwrap();
    let img = run(
        &["--diffusion-model", s(&dir().join("dev/transformer"))],
        &["--taesd", s(&dir().join("taef1"))],
        &tmp.path().join("taef1.png"),
    );
    check_image("TAEF1", &img, "taef1_image");
}

#[test]
fn chroma_conditioning_is_t5_over_512_tokens_with_a_key_mask() {
    let pipe = pipeline_of(&dir().join("chroma/transformer"));
    let c = pipe.condition(PROMPT).unwrap();
    assert_eq!(c.text.ne[1], 512);
    assert!(c.pooled.is_empty());
    assert_close(
        "Chroma T5 states",
        &c.text,
        &tensor(&refs(), "chroma_t5"),
        1e-4,
    );
    let mask = c.mask.expect("the DiT mask is on by default");
    let kept = mask.iter().filter(|v| **v == 0.0).count();
    let tokens = sd_cli::tokenizers::load_t5_tokenizer(&t5_tokenizer())
        .unwrap()
        .encode_with_specials(PROMPT)
        .len();
    assert_eq!(
        kept,
        tokens + 1,
        "the prompt's tokens and one pad are attended"
    );
}

/// `sd-cli` on a Chroma model (T5 only, CFG 4 against `-n blurry`).
fn run_chroma(model: &Path, out: &Path) -> sd_cli::image_io::Image {
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["--diffusion-model", s(model), "--t5xxl", s(&t5())])
        .args(["--t5xxl-tokenizer", s(&t5_tokenizer())])
        .args(["--vae", s(&dir().join("vae"))])
        .args([
            "-p",
            PROMPT,
            "-n",
            "blurry",
            "--cfg-scale",
            "4",
            "--steps",
            "4",
        ])
        .args([
            "-W", "24", "-H", "16", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args(["-o", s(out)])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_png(out).unwrap()
}

/// Chroma (approximator modulation, T5 over 512 tokens unmasked, the DiT masking padded text
/// keys but one) from a diffusers folder and a BFL single file, against the reference loop.
#[test]
fn chroma_folder_and_single_file_match_the_reference_loop() {
    let tmp = tempfile::tempdir().unwrap();
    let img = run_chroma(
        &dir().join("chroma/transformer"),
        &tmp.path().join("c1.png"),
    );
    check_image("Chroma (diffusers folder)", &img, "chroma_image");
    let img = run_chroma(
        &dir().join("chroma.safetensors"),
        &tmp.path().join("c2.png"),
    );
    check_image("Chroma (BFL single file)", &img, "chroma_image");
}

/// A diffusers/PEFT LoRA (split q/k/v, the single blocks' MLP input) on the BFL schnell file,
/// whose fused `qkv` / `linear1` weights take it on row slices, merged and at run time.
#[test]
fn peft_lora_lands_on_fused_bfl_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let loras = dir().join("loras");
    for mode in ["immediately", "at_runtime"] {
        let img = run(
            &["--diffusion-model", s(&dir().join("schnell.safetensors"))],
            &[
                "--lora-model-dir",
                s(&loras),
                "--lora-apply-mode",
                mode,
                "-p",
                &format!("{PROMPT}<lora:flux_peft:1>"),
            ],
            &tmp.path().join(format!("lora_{mode}.png")),
        );
        check_image(&format!("FLUX LoRA ({mode})"), &img, "lora_image");
        let plain = image_bytes(&tensor(&refs(), "schnell_image"));
        assert!(psnr(&img.data, &plain) < 50.0, "the LoRA changed nothing");
    }
}

/// `-M convert` of the BFL schnell file to q8_0 GGUF runs (≥ 35 dB), and a budget that forces
/// several segments (`--offload-to-cpu --max-vram`) gives the monolithic picture exactly.
#[test]
fn q8_0_gguf_and_segmented_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("schnell-q8_0.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "convert", "-m", s(&dir().join("schnell.safetensors"))])
        .args(["-o", s(&gguf), "--type", "q8_0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let q8 = run(
        &["--diffusion-model", s(&gguf)],
        &[],
        &tmp.path().join("q8.png"),
    );
    let want = image_bytes(&tensor(&refs(), "schnell_image"));
    let p = psnr(&q8.data, &want);
    eprintln!("schnell q8_0 GGUF: PSNR {p:.1} dB vs FluxPipeline");
    assert!(p >= 35.0, "q8_0: PSNR {p:.1} dB");

    // Text encoders left out (their zeros stand in): their token tables alone exceed a budget
    // that splits this tiny transformer. 1.5 MiB: one block's segment needs 1.3 MiB on
    // Vulkan (its compute buffers are larger than the CPU's) and still splits on both.
    let schnell = dir().join("schnell.safetensors");
    let bare = |extra: &[&str], out: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
            .args([
                "--diffusion-model",
                s(&schnell),
                "--vae",
                s(&dir().join("vae")),
            ])
            .args(["-p", PROMPT, "--cfg-scale", "1", "--steps", "4"])
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
    let out = tmp.path().join("segments.png");
    let (seg, err) = bare(&["--offload-to-cpu", "--max-vram", "0.0015", "-v"], &out);
    assert!(err.contains("segment 2/"), "the run is segmented: {err}");
    assert_eq!(seg.data, whole.data, "segmented == whole");
}
