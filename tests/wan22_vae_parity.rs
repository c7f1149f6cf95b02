//! Parity of the Wan 2.2 VAE (image and video decode/encode, detection, statistics) against
//! diffusers' `AutoencoderKLWan(is_residual=True, patch_size=2)`, in both weight layouts, plus
//! the one-frame video ↔ image-path equality and bad inputs.
//! Fixtures: tests/reference/wan22_vae_fixtures.py → tests/fixtures/wan22_vae/ (a tiny random
//! four-level model: encoder widths 3, 3, 6, 6, 3, decoder widths 2, 2, 4, 4, 2, z 6, temporal
//! levels as released; images: batch of two 2×2 latents ↔ 32×32; video: 3-frame 1×2 latent ↔
//! 9 frames 16×32; a diffusers folder with statistics in config.json and an original-names
//! single file with whole Conv3d kernels and some flat gammas).
//! Tolerance: max abs error ≤ 3e-5 × max(1, |reference|) in f32 (measured ≤ 7.3e-6 decoding,
//! ≤ 4.5e-7 encoding; diffusers' own f32 video decode is 1.2e-5 from its f64 result).

mod common;

use common::*;
use sd_cli::models::vae::wan22_vae::{
    LatentStats, Wan22Vae, Wan22VaeConfig, Wan22VaeLayout, LATENTS_MEAN, LATENTS_STD,
};
use sd_cli::models::vae::Vae;
use sd_cli::runner::{
    MemoryOptions, MemorySource, RunOptions, Runner, SourceTensor, StoreSource, WeightLoader,
    WeightSource,
};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

const TOL: f32 = 3e-5;

fn weights(layout: Wan22VaeLayout) -> TensorStore {
    let file = match layout {
        Wan22VaeLayout::Diffusers => "wan22_vae/diffusers/diffusion_pytorch_model.safetensors",
        Wan22VaeLayout::Original => "wan22_vae/original.safetensors",
    };
    let mut store = TensorStore::new();
    store
        .add_file(&fixture_path(file), Component::Vae.prefix())
        .unwrap();
    store
}

fn io(name: &str) -> HostTensor {
    tensor(&open_fixture("wan22_vae/io.safetensors"), name)
}

/// A source that hides the tensors `hide` selects (a checkpoint with weights stripped).
struct Hiding<'a> {
    inner: StoreSource<'a>,
    hide: fn(&str) -> bool,
}

impl WeightSource for Hiding<'_> {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        if (self.hide)(name) {
            None
        } else {
            self.inner.tensor(name)
        }
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// The VAE of `source` with the detected config changed by `adjust`, on a CPU runner.
fn load_from(
    source: &dyn WeightSource,
    options: RunOptions,
    adjust: impl FnOnce(&mut Wan22VaeConfig),
) -> Result<(Wan22Vae, Runner), sd_cli::runner::RunnerError> {
    let loader = WeightLoader::new(source, None);
    let mut config = Wan22VaeConfig::detect(&loader.root(""))?;
    adjust(&mut config);
    let vae = Wan22Vae::new(&loader.root(""), config)?;
    let backend = cpu();
    let w = loader.finish(&backend, "wan22_vae").unwrap();
    Ok((vae, Runner::new("wan22_vae", backend, Some(w), options)))
}

fn load(store: &TensorStore, video: bool, options: RunOptions) -> (Wan22Vae, Runner) {
    let source = StoreSource::new(store, Component::Vae.prefix());
    load_from(&source, options, |c| c.video = video).unwrap()
}

fn load_video(layout: Wan22VaeLayout) -> (Wan22Vae, Runner) {
    load(&weights(layout), true, RunOptions::default())
}

fn image_decode(vae: &Wan22Vae, runner: &Runner, z: &HostTensor) -> HostTensor {
    runner
        .compute(|g| vec![vae.decode(g, g.input_f32("z", z.ne, z.data.clone()))])
        .unwrap()
        .remove(0)
}

fn image_encode(vae: &Wan22Vae, runner: &Runner, x: &HostTensor) -> HostTensor {
    runner
        .compute(|g| vec![vae.encode(g, g.input_f32("x", x.ne, x.data.clone()))])
        .unwrap()
        .remove(0)
}

