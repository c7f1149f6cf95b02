//! The MiniMax-H3 video VAE against diffusers' `AutoencoderKLMiniMaxH3`, in both weight
//! layouts, plus its spatial tiling, the image path, segmented execution and bad weights.
//! Fixtures: tests/reference/minimax_h3_vae_fixtures.py → tests/fixtures/minimax_h3_vae/ (a tiny
//! random model: encoder widths [32, 32], 4× space and time, a 64-wide 2-block ViT decoder of
//! 2 heads; float16 weights, float32 reference on those values).
//!
//! Tolerances: max abs error ≤ 1e-4 × max(1, |reference|) in f32 (the ImageNet-space outputs
//! reach ~5), and PSNR ≥ 55 dB over the decoded RGB frames (mapped to [0, 1]).

mod common;

use common::*;
use sd_cli::dtype::DType;
use sd_cli::models::vae::minimax_h3_vae::{
    decode_video_tiled, denormalize_video_latent, encode_video_tiled, normalize_video_latent,
    LatentStats, MiniMaxH3Vae, MiniMaxH3VaeConfig, MiniMaxH3VaeLayout, LATENTS_MEAN, PIXEL_MEAN,
    PIXEL_STD,
};
use sd_cli::models::vae::tiling::TileSettings;
use sd_cli::models::vae::Vae;
use sd_cli::runner::{
    MemoryOptions, RunOptions, Runner, RunnerError, SourceTensor, StoreSource, WeightLoader,
    WeightSource,
};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

const TOL: f32 = 1e-4;
const PSNR_FLOOR: f64 = 55.0;

fn store(layout: MiniMaxH3VaeLayout) -> TensorStore {
    let file = match layout {
        MiniMaxH3VaeLayout::Diffusers => "minimax_h3_vae/vae",
        MiniMaxH3VaeLayout::Original => "minimax_h3_vae/original.safetensors",
    };
    let mut store = TensorStore::new();
    store
        .add_file(&fixture_path(file), Component::Vae.prefix())
        .unwrap();
    store
}

/// The diffusers folder's `config.json`.
fn config_json() -> serde_json::Value {
    let s = store(MiniMaxH3VaeLayout::Diffusers);
    let json = s.files().iter().find_map(|f| f.config.clone());
    json.expect("the diffusers folder has its config.json")
}

fn io(name: &str) -> HostTensor {
    tensor(&open_fixture("minimax_h3_vae/io.safetensors"), name)
}

/// The VAE from `source` (`json` as its config.json) on a CPU runner.
fn load_from(
    source: &dyn WeightSource,
    json: Option<&serde_json::Value>,
    options: RunOptions,
) -> Result<(MiniMaxH3Vae, Runner), RunnerError> {
    let loader = WeightLoader::new(source, None);
    let config = MiniMaxH3VaeConfig::detect(&loader.root(""), json)?;
    let vae = MiniMaxH3Vae::new(&loader.root(""), config)?;
    let backend = cpu();
    let w = loader.finish(&backend, "minimax_h3_vae")?;
    Ok((
        vae,
        Runner::new("minimax_h3_vae", backend, Some(w), options),
    ))
}

/// The fixture's float16 weights widened to f32 as they are read, so every product runs in
/// f32 as the reference does (ggml's own f16 products round the activations to f16).
struct Widened<'a>(StoreSource<'a>);

impl WeightSource for Widened<'_> {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        let t = self.0.tensor(name)?;
        let values = (t.to_f32)(&t.bytes).ok()?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Some(SourceTensor {
            ne: t.ne,
            n_dims: t.n_dims,
            ggml_type: Some(DType::F32),
            bytes: std::borrow::Cow::Owned(bytes),
            to_f32: Box::new(|b: &[u8]| {
                Ok(b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect())
            }),
            origin: t.origin,
        })
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

/// Both layouts with the folder's config.json (the original file is given it explicitly: its
/// 2-head decoder is not the released 64-wide-head rule).
fn load(layout: MiniMaxH3VaeLayout, options: RunOptions) -> (MiniMaxH3Vae, Runner) {
    let s = store(layout);
    let source = Widened(StoreSource::new(&s, Component::Vae.prefix()));
    let json = config_json();
    let (vae, runner) = load_from(&source, Some(&json), options).unwrap();
    assert_eq!(vae.config().layout, layout);
    (vae, runner)
}

