//! Wan 2.1 VACE against diffusers (tests/reference/wan_vace_fixtures.py →
//! tests/fixtures/wan_vace/): the VACE transformer (`WanVACETransformer3DModel`) in both
//! checkpoint layouts, its hint positions from config.json or upstream's rule, and whole
//! `-M vid_gen` runs: a control video (six frames, grey after them) with a reference image
//! (`--init-img`) at `--vace-strength 0.8`, and a plain text-to-video run of the VACE model,
//! against WanVACEPipeline's conditioning and the denoising loop on sd-cli's sigmas.
//!
//! Tolerances: the transformer within 2e-5 × max(1, |reference|) (f32); videos ≥ 55 dB PSNR
//! over all frames (8-bit).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::read_png;
use sd_cli::models::dit::wan::{VaceContext, Wan, WanConfig, WanHints, WanInputs, WanLayout};
use sd_cli::runner::{MemoryOptions, RunOptions, Runner, RunnerError, StoreSource, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const TOL: f32 = 2e-5;
const PREFIX: &str = "model.diffusion_model.";
const PROMPT: &str = "A lovely cat walking on the grass.";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A diffusers folder's weights and what its config.json says.
fn diffusers_store(name: &str) -> (TensorStore, WanHints) {
    let dir = fixture_path(&format!("wan_vace/{name}"));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let store = TensorStore::open(&dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    (store, WanHints::from_config(&config))
}

fn load(store: &TensorStore, prefix: &str, hints: WanHints) -> (Wan, Runner) {
    load_with(store, prefix, hints, RunOptions::default())
}

fn load_with(
    store: &TensorStore,
    prefix: &str,
    hints: WanHints,
    options: RunOptions,
) -> (Wan, Runner) {
    let source = StoreSource::new(store, prefix);
    let backend = cpu();
    let loader = WeightLoader::new(&source, None);
    let config = WanConfig::detect(&loader.root(""), hints).unwrap();
    let model = Wan::new(&loader.root(""), config).unwrap();
    let weights = loader.finish(&backend, "wan").unwrap();
    (model, Runner::new("wan", backend, Some(weights), options))
}

struct Case {
    latent: HostTensor,
    control: HostTensor,
    text: HostTensor,
    t: f32,
    strength: f32,
    out: HostTensor,
}

fn case(name: &str) -> Case {
    let store = open_fixture("wan_vace/cases.safetensors");
    let get = |what: &str| tensor(&store, &format!("{name}.{what}"));
    Case {
        latent: get("latent"),
        control: get("control"),
        text: get("text"),
        t: get("t").data[0],
        strength: get("strength").data[0],
        out: get("out"),
    }
}

fn run(model: &Wan, runner: &Runner, c: &Case) -> Result<HostTensor, RunnerError> {
    let mut err = None;
    let out = runner.compute(|g| {
        let inputs = WanInputs {
            latent: g.input_f32("latent", c.latent.ne, c.latent.data.clone()),
            text: g.input_f32("text", c.text.ne, c.text.data.clone()),
            image: None,
            timestep: c.t,
            vace: Some(VaceContext {
                context: g.input_f32("control", c.control.ne, c.control.data.clone()),
                strength: c.strength,
            }),
        };
        match model.forward(g, &inputs) {
            Ok(y) => vec![y],
            Err(e) => {
                err = Some(e);
                vec![g.input_f32("unused", [1, 1, 1, 1], vec![0.0])]
            }
        }
    })?;
    match err {
        Some(e) => Err(e),
        None => Ok(out.into_iter().next().unwrap()),
    }
}

#[test]
fn vace_transformer_matches_diffusers_both_layouts() {
    let (store, hints) = diffusers_store("dit");
    assert_eq!(hints.vace_layers.as_deref(), Some(&[0, 2][..]));
    let (m, r) = load(&store, "", hints);
    let v = m.config().vace.clone().expect("VACE branch");
    assert_eq!((v.in_channels, v.layers.as_slice()), (10, &[0, 2][..]));

    let tmp = tempfile::tempdir().unwrap();
    let single = assemble_checkpoint(&fixture_path("wan_vace"), "dit.single", tmp.path());
    let single = TensorStore::open(&single).unwrap();
    // No config.json: upstream's rule (every 4 / 2 = 2nd block) gives the same positions.
    let (o, ro) = load(&single, PREFIX, Some(2).into());
    assert_eq!(o.config().layout, WanLayout::Original);
    assert_eq!(o.config().vace, m.config().vace);

    for name in ["vace", "vace_weak", "vace_odd"] {
        let c = case(name);
        assert_close(
            &format!("{name} (diffusers names)"),
            &run(&m, &r, &c).unwrap(),
            &c.out,
            TOL,
        );
        assert_close(
            &format!("{name} (original names)"),
            &run(&o, &ro, &c).unwrap(),
            &c.out,
            TOL,
        );
    }

    // Cut into segments (the control stream carried between them), the same output exactly.
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let (_, store_hints) = diffusers_store("dit");
    let (ms, rs) = load_with(&store, "", store_hints, options);
    let c = case("vace");
    let segmented = run(&ms, &rs, &c).unwrap();
    let report = rs.last_report().expect("a planned run");
    assert!(report.segmented && report.segments.len() >= 3, "{report:?}");
    assert_eq!(
        segmented,
        run(&m, &r, &c).unwrap(),
        "segmented vs monolithic"
    );

    // A control of another size than the latent is refused, naming both.
    let mut c = case("vace");
    c.control = case("vace_odd").control;
    let e = run(&m, &r, &c).unwrap_err().to_string();
    assert!(e.contains("VACE control"), "{e}");
}

#[test]
fn vace_hint_positions_come_from_config_json() {
    let (store, hints) = diffusers_store("dit_cfg");
    let (m, r) = load(&store, "", hints);
    assert_eq!(m.config().vace.as_ref().unwrap().layers, [0, 3]);
    let c = case("cfg");
    assert_close(
        "hints after blocks 0 and 3",
        &run(&m, &r, &c).unwrap(),
        &c.out,
        TOL,
    );

    // Without config.json, upstream's rule puts them after blocks 0 and 2: another output.
    let (m, r) = load(&store, "", Some(2).into());
    assert_eq!(m.config().vace.as_ref().unwrap().layers, [0, 2]);
    let got = run(&m, &r, &c).unwrap();
    let diff = got
        .data
        .iter()
        .zip(&c.out.data)
        .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(diff > 1e-2, "{diff}");

    // Positions that do not fit the blocks are an error naming them.
    let source = StoreSource::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let bad = WanHints {
        heads: Some(2),
        vace_layers: Some(vec![0, 5]),
    };
    let e = WanConfig::detect(&loader.root(""), bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("[0, 5]"), "{e}");
}

fn wan(name: &str) -> PathBuf {
    fixture_path("wan").join(name)
}

fn sd_cli(out: &Path, extra: &[&str]) -> std::process::Output {
    let dir = fixture_path("wan_vace");
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "vid_gen"])
        .args([
            "--diffusion-model",
            s(&dir.join("transformer/diffusion_pytorch_model.safetensors")),
        ])
        .args(["--t5xxl", s(&wan("text_encoder/model.safetensors"))])
        .args([
            "--t5xxl-tokenizer",
            s(&fixture_path(
                "../../../shared/tokenizers/t5-v1_1.tokenizer.json",
            )),
        ])
        .args(["--vae", s(&wan("vae/diffusion_pytorch_model.safetensors"))])
        .args(["-p", PROMPT, "--steps", "4", "--cfg-scale", "5"])
        .args(["-W", "64", "-H", "48", "--video-frames", "9"])
        .args(["-s", "42", "--rng", "cpu", "-t", "2"])
        .args(extra)
        .args(["-o", s(out)])
        .output()
        .unwrap()
}