fn check_config(config: &Wan22VaeConfig, layout: Wan22VaeLayout) {
    assert_eq!(config.layout, layout);
    assert_eq!(config.encoder_channels, vec![3, 3, 6, 6, 3]);
    assert_eq!(config.decoder_channels, vec![2, 2, 4, 4, 2]);
    assert_eq!(config.res_blocks, 1);
    assert_eq!(config.temporal_down, vec![false, true, true, false]);
    assert_eq!(config.temporal_up, vec![true, true, false, false]);
    assert_eq!(
        (config.in_channels, config.out_channels, config.z_dim),
        (12, 12, 6)
    );
    assert_eq!((config.patch_size, config.image_channels()), (2, 3));
    assert!(config.encoder && config.decoder && !config.video);
    assert_eq!(config.latent_stats, None, "only z 48 has built-in stats");
    assert_eq!(config.scale_factor(), 16);
}

fn check_layout(layout: Wan22VaeLayout) {
    let store = weights(layout);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    check_config(&Wan22VaeConfig::detect(&loader.root("")).unwrap(), layout);

    let (vae, runner) = load_video(layout);
    assert_eq!(vae.scale_factor(), 16);
    assert_eq!((vae.decode_time_factor(), vae.encode_time_factor()), (4, 4));

    let decoded = image_decode(&vae, &runner, &io("image.decode.z"));
    assert_eq!(decoded.ne, [32, 32, 3, 2]);
    assert_close(
        &format!("{layout:?} image decode"),
        &decoded,
        &io("image.decode.out"),
        TOL,
    );
    let encoded = image_encode(&vae, &runner, &io("image.encode.x"));
    assert_eq!(encoded.ne, [2, 2, 6, 2]);
    assert_close(
        &format!("{layout:?} image encode"),
        &encoded,
        &io("image.encode.mean"),
        TOL,
    );

    let z = io("video.decode.z");
    assert_eq!(z.ne, [1, 2, 3, 6]);
    let decoded = vae.decode_video(&runner, &z).unwrap();
    assert_eq!(decoded.ne, [16, 32, 9, 3]);
    assert_eq!(vae.video_frames(3), 9);
    assert_close(
        &format!("{layout:?} video decode (9 frames)"),
        &decoded,
        &io("video.decode.out"),
        TOL,
    );
    let x = io("video.encode.x");
    assert_eq!(vae.latent_frames(x.ne[2]).unwrap(), 3);
    assert_close(
        &format!("{layout:?} video encode (3 latent frames)"),
        &vae.encode_video(&runner, &x).unwrap(),
        &io("video.encode.mean"),
        TOL,
    );
    assert_eq!(runner.cache_bytes(), 0, "the video caches are freed");
}

#[test]
fn diffusers_layout_matches_diffusers() {
    check_layout(Wan22VaeLayout::Diffusers);
}

