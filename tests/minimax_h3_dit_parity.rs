//! Parity of the MiniMax-H3 transformer with diffusers `MiniMaxH3Transformer3DModel` on packed
//! sequences laid out by diffusers' own pipeline steps, in both checkpoint layouts, and of the
//! pruned (AdaLN curve-table) variant. Fixtures: tests/reference/minimax_h3_dit_fixtures.py →
//! tests/fixtures/minimax_h3_dit/ (2 heads × 32 with 24 channels rotated, hidden 48, 2 + 2
//! blocks, 6 video / 5 audio channels, text dim 24).
//! Tolerances: outputs within 2e-5 × max(1, max |reference|) in f32; our layout's positions
//! within 1e-5 of diffusers' (f64 grids rounded to f32) and the same timestep on every row;
//! segmented runs equal monolithic ones exactly.

mod common;

use common::*;
use sd_cli::models::dit::minimax_h3::{
    self, Keyframe, LayoutRequest, MiniMaxH3, MiniMaxH3Config, MiniMaxH3Hints, MiniMaxH3Inputs,
    MiniMaxH3Layout, MiniMaxH3Time, PackedLayout,
};
use sd_cli::runner::{
    MemoryOptions, RunOptions, Runner, RunnerError, StoreSource, WeightLoader, WeightSource,
};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const TOL: f32 = 2e-5;
const PREFIX: &str = "model.diffusion_model.";

fn hints() -> MiniMaxH3Hints {
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture_path("minimax_h3_dit/diffusers/config.json")).unwrap(),
    )
    .unwrap();
    MiniMaxH3Hints::from_config(&config)
}

fn diffusers_store() -> TensorStore {
    open_fixture("minimax_h3_dit/diffusers/diffusion_pytorch_model.safetensors")
}

fn assembled(stem: &str, tmp: &std::path::Path) -> TensorStore {
    let path = assemble_checkpoint(&fixture_path("minimax_h3_dit"), stem, tmp);
    TensorStore::open(&path).unwrap()
}

fn load_with(
    source: &dyn WeightSource,
    hints: &MiniMaxH3Hints,
    options: RunOptions,
) -> Result<(MiniMaxH3, Runner), RunnerError> {
    let backend = cpu();
    let loader = WeightLoader::new(source, None);
    let config = MiniMaxH3Config::detect(&loader.root(""), hints)?;
    let model = MiniMaxH3::new(&loader.root(""), config)?;
    let weights = loader.finish(&backend, "minimax_h3")?;
    Ok((
        model,
        Runner::new("minimax_h3", backend, Some(weights), options),
    ))
}

fn load(store: &TensorStore, prefix: &str, hints: &MiniMaxH3Hints) -> (MiniMaxH3, Runner) {
    load_with(
        &StoreSource::new(store, prefix),
        hints,
        RunOptions::default(),
    )
    .unwrap()
}

struct Case {
    video: HostTensor,
    audio: HostTensor,
    text: HostTensor,
    layout: PackedLayout,
    positions: HostTensor,
    timestep_rows: HostTensor,
    video_out: HostTensor,
    audio_out: HostTensor,
}

fn case(name: &str) -> Case {
    let store = open_fixture("minimax_h3_dit/cases.safetensors");
    let get = |what: &str| tensor(&store, &format!("{name}.{what}"));
    let p = get("params").data;
    let tags: Vec<u8> = get("tags").data.iter().map(|&t| t as u8).collect();
    let keyframes = [
        &[][..],
        &[Keyframe::First],
        &[Keyframe::First, Keyframe::Last],
    ][p[4] as usize];
    let layout = minimax_h3::layout::build(&LayoutRequest {
        text_tags: &tags,
        latent_frames: p[0] as usize,
        latent_height: p[1] as usize,
        latent_width: p[2] as usize,
        patch: [1, 2, 2],
        audio_latents: p[3] as usize,
        keyframes,
        references: &[],
        video_t: p[5],
        audio_t: p[6],
    })
    .expect("a valid layout");
    Case {
        video: get("video"),
        audio: get("audio"),
        text: get("text"),
        layout,
        positions: get("positions"),
        timestep_rows: get("timestep_rows"),
        video_out: get("video_out"),
        audio_out: get("audio_out"),
    }
}