/// PSNR of the frames `dir/frame_NN.png` against reference `name` [F, 3, H, W].
fn video_psnr(dir: &Path, name: &str) -> f64 {
    let r = open_fixture("wan_vace/reference.safetensors");
    let v = tensor(&r, name);
    let [w, h, c, f] = v.ne;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for i in 0..f {
        let one = HostTensor {
            ne: [w, h, c, 1],
            data: v.data[i * w * h * c..(i + 1) * w * h * c].to_vec(),
        };
        want.extend(image_bytes(&one));
        let img = read_png(&dir.join(format!("frame_{i:02}.png"))).unwrap();
        assert_eq!((img.width as usize, img.height as usize), (w, h));
        got.extend(img.data);
    }
    assert!(
        !dir.join(format!("frame_{f:02}.png")).exists(),
        "{f} frames"
    );
    psnr(&got, &want)
}

#[test]
fn control_video_and_reference_match_the_vace_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture_path("wan_vace");
    let o = sd_cli(
        &tmp.path().join("frame_%02d.png"),
        &[
            "--control-video",
            s(&dir.join("control")),
            "-i",
            s(&dir.join("ref.png")),
            "--vace-strength",
            "0.8",
            "-v",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("VACE control (6 frames, 1 reference)"),
        "{err}"
    );
    let text = png_parameters(&tmp.path().join("frame_04.png"));
    for want in ["Frames: 9, FPS: 16", "VACE strength: 0.800000, Version"] {
        assert!(text.contains(want), "{want:?} not in {text:?}");
    }
    let p = video_psnr(tmp.path(), "video_vace");
    eprintln!("Wan VACE control + reference, 9 frames vs diffusers: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(55.0), "PSNR {p:.1} dB");
}

#[test]
fn vace_text_to_video_matches_the_vace_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let o = sd_cli(&tmp.path().join("frame_%02d.png"), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = png_parameters(&tmp.path().join("frame_00.png"));
    assert!(text.contains("VACE strength: 1.000000"), "{text:?}");
    let p = video_psnr(tmp.path(), "video_t2v");
    eprintln!("Wan VACE text-to-video, 9 frames vs diffusers: PSNR {p:.1} dB");
    assert!(p >= device::psnr_floor(55.0), "PSNR {p:.1} dB");

    // VACE has no last frame; a non-VACE Wan model warns that it ignores a control video.
    let o = sd_cli(
        &tmp.path().join("x.avi"),
        &["--end-img", s(&fixture_path("wan_vace/ref.png"))],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not supported by Wan VACE models"), "{err}");
}