/// RGB in [0, 1] of ImageNet-space frames [W, H, F, 3].
fn rgb(v: &HostTensor) -> Vec<f32> {
    let plane = v.ne[0] * v.ne[1] * v.ne[2];
    v.data
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let c = i / plane;
            (x * PIXEL_STD[c] + PIXEL_MEAN[c]).clamp(0.0, 1.0)
        })
        .collect()
}

/// PSNR (dB) of two RGB frame sets in [0, 1].
fn psnr01(a: &[f32], b: &[f32]) -> f64 {
    let mse = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(x - y).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (1.0 / mse.max(1e-20)).log10()
}

fn check(layout: MiniMaxH3VaeLayout) {
    let (vae, runner) = load(layout, RunOptions::default());
    assert_eq!((vae.scale_factor(), vae.temporal_factor()), (4, 4));
    let what = format!("{layout:?}");

    let z = io("decode.z");
    let want = io("decode.x");
    assert_eq!(vae.video_frames(z.ne[2]), 39);
    let got = vae.decode_video_raw(&runner, &z).unwrap();
    assert_close(
        &format!("{what} decode (12 latent frames, 2 chunks)"),
        &got,
        &want,
        TOL,
    );
    let psnr = psnr01(&rgb(&got), &rgb(&want));
    eprintln!("{what} decode: PSNR {psnr:.1} dB over 39 RGB frames");
    assert!(psnr >= PSNR_FLOOR, "{what} decode PSNR {psnr}");

    let got = vae.decode_video_raw(&runner, &io("decode1.z")).unwrap();
    assert_close(
        &format!("{what} decode (1 latent frame)"),
        &got,
        &io("decode1.x"),
        TOL,
    );

    let x = io("encode.x");
    assert_eq!(vae.latent_frames(x.ne[2]), 7);
    let got = vae.encode_video_raw(&runner, &x).unwrap();
    assert_close(
        &format!("{what} encode (22 frames, 2 clips)"),
        &got,
        &io("encode.mean"),
        TOL,
    );
    let got = vae.encode_video_raw(&runner, &io("encode1.x")).unwrap();
    assert_close(
        &format!("{what} encode (1 frame)"),
        &got,
        &io("encode1.mean"),
        TOL,
    );
}

/// The float16 file as stored (convs and products with f16 weights, as a user's fp16 file
/// runs): max abs error ≤ 2e-3 × max(1, |reference|).
#[test]
fn float16_weights_as_stored() {
    let s = store(MiniMaxH3VaeLayout::Original);
    let source = StoreSource::new(&s, Component::Vae.prefix());
    let json = config_json();
    let (vae, runner) = load_from(&source, Some(&json), RunOptions::default()).unwrap();
    let got = vae.decode_video_raw(&runner, &io("decode.z")).unwrap();
    assert_close("f16 weights: decode", &got, &io("decode.x"), 2e-3);
    let got = vae.encode_video_raw(&runner, &io("encode.x")).unwrap();
    assert_close("f16 weights: encode", &got, &io("encode.mean"), 2e-3);
}

#[test]
fn diffusers_layout_matches_diffusers() {
    check(MiniMaxH3VaeLayout::Diffusers);
}

#[test]
fn original_layout_matches_diffusers() {
    check(MiniMaxH3VaeLayout::Original);
}

