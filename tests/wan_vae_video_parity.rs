//! Video (multi-frame) decode and encode of the Wan 2.1 VAE against diffusers'
//! `AutoencoderKLWan`, in both weight layouts, plus the one-frame ↔ image-path equality and
//! bad inputs. Fixtures: tests/reference/wan_vae_video_fixtures.py → tests/fixtures/wan_vae_video/
//! (model A: four levels, z 16, temporal levels as released, 3-frame latent 3×2 ↔ 9 frames
//! 24×16; model B: three levels, both temporal, z 4, 3-frame latent 2×3 ↔ 9 frames 8×12).
//! Tolerance: max abs error ≤ 1e-4 × max(1, |reference|) in f32.

mod common;

use common::*;
use sd_cli::models::vae::wan_vae::{LatentStats, WanVae, WanVaeConfig, WanVaeLayout};
use sd_cli::models::vae::Vae;
use sd_cli::runner::{MemoryOptions, RunOptions, Runner, StoreSource, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

// ggml's CPU kernels are built for the build machine: AVX-512 and AVX2 builds sum in different
// orders (3.4e-5 seen on an AVX-512 Zen 4, under 3e-5 on AVX2).
const TOL: f32 = 1e-4;

fn weights(dir: &str, model: &str, layout: WanVaeLayout) -> TensorStore {
    let file = match layout {
        WanVaeLayout::Diffusers => format!("{dir}/{model}/diffusion_pytorch_model.safetensors"),
        WanVaeLayout::Original => format!("{dir}/{model}_original.safetensors"),
    };
    let mut store = TensorStore::new();
    store
        .add_file(&fixture_path(&file), Component::Vae.prefix())
        .unwrap();
    store
}

fn io(name: &str) -> HostTensor {
    tensor(&open_fixture("wan_vae_video/io.safetensors"), name)
}

/// The VAE of `store` (video weights when `video`) on a CPU runner with `options`.
fn load(store: &TensorStore, video: bool, options: RunOptions) -> (WanVae, Runner) {
    let source = StoreSource::new(store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let mut config = WanVaeConfig::detect(&loader.root("")).unwrap();
    assert!(!config.video, "detection leaves video off");
    config.video = video;
    let vae = WanVae::new(&loader.root(""), config).unwrap();
    let backend = cpu();
    let w = loader.finish(&backend, "wan_vae").unwrap();
    (vae, Runner::new("wan_vae", backend, Some(w), options))
}

fn load_video(model: &str, layout: WanVaeLayout) -> (WanVae, Runner) {
    let store = weights("wan_vae_video", model, layout);
    load(&store, true, RunOptions::default())
}

fn check(model: &str, layout: WanVaeLayout) {
    let (vae, runner) = load_video(model, layout);
    assert_eq!((vae.decode_time_factor(), vae.encode_time_factor()), (4, 4));
    let what = format!("model {model}, {layout:?}");
    let z = io(&format!("{model}.decode.z"));
    let decoded = vae.decode_video(&runner, &z).unwrap();
    assert_eq!(decoded.ne[2], vae.video_frames(3));
    assert_close(
        &format!("{what} video decode (9 frames)"),
        &decoded,
        &io(&format!("{model}.decode.clamped")),
        TOL,
    );
    let x = io(&format!("{model}.encode.x"));
    assert_eq!(vae.latent_frames(x.ne[2]).unwrap(), 3);
    assert_close(
        &format!("{what} video encode (posterior mean, 3 latent frames)"),
        &vae.encode_video(&runner, &x).unwrap(),
        &io(&format!("{model}.encode.mean")),
        TOL,
    );
    assert_eq!(runner.cache_bytes(), 0, "the video caches are freed");
}

#[test]
fn model_a_diffusers_layout_matches_diffusers() {
    check("a", WanVaeLayout::Diffusers);
}

#[test]
fn model_a_original_layout_matches_diffusers() {
    check("a", WanVaeLayout::Original);
}

#[test]
fn model_b_diffusers_layout_matches_diffusers() {
    check("b", WanVaeLayout::Diffusers);
}

#[test]
fn model_b_original_layout_matches_diffusers() {
    check("b", WanVaeLayout::Original);
}

/// Frame `k` of a clip [W, H, F, C] as an image batch [W, H, C, 1].
fn frame(clip: &HostTensor, k: usize) -> HostTensor {
    let [w, h, f, c] = clip.ne;
    let plane = w * h;
    let data = (0..c)
        .flat_map(|ch| clip.data[(ch * f + k) * plane..(ch * f + k + 1) * plane].to_vec())
        .collect();
    HostTensor::new([w, h, c, 1], data).unwrap()
}

#[test]
fn one_frame_video_equals_the_image_path() {
    for layout in [WanVaeLayout::Diffusers, WanVaeLayout::Original] {
        let (vae, runner) = load_video("a", layout);
        let z = frame(&io("a.decode.z"), 0);
        let image = runner
            .compute(|g| vec![vae.decode(g, g.input_f32("z", z.ne, z.data.clone()))])
            .unwrap()
            .remove(0);
        let [w, h, c, _] = z.ne;
        let clip = HostTensor::new([w, h, 1, c], z.data.clone()).unwrap();
        let video = vae.decode_video(&runner, &clip).unwrap();
        let [vw, vh, vf, vc] = video.ne;
        assert_eq!(vf, 1);
        let video = HostTensor::new([vw, vh, vc, 1], video.data).unwrap();
        assert_eq!(max_abs_diff(&video, &image), 0.0, "{layout:?} decode");

        let x = frame(&io("a.encode.x"), 0);
        let image = runner
            .compute(|g| vec![vae.encode(g, g.input_f32("x", x.ne, x.data.clone()))])
            .unwrap()
            .remove(0);
        let [w, h, c, _] = x.ne;
        let clip = HostTensor::new([w, h, 1, c], x.data.clone()).unwrap();
        let video = vae.encode_video(&runner, &clip).unwrap();
        let [vw, vh, vf, vc] = video.ne;
        assert_eq!(vf, 1);
        let video = HostTensor::new([vw, vh, vc, 1], video.data).unwrap();
        assert_eq!(max_abs_diff(&video, &image), 0.0, "{layout:?} encode");
    }
}

#[test]
fn segmented_chunks_match_diffusers() {
    // Every chunk graph forced into segments at the cut marks: the cached frames still flow.
    let store = weights("wan_vae_video", "a", WanVaeLayout::Original);
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let (vae, runner) = load(&store, true, options);
    let decoded = vae.decode_video(&runner, &io("a.decode.z")).unwrap();
    let report = runner.last_report().expect("a planned run");
    assert!(report.segmented && report.segments.len() >= 2, "{report:?}");
    assert_close(
        "segmented video decode",
        &decoded,
        &io("a.decode.clamped"),
        TOL,
    );
    assert_close(
        "segmented video encode",
        &vae.encode_video(&runner, &io("a.encode.x")).unwrap(),
        &io("a.encode.mean"),
        TOL,
    );
}

#[test]
fn video_weights_load_only_when_asked() {
    let store = weights("wan_vae_video", "a", WanVaeLayout::Diffusers);
    let (image_vae, image_runner) = load(&store, false, RunOptions::default());
    let (video_vae, video_runner) = load(&store, true, RunOptions::default());
    let count = |r: &Runner| r.weights().unwrap().len();
    // Two temporal downsamplers and two upsamplers, each a weight and a bias.
    assert_eq!(count(&video_runner), count(&image_runner) + 8);
    assert!(!image_vae.has_video() && video_vae.has_video());
    // The image-only VAE refuses video with an error, and so does the `Vae` interface.
    let z = io("a.decode.z");
    let err = image_vae.decode_video(&image_runner, &z).unwrap_err();
    assert!(err.to_string().contains("video"), "{err}");
    assert!(Vae::decode_video(&image_vae, &image_runner, &z)
        .expect("a video VAE")
        .is_err());
    let via_trait = Vae::decode_video(&video_vae, &video_runner, &z)
        .expect("a video VAE")
        .unwrap();
    assert_close(
        "Vae::decode_video",
        &via_trait,
        &io("a.decode.clamped"),
        TOL,
    );
}

#[test]
fn latent_statistics_from_config_json() {
    let path = fixture_path("wan_vae_video/b/config.json");
    let json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let stats = LatentStats::from_diffusers_config(&json).unwrap().unwrap();
    assert_eq!(stats.channels(), 4);
    assert_eq!(stats.mean()[0], -0.6);
    assert_eq!(stats.std()[3], 1.7);
}

#[test]
fn bad_video_inputs_are_errors() {
    let (vae, runner) = load_video("a", WanVaeLayout::Diffusers);
    let x = io("a.encode.x");
    let [w, h, _, c] = x.ne;
    let plane = w * h;
    // 6 frames is not 1 + 4k.
    let six = HostTensor::new([w, h, 6, c], vec![0.0; plane * 6 * c]).unwrap();
    let err = vae.encode_video(&runner, &six).unwrap_err().to_string();
    assert!(err.contains("6 frames") && err.contains("1 + 4k"), "{err}");
    assert!(vae.latent_frames(0).is_err() && vae.latent_frames(8).is_err());
    assert_eq!(vae.latent_frames(1).unwrap(), 1);
    assert_eq!(vae.latent_frames(17).unwrap(), 5);
    // A size that is not a multiple of 8.
    let odd = HostTensor::new([w - 4, h, 5, c], vec![0.0; (w - 4) * h * 5 * c]).unwrap();
    assert!(vae.encode_video(&runner, &odd).is_err());
    // Wrong channel counts, an empty latent, data that does not fit the shape.
    let rgba = HostTensor::new([w, h, 5, 4], vec![0.0; plane * 5 * 4]).unwrap();
    assert!(vae.encode_video(&runner, &rgba).is_err());
    let z = io("a.decode.z");
    let [zw, zh, _, zc] = z.ne;
    let narrow = HostTensor::new([zw, zh, 2, 8], vec![0.0; zw * zh * 2 * 8]).unwrap();
    assert!(vae.decode_video(&runner, &narrow).is_err());
    let empty = HostTensor::new([zw, zh, 0, zc], Vec::new()).unwrap();
    assert!(vae.decode_video(&runner, &empty).is_err());
    let torn = HostTensor {
        ne: [zw, zh, 3, zc],
        data: vec![0.0; 5],
    };
    assert!(vae.decode_video(&runner, &torn).is_err());
    assert_eq!(runner.cache_bytes(), 0);
}

#[test]
fn image_only_checkpoints_cannot_load_for_video() {
    // The image fixtures keep most causal kernels as their last temporal tap only.
    let store = weights("wan_vae", "a", WanVaeLayout::Original);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let mut config = WanVaeConfig::detect(&loader.root("")).unwrap();
    config.video = true;
    let err = WanVae::new(&loader.root(""), config)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("temporal taps") && err.contains("encoder.conv1.weight"),
        "{err}"
    );

    // Whole kernels but no time_conv anywhere: an error naming the missing weight.
    let store = weights("wan_vae_video", "b", WanVaeLayout::Diffusers);
    let hidden = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
    };
    let loader = WeightLoader::new(&hidden, None);
    let mut config = WanVaeConfig::detect(&loader.root("")).unwrap();
    config.video = true;
    let err = WanVae::new(&loader.root(""), config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("time_conv"), "{err}");
    // The same file still loads for images.
    let loader = WeightLoader::new(&hidden, None);
    let config = WanVaeConfig::detect(&loader.root("")).unwrap();
    assert!(WanVae::new(&loader.root(""), config).is_ok());
}

/// A source without any `time_conv` weight.
struct Hiding<'a> {
    inner: StoreSource<'a>,
}

impl sd_cli::runner::WeightSource for Hiding<'_> {
    fn tensor(&self, name: &str) -> Option<sd_cli::runner::SourceTensor<'_>> {
        if name.contains("time_conv") {
            None
        } else {
            self.inner.tensor(name)
        }
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}