#[test]
fn original_layout_matches_diffusers() {
    check_layout(Wan22VaeLayout::Original);
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

/// An image batch [W, H, C, 1] as a one-frame clip [W, H, 1, C] (the same values).
fn as_clip(image: &HostTensor) -> HostTensor {
    let [w, h, c, _] = image.ne;
    HostTensor::new([w, h, 1, c], image.data.clone()).unwrap()
}

#[test]
fn one_frame_video_equals_the_image_path() {
    for layout in [Wan22VaeLayout::Diffusers, Wan22VaeLayout::Original] {
        let (vae, runner) = load_video(layout);
        let z = frame(&io("video.decode.z"), 0);
        let image = image_decode(&vae, &runner, &z);
        let video = vae.decode_video(&runner, &as_clip(&z)).unwrap();
        assert_eq!(video.ne[2], 1);
        assert_eq!(
            max_abs_diff(&frame(&video, 0), &image),
            0.0,
            "{layout:?} decode"
        );
        // Causal: the first frame of the whole clip's decode is the one-frame decode.
        assert_close(
            "first video frame",
            &image,
            &frame(&io("video.decode.out"), 0),
            TOL,
        );

        let x = frame(&io("video.encode.x"), 0);
        let image = image_encode(&vae, &runner, &x);
        let video = vae.encode_video(&runner, &as_clip(&x)).unwrap();
        assert_eq!(video.ne[2], 1);
        assert_eq!(
            max_abs_diff(&frame(&video, 0), &image),
            0.0,
            "{layout:?} encode"
        );
        assert_close(
            "first latent frame",
            &image,
            &frame(&io("video.encode.mean"), 0),
            TOL,
        );
    }
}

#[test]
fn segmented_chunks_match_diffusers() {
    // Every chunk graph forced into segments at the cut marks: the cached frames still flow.
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let (vae, runner) = load(&weights(Wan22VaeLayout::Original), true, options);
    let decoded = vae.decode_video(&runner, &io("video.decode.z")).unwrap();
    let report = runner.last_report().expect("a planned run");
    assert!(report.segmented && report.segments.len() >= 2, "{report:?}");
    assert_close(
        "segmented video decode",
        &decoded,
        &io("video.decode.out"),
        TOL,
    );
    assert_close(
        "segmented video encode",
        &vae.encode_video(&runner, &io("video.encode.x")).unwrap(),
        &io("video.encode.mean"),
        TOL,
    );
}

#[test]
fn image_loads_skip_the_temporal_weights_and_refuse_video() {
    let store = weights(Wan22VaeLayout::Diffusers);
    let (image_vae, image_runner) = load(&store, false, RunOptions::default());
    let (_, video_runner) = load(&store, true, RunOptions::default());
    let count = |r: &Runner| r.weights().unwrap().len();
    // Two temporal downsamplers and two upsamplers, each a weight and a bias.
    assert_eq!(count(&video_runner), count(&image_runner) + 8);
    assert!(!image_vae.has_video());
    // Images need no temporal weights.
    assert_close(
        "image-only decode",
        &image_decode(&image_vae, &image_runner, &io("image.decode.z")),
        &io("image.decode.out"),
        TOL,
    );
    let z = io("video.decode.z");
    let err = image_vae.decode_video(&image_runner, &z).unwrap_err();
    assert!(err.to_string().contains("video"), "{err}");
    assert!(Vae::decode_video(&image_vae, &image_runner, &z)
        .expect("a video VAE")
        .is_err());
    let err = image_vae
        .encode_video(&image_runner, &io("video.encode.x"))
        .unwrap_err();
    assert!(err.to_string().contains("images only"), "{err}");
}

#[test]
fn decoder_only_and_encoder_only_files() {
    let store = weights(Wan22VaeLayout::Original);
    let dec_only = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |name| name.starts_with("encoder.") || name.starts_with("conv1."),
    };
    let (vae, runner) = load_from(&dec_only, RunOptions::default(), |c| {
        assert!(!c.encoder && c.decoder);
        assert_eq!(c.encoder_channels, Vec::<usize>::new());
        c.video = true;
    })
    .unwrap();
    assert!(!vae.has_encoder() && vae.has_decoder());
    assert_eq!(Vae::image_channels(&vae), 3);
    assert_close(
        "decoder-only video decode",
        &vae.decode_video(&runner, &io("video.decode.z")).unwrap(),
        &io("video.decode.out"),
        TOL,
    );
    let err = vae
        .encode_video(&runner, &io("video.encode.x"))
        .unwrap_err();
    assert!(err.to_string().contains("without its encoder"), "{err}");

    let enc_only = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |name| name.starts_with("decoder.") || name.starts_with("conv2."),
    };
    let (vae, runner) = load_from(&enc_only, RunOptions::default(), |c| c.video = true).unwrap();
    assert!(vae.has_encoder() && !vae.has_decoder());
    assert_close(
        "encoder-only image encode",
        &image_encode(&vae, &runner, &io("image.encode.x")),
        &io("image.encode.mean"),
        TOL,
    );
    let err = vae
        .decode_video(&runner, &io("video.decode.z"))
        .unwrap_err();
    assert!(err.to_string().contains("without its decoder"), "{err}");
}