fn try_run(m: &MiniMaxH3, r: &Runner, c: &Case) -> Result<Vec<HostTensor>, RunnerError> {
    let mut err = None;
    let out = r.compute(|g| {
        let inputs = MiniMaxH3Inputs {
            video: g.input_f32("video", c.video.ne, c.video.data.clone()),
            audio: g.input_f32("audio", c.audio.ne, c.audio.data.clone()),
            text: Some(g.input_f32("text", c.text.ne, c.text.data.clone())),
            layout: &c.layout,
            text_cache: None,
        };
        match m.forward(g, &inputs) {
            Ok(o) => vec![o.video, o.audio],
            Err(e) => {
                err = Some(e);
                vec![g.input_f32("unused", [1, 1, 1, 1], vec![0.0])]
            }
        }
    })?;
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn check(m: &MiniMaxH3, r: &Runner, name: &str, what: &str) -> Vec<HostTensor> {
    let c = case(name);
    let out = try_run(m, r, &c).unwrap();
    assert_close(
        &format!("{name} video ({what})"),
        &out[0],
        &c.video_out,
        TOL,
    );
    assert_close(
        &format!("{name} audio ({what})"),
        &out[1],
        &c.audio_out,
        TOL,
    );
    out
}

#[test]
fn layout_matches_diffusers() {
    for name in ["t2va", "fl2va", "grid"] {
        let c = case(name);
        let l = &c.layout;
        assert_eq!(c.positions.ne, [3, l.len(), 1, 1], "{name}: rows");
        let mut worst = 0f32;
        for (i, p) in l.positions.iter().enumerate() {
            for (a, &v) in p.iter().enumerate() {
                worst = worst.max((v - c.positions.data[3 * i + a]).abs());
            }
        }
        assert!(worst <= 1e-5, "{name}: positions differ by {worst}");
        assert_eq!(
            l.row_timesteps(),
            c.timestep_rows.data,
            "{name}: row timesteps"
        );
    }
}

#[test]
fn diffusers_layout_matches_reference() {
    let h = hints();
    let store = diffusers_store();
    let (m, r) = load(&store, "", &h);
    let c = m.config();
    assert_eq!(c.layout, MiniMaxH3Layout::Diffusers);
    assert_eq!(
        (
            c.hidden,
            c.heads,
            c.head_dim,
            c.ffn,
            c.layers,
            c.refiner_layers
        ),
        (48, 2, 32, 40, 2, 2)
    );
    assert_eq!((c.video_channels, c.audio_channels, c.text_dim), (6, 5, 24));
    assert_eq!(c.rope_freq_dim, 4);
    for name in ["t2va", "fl2va", "grid"] {
        check(&m, &r, name, "diffusers names");
    }
}

#[test]
fn original_layout_matches_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let single = assembled("single", tmp.path());
    // No config.json: rope frequencies from `rope.inv_freq`, the rest released defaults.
    let (m, r) = load(&single, PREFIX, &MiniMaxH3Hints::default());
    assert_eq!(m.config().layout, MiniMaxH3Layout::Original);
    assert_eq!(m.config().rope_freq_dim, 4);
    for name in ["t2va", "fl2va", "grid"] {
        check(&m, &r, name, "original names");
    }
}

#[test]
fn without_config_the_rotated_channels_follow_the_released_rule() {
    // The diffusers file alone (no config.json, no rope.inv_freq): 3/4 of the 32-wide heads
    // rotate, 4 frequencies per axis, as the fixture's config says.
    let store = diffusers_store();
    let (m, r) = load(&store, "", &MiniMaxH3Hints::default());
    assert_eq!(m.config().rope_freq_dim, 4);
    check(&m, &r, "t2va", "diffusers names, no config.json");
}

#[test]
fn pruned_curve_table_matches_on_its_grid() {
    let tmp = tempfile::tempdir().unwrap();
    let pruned = assembled("pruned", tmp.path());
    let (m, r) = load(&pruned, PREFIX, &MiniMaxH3Hints::default());
    assert_eq!(m.config().time, MiniMaxH3Time::CurveTable { grid: 11 });
    // Every timestep of this case lies on the table's grid: the unpruned model's output.
    check(&m, &r, "grid", "curve table");
    // Between grid points the table interpolates: close to, not equal to, the time MLP.
    let c = case("t2va");
    let out = try_run(&m, &r, &c).unwrap();
    let err = max_abs_diff(&out[0], &c.video_out);
    assert!(err > 1e-6 && err < 0.5, "interpolated table error {err}");
}