#[test]
fn config_comes_from_shapes_and_config_json() {
    let (vae, _) = load(MiniMaxH3VaeLayout::Diffusers, RunOptions::default());
    let c = vae.config();
    assert_eq!(c.block_out_channels, vec![32, 32]);
    assert_eq!((c.layers_per_block, c.latent_channels), (1, 24));
    assert_eq!(
        (c.spatial_factors.clone(), c.temporal_factors.clone()),
        (vec![2, 2], vec![2, 2])
    );
    assert_eq!((c.dim, c.layers, c.heads, c.head_dim), (64, 2, 2, 32));
    assert_eq!((c.ffn_inner, c.register_tokens, c.rope_dim), (64, 4, 24));
    let stats = LatentStats::from_diffusers_config(&config_json())
        .unwrap()
        .unwrap();
    assert_eq!(vae.latent_stats(), Some(&stats));

    // The single file alone: the released rules fill in what shapes cannot tell.
    let s = store(MiniMaxH3VaeLayout::Original);
    let source = StoreSource::new(&s, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let c = MiniMaxH3VaeConfig::detect(&loader.root(""), None).unwrap();
    assert_eq!(
        (c.heads, c.head_dim, c.norm_groups, c.rope_dim),
        (1, 64, 32, 48)
    );
    assert_eq!(
        (c.spatial_factors, c.temporal_factors),
        (vec![2, 2], vec![2, 2])
    );
    assert_eq!(c.latent_stats.unwrap().mean(), &LATENTS_MEAN[..]);
}

/// Frames in [−1, 1] of ImageNet-space frames.
fn unit(v: &HostTensor) -> HostTensor {
    HostTensor::new(v.ne, rgb(v).iter().map(|x| x * 2.0 - 1.0).collect()).unwrap()
}

#[test]
fn pixel_space_entry_points_and_the_image_path() {
    let (vae, runner) = load(MiniMaxH3VaeLayout::Diffusers, RunOptions::default());
    // decode_video = the raw decode mapped to RGB, clamped, in [−1, 1] (one chunk here).
    let z1 = io("decode1.z");
    let frames = vae.decode_video(&runner, &z1).unwrap();
    assert_close(
        "decode_video (1 frame)",
        &frames,
        &unit(&io("decode1.x")),
        TOL,
    );
    // The image path: the same latent as an image [w, h, C, 1].
    let [w, h, _, c] = z1.ne;
    let image = runner
        .compute(|g| {
            vec![Vae::decode(
                &vae,
                g,
                g.input_f32("z", [w, h, c, 1], z1.data.clone()),
            )]
        })
        .unwrap()
        .remove(0);
    let [fw, fh, _, fc] = frames.ne;
    let flat = HostTensor::new([fw, fh, fc, 1], frames.data.clone()).unwrap();
    assert!(max_abs_diff(&image, &flat) < 1e-5, "image decode");

    // encode_video takes [−1, 1]; the image path encodes one frame.
    let x1 = io("encode1.x");
    let pixels = HostTensor::new(
        x1.ne,
        x1.data
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let ch = i / (x1.ne[0] * x1.ne[1]);
                (v * PIXEL_STD[ch] + PIXEL_MEAN[ch]) * 2.0 - 1.0
            })
            .collect(),
    )
    .unwrap();
    let mean = vae.encode_video(&runner, &pixels).unwrap();
    assert_close("encode_video (1 frame)", &mean, &io("encode1.mean"), TOL);
    let [w, h, _, c] = pixels.ne;
    let image = runner
        .compute(|g| {
            vec![Vae::encode_mean(
                &vae,
                g,
                g.input_f32("x", [w, h, c, 1], pixels.data.clone()),
            )]
        })
        .unwrap()
        .remove(0);
    let [mw, mh, _, mc] = mean.ne;
    let flat = HostTensor::new([mw, mh, mc, 1], mean.data.clone()).unwrap();
    assert!(max_abs_diff(&image, &flat) < 1e-5, "image encode");
}

/// Value of a clip [W, H, F, C] at (x, y, frame, channel).
fn at(v: &HostTensor, x: usize, y: usize, f: usize, c: usize) -> f32 {
    let [w, h, frames, _] = v.ne;
    v.data[x + w * (y + h * (f + frames * c))]
}

/// The `w × h` window at (x0, y0) of every frame and channel of a latent clip.
fn crop_clip(z: &HostTensor, x0: usize, y0: usize, w: usize, h: usize) -> HostTensor {
    let [zw, zh, t, c] = z.ne;
    let mut data = Vec::with_capacity(w * h * t * c);
    for plane in 0..t * c {
        for y in y0..y0 + h {
            let row = (plane * zh + y) * zw + x0;
            data.extend_from_slice(&z.data[row..row + w]);
        }
    }
    HostTensor::new([w, h, t, c], data).unwrap()
}