/// The single-frame down shortcuts depend on the temporal factors (a zero frame is averaged
/// in): switched off, the encoding is measurably different, so the parity tests above do check
/// them. (On one frame the up shortcut's kept duplicate reads the same channels either way
/// when a level keeps or doubles its width, as every temporal level here and in the released
/// model does; the video tests check the up factors.)
#[test]
fn temporal_shortcut_factors_matter() {
    let store = weights(Wan22VaeLayout::Diffusers);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let (vae, runner) = load_from(&source, RunOptions::default(), |c| {
        c.temporal_down.fill(false);
        c.temporal_up.fill(false);
    })
    .unwrap();
    let want = io("image.encode.mean");
    let err = max_abs_diff(&image_encode(&vae, &runner, &io("image.encode.x")), &want);
    assert!(err > 1e-2, "encode moved only {err}");
}

/// The original file as a 2-D checkpoint: every causal kernel cut to its last temporal tap
/// and stored as a plain Conv2d [K, K, I, O], no `time_conv` weights.
fn two_d_source() -> MemorySource {
    let store = TensorStore::open(&fixture_path("wan22_vae/original.safetensors")).unwrap();
    let mut flat = MemorySource::new();
    for info in store.iter() {
        if info.name.contains(".time_conv.") {
            continue;
        }
        let data = store.to_f32(info).unwrap();
        let bias = info
            .name
            .strip_suffix(".weight")
            .and_then(|stem| store.get(&format!("{stem}.bias")));
        let [k0, k1, t, io] = info.ne;
        match bias.map(|b| b.ne[0]) {
            Some(out) if io != out => {
                let plane = k0 * k1;
                let last: Vec<f32> = (0..io)
                    .flat_map(|j| {
                        let at = (j * t + t - 1) * plane;
                        data[at..at + plane].to_vec()
                    })
                    .collect();
                flat.insert(info.name.as_str(), [k0, k1, io / out, out], last);
            }
            _ => flat.insert(info.name.as_str(), info.ne, data),
        }
    }
    flat
}

/// stable-diffusion.cpp's rule for 2-D checkpoints (a plain 2D decoder `conv1`): every
/// temporal factor off, and no video.
#[test]
fn two_d_checkpoints_switch_the_temporal_factors_off() {
    let flat = two_d_source();
    let (vae, runner) = load_from(&flat, RunOptions::default(), |c| {
        assert_eq!(c.layout, Wan22VaeLayout::Original);
        assert_eq!(c.temporal_down, vec![false; 4]);
        assert_eq!(c.temporal_up, vec![false; 4]);
    })
    .unwrap();
    let store = weights(Wan22VaeLayout::Original);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let (off, off_runner) = load_from(&source, RunOptions::default(), |c| {
        c.temporal_down.fill(false);
        c.temporal_up.fill(false);
    })
    .unwrap();
    let z = io("image.decode.z");
    let want = image_decode(&off, &off_runner, &z);
    assert_eq!(max_abs_diff(&image_decode(&vae, &runner, &z), &want), 0.0);
    let x = io("image.encode.x");
    let want = image_encode(&off, &off_runner, &x);
    assert_eq!(max_abs_diff(&image_encode(&vae, &runner, &x), &want), 0.0);

    let err = load_from(&flat, RunOptions::default(), |c| c.video = true)
        .err()
        .expect("video from a 2-D checkpoint")
        .to_string();
    assert!(
        err.contains("temporal taps") && err.contains("encoder.conv1.weight"),
        "{err}"
    );
}