#[test]
fn cached_text_gives_the_same_outputs() {
    let store = diffusers_store();
    let (m, r) = load(&store, "", &hints());
    let c = case("t2va");
    let plain = try_run(&m, &r, &c).unwrap();
    let cached = |r: &Runner| {
        r.compute(|g| {
            let inputs = MiniMaxH3Inputs {
                video: g.input_f32("video", c.video.ne, c.video.data.clone()),
                audio: g.input_f32("audio", c.audio.ne, c.audio.data.clone()),
                text: Some(g.input_f32("text", c.text.ne, c.text.data.clone())),
                layout: &c.layout,
                text_cache: Some("minimax_h3.ctx.cond"),
            };
            let o = m.forward(g, &inputs).unwrap();
            vec![o.video, o.audio]
        })
        .unwrap()
    };
    // First call stores, second reuses: both equal the uncached run.
    assert_eq!(cached(&r), plain);
    assert!(r.cache_info("minimax_h3.ctx.cond").is_some());
    assert_eq!(cached(&r), plain);
    r.clear_cache("minimax_h3.ctx.");
    assert!(r.cache_info("minimax_h3.ctx.cond").is_none());
}

#[test]
fn curve_points_interpolate_and_clamp() {
    let (lo, hi, frac) = minimax_h3::curve_points(&[0.0, 0.25, 1.0, 1.5, -1.0], 5);
    assert_eq!(lo, vec![0, 1, 3, 3, 0]);
    assert_eq!(hi, vec![1, 2, 4, 4, 1]);
    assert_eq!(frac, vec![0.0, 0.0, 1.0, 1.0, 0.0]);
}

#[test]
fn segmented_run_matches_monolithic() {
    let h = hints();
    let store = diffusers_store();
    let (m, r) = load(&store, "", &h);
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let (ms, rs) = load_with(&StoreSource::new(&store, ""), &h, options).unwrap();
    let c = case("fl2va");
    let a = try_run(&m, &r, &c).unwrap();
    let b = try_run(&ms, &rs, &c).unwrap();
    let report = rs.last_report().expect("a planned run");
    // condition_proj, 2 refiner blocks, 2 blocks: 5 cuts, 6 segments at most.
    assert!(report.segmented && report.segments.len() >= 5, "{report:?}");
    let names: Vec<&str> = report.segments.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"minimax_h3.condition_proj")
            && names.contains(&"minimax_h3.token_refiner.blocks.1"),
        "{names:?}"
    );
    assert_eq!(a, b, "segmented vs monolithic");
}

#[test]
fn missing_tensor_is_an_error_naming_it() {
    let store = diffusers_store();
    for missing in [
        "transformer_blocks.1.adaln_proj.linear.weight",
        "token_refiner.final_norm.weight",
        "norm_out.linear.bias",
        "time_embedder.linear_2.weight",
    ] {
        let source = Without {
            inner: StoreSource::new(&store, ""),
            missing,
        };
        match load_with(&source, &hints(), RunOptions::default()) {
            Err(RunnerError::MissingTensor { key, .. }) => assert_eq!(key, missing),
            Err(e) => panic!("{missing}: wrong error {e}"),
            Ok(_) => panic!("loaded without {missing}"),
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    let store = diffusers_store();
    let (m, r) = load(&store, "", &hints());
    let wrong_rows = Case {
        video: HostTensor::zeros([24, 5, 1, 1]),
        ..case("t2va")
    };
    assert!(try_run(&m, &r, &wrong_rows).is_err());
    let wrong_text = Case {
        text: HostTensor::zeros([23, 9, 1, 1]),
        ..case("t2va")
    };
    assert!(try_run(&m, &r, &wrong_text).is_err());
}

#[test]
fn patchify_round_trips() {
    let data: Vec<f32> = (0..6 * 3 * 4 * 8).map(|i| i as f32).collect();
    let latent = HostTensor::new([8, 4, 3, 6], data).unwrap();
    let rows = minimax_h3::patchify(&latent, [1, 2, 2]);
    assert_eq!(rows.ne, [24, 3 * 2 * 4, 1, 1]);
    // Row 1 is frame 0, patch row 0, patch column 1; feature 1 is channel 0, (0, 1).
    assert_eq!(rows.data[24 + 1], latent.data[3]);
    let back = minimax_h3::unpatchify(&rows, 6, [3, 4, 8], [1, 2, 2]);
    assert_eq!(back, latent);
}