/// A reproducible latent of normal-ish values.
fn noise_latent(ne: [usize; 4]) -> HostTensor {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let data = (0..ne.iter().product::<usize>())
        .map(|_| {
            // Sum of four uniforms (xorshift), centred: about N(0, 1/3).
            (0..4)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 24) as f32
                })
                .sum::<f32>()
                * 1.7
                - 3.4
        })
        .collect();
    HostTensor::new(ne, data).unwrap()
}

/// Tiled decode (the MiniMax-H3 rule through the shared grid and blend). The random-weight ViT
/// decoder attends over the whole tile, so a tile's pixels depend on everything in it and
/// tiled vs untiled agree only loosely: mean |diff| ≤ 0.25 of the [−1, 1] range. The exact
/// checks: outside the overlap every pixel is its own tile's whole-clip decode, and a tile as
/// big as the frame is the untiled decode.
#[test]
fn tiled_decode_follows_the_tiles() {
    let (vae, runner) = load(MiniMaxH3VaeLayout::Diffusers, RunOptions::default());
    let z = noise_latent([6, 4, 7, 24]); // 24x16 pixels, 22 frames
    let full = vae.decode_video(&runner, &z).unwrap();
    assert_eq!(full.ne, [24, 16, 22, 3]);

    // Without --vae-tiling: 256-pixel tiles, larger than the frame: one tile, the untiled
    // decode exactly.
    let default = decode_video_tiled(&vae, &runner, &z, None).unwrap();
    assert_eq!(default.data, full.data);
    let one = TileSettings::new(24, 16, None, 0.5);
    assert_eq!(
        decode_video_tiled(&vae, &runner, &z, Some(&one))
            .unwrap()
            .data,
        full.data
    );

    // 16-pixel-wide tiles (4 latent): origins 0 and 2, overlapping by 2 latent pixels.
    let tiles = TileSettings::new(16, 16, None, 0.25);
    let tiled = decode_video_tiled(&vae, &runner, &z, Some(&tiles)).unwrap();
    assert_eq!(tiled.ne, full.ne);
    let mean = full
        .data
        .iter()
        .zip(&tiled.data)
        .map(|(a, b)| (a - b).abs())
        .sum::<f32>()
        / full.data.len() as f32;
    eprintln!("tiled vs untiled decode: mean abs diff {mean:.3e}");
    assert!(mean > 0.0 && mean < 0.25, "{mean}");
    for (x0, ox) in [(0, 0), (2, 16)] {
        let own = vae
            .decode_video(&runner, &crop_clip(&z, x0, 0, 4, 4))
            .unwrap();
        assert_eq!(own.ne, [16, 16, 22, 3]);
        // Pixels [0, 8) of the left tile and [16, 24) of the right one have no neighbour.
        let (from, to) = if x0 == 0 { (0, 8) } else { (8, 16) };
        for f in 0..22 {
            for c in 0..3 {
                for y in 0..16 {
                    for x in from..to {
                        assert_eq!(
                            at(&own, x, y, f, c),
                            at(&tiled, x + 4 * x0, y, f, c),
                            "tile {x0} at ({x},{y},{f},{c}) (image x {ox})"
                        );
                    }
                }
            }
        }
    }
}