#[test]
fn bad_inputs_are_errors() {
    let (vae, runner) = load_video(Wan22VaeLayout::Diffusers);
    let x = io("video.encode.x");
    let [w, h, _, c] = x.ne;
    let plane = w * h;
    // 6 frames is not 1 + 4k.
    let six = HostTensor::new([w, h, 6, c], vec![0.0; plane * 6 * c]).unwrap();
    let err = vae.encode_video(&runner, &six).unwrap_err().to_string();
    assert!(err.contains("6 frames") && err.contains("1 + 4k"), "{err}");
    assert!(vae.latent_frames(0).is_err() && vae.latent_frames(8).is_err());
    assert_eq!(vae.latent_frames(1).unwrap(), 1);
    assert_eq!(vae.latent_frames(17).unwrap(), 5);
    assert_eq!(vae.video_frames(1), 1);
    // Sizes that are not multiples of 16.
    let narrow = HostTensor::new([w - 8, h, 5, c], vec![0.0; (w - 8) * h * 5 * c]).unwrap();
    let err = vae.encode_video(&runner, &narrow).unwrap_err().to_string();
    assert!(err.contains("multiples of 16"), "{err}");
    assert!(vae.check_encode_size(32, 24).is_err() && vae.check_encode_size(0, 16).is_err());
    assert!(vae.check_encode_size(48, 16).is_ok());
    // Wrong channel counts, an empty latent, data that does not fit the shape.
    let rgba = HostTensor::new([w, h, 5, 4], vec![0.0; plane * 5 * 4]).unwrap();
    assert!(vae.encode_video(&runner, &rgba).is_err());
    let z = io("video.decode.z");
    let [zw, zh, _, zc] = z.ne;
    let wide = HostTensor::new([zw, zh, 2, 48], vec![0.0; zw * zh * 2 * 48]).unwrap();
    let err = vae.decode_video(&runner, &wide).unwrap_err().to_string();
    assert!(err.contains("expected [w, h, T, 6]"), "{err}");
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
fn bad_checkpoints_are_errors() {
    let store = weights(Wan22VaeLayout::Diffusers);
    // No time_conv anywhere: images load, video names the missing weight.
    let hidden = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |name| name.contains(".time_conv."),
    };
    let loader = WeightLoader::new(&hidden, None);
    let config = Wan22VaeConfig::detect(&loader.root("")).unwrap();
    check_config(&config, Wan22VaeLayout::Diffusers);
    assert!(Wan22Vae::new(&loader.root(""), config).is_ok());
    let err = load_from(&hidden, RunOptions::default(), |c| c.video = true)
        .err()
        .expect("video without time_conv")
        .to_string();
    assert!(err.contains("time_conv"), "{err}");

    // A missing resnet weight names its key.
    let missing = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |name| name == "decoder.up_blocks.1.resnets.1.conv2.weight",
    };
    let err = load_from(&missing, RunOptions::default(), |_| {})
        .err()
        .expect("a missing weight")
        .to_string();
    assert!(
        err.contains("decoder.up_blocks.1.resnets.1.conv2.weight"),
        "{err}"
    );

    // Inconsistent configurations are refused before anything is built.
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let err = load_from(&source, RunOptions::default(), |c| {
        c.temporal_up.pop();
    })
    .err()
    .expect("short flags")
    .to_string();
    assert!(
        err.contains("inconsistent Wan 2.2 VAE configuration"),
        "{err}"
    );
    let err = load_from(&source, RunOptions::default(), |c| c.patch_size = 3)
        .err()
        .expect("channels not a multiple of patch²")
        .to_string();
    assert!(err.contains("inconsistent"), "{err}");

    // A Wan 2.1 file is not a Wan 2.2 VAE.
    let mut wan21 = TensorStore::new();
    wan21
        .add_file(
            &fixture_path("wan_vae/a/diffusion_pytorch_model.safetensors"),
            Component::Vae.prefix(),
        )
        .unwrap();
    let source = StoreSource::new(&wan21, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let err = Wan22VaeConfig::detect(&loader.root(""))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no Wan 2.2 VAE"), "{err}");
}

#[test]
fn latent_statistics() {
    let path = fixture_path("wan22_vae/diffusers/config.json");
    let json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let stats = LatentStats::from_diffusers_config(&json).unwrap().unwrap();
    assert_eq!(stats.channels(), 6);
    assert_eq!(stats.mean()[0], -0.8);
    assert_eq!(stats.std()[5], 1.6);
    // The released 48-channel statistics (diffusers' Wan2.2-TI2V-5B vae/config.json).
    let released = LatentStats::new(LATENTS_MEAN.to_vec(), LATENTS_STD.to_vec()).unwrap();
    assert_eq!(released.channels(), 48);
    assert_eq!((LATENTS_MEAN[0], LATENTS_MEAN[47]), (-0.2289, -0.0667));
    assert_eq!((LATENTS_STD[0], LATENTS_STD[47]), (0.4765, 0.7744));
}