/// Tiled encode: a frame-sized tile is the untiled encode; with two 16-pixel tiles the latent
/// pixels only one tile covers are that tile's own encode exactly, and the blend stays close
/// to the untiled mean (mean |diff| ≤ 0.25: the random CNN sees different borders).
#[test]
fn tiled_encode_follows_the_tiles() {
    let (vae, runner) = load(MiniMaxH3VaeLayout::Diffusers, RunOptions::default());
    let x = unit(&io("encode1.x")); // 24x16 pixels, 1 frame, in [−1, 1]
    let full = vae.encode_video(&runner, &x).unwrap();
    assert_eq!(
        encode_video_tiled(&vae, &runner, &x, None).unwrap().data,
        full.data
    );
    let tiles = TileSettings::new(16, 16, None, 0.25);
    let tiled = encode_video_tiled(&vae, &runner, &x, Some(&tiles)).unwrap();
    assert_eq!(tiled.ne, full.ne);
    let mean = full
        .data
        .iter()
        .zip(&tiled.data)
        .map(|(a, b)| (a - b).abs())
        .sum::<f32>()
        / full.data.len() as f32;
    eprintln!("tiled vs untiled encode: mean abs diff {mean:.3e}");
    assert!(mean > 0.0 && mean < 0.25, "{mean}");
    let left = vae
        .encode_video(&runner, &crop_clip(&x, 0, 0, 16, 16))
        .unwrap();
    for c in 0..24 {
        for y in 0..4 {
            for xx in 0..2 {
                assert_eq!(
                    at(&left, xx, y, 0, c),
                    at(&tiled, xx, y, 0, c),
                    "({xx},{y},{c})"
                );
            }
        }
    }
}

#[test]
fn video_latent_normalisation_is_per_channel() {
    let stats = LatentStats::from_diffusers_config(&config_json())
        .unwrap()
        .unwrap();
    let z = io("encode.mean"); // [6, 4, 7, 24]
    let mut n = z.clone();
    normalize_video_latent(&stats, &mut n).unwrap();
    let plane = 6 * 4 * 7;
    for (i, (&v, &got)) in z.data.iter().zip(&n.data).enumerate() {
        let c = i / plane;
        let want = (v - stats.mean()[c]) / stats.std()[c];
        assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{i}");
    }
    denormalize_video_latent(&stats, &mut n).unwrap();
    assert!(max_abs_diff(&n, &z) < 1e-5);
    let mut wrong = HostTensor::zeros([6, 4, 7, 23]);
    assert!(normalize_video_latent(&stats, &mut wrong).is_err());
}

#[test]
fn segmented_decode_matches_monolithic() {
    let options = RunOptions {
        memory: MemoryOptions {
            force_segmented: true,
            planning_headroom: 0,
            ..MemoryOptions::default()
        },
        ..RunOptions::default()
    };
    let (vae, runner) = load(MiniMaxH3VaeLayout::Original, options);
    let got = vae.decode_video_raw(&runner, &io("decode.z")).unwrap();
    let report = runner.last_report().expect("a planned run");
    assert!(report.segmented && report.segments.len() >= 2, "{report:?}");
    assert_close("segmented decode", &got, &io("decode.x"), TOL);
}

/// A source that hides one tensor or gives it another shape.
struct Tampered<'a> {
    inner: StoreSource<'a>,
    name: &'static str,
    reshape: Option<[usize; 4]>,
}

impl WeightSource for Tampered<'_> {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        let mut t = self.inner.tensor(name)?;
        if name == self.name {
            t.ne = self.reshape?;
        }
        Some(t)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[test]
fn bad_weights_are_errors_naming_the_tensor() {
    let cases: [(&str, Option<[usize; 4]>); 5] = [
        ("decoder.transformer_blocks.1.attn.to_qkv.weight", None),
        ("decoder.transformer_blocks.0.scale2", Some([32, 1, 1, 1])),
        (
            "encoder.down.1.block.0.conv2.weight",
            Some([3, 3, 1, 32 * 32]),
        ),
        ("encoder.conv_out.bias", Some([47, 1, 1, 1])),
        ("decoder.register_tokens", Some([63, 4, 1, 1])),
    ];
    let s = store(MiniMaxH3VaeLayout::Original);
    let json = config_json();
    for (name, reshape) in cases {
        let source = Tampered {
            inner: StoreSource::new(&s, Component::Vae.prefix()),
            name,
            reshape,
        };
        let err = match load_from(&source, Some(&json), RunOptions::default()) {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(name), "{name}: {err}");
    }

    // Inputs of the wrong shape are errors too.
    let (vae, runner) = load(MiniMaxH3VaeLayout::Diffusers, RunOptions::default());
    let z = HostTensor::zeros([6, 4, 2, 23]);
    assert!(vae.decode_video(&runner, &z).is_err());
    let x = HostTensor::zeros([18, 16, 5, 3]);
    assert!(vae.encode_video(&runner, &x).is_err());
}
