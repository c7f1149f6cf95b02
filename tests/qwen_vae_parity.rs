//! Parity of the Qwen Image 2.1 VAE (decode, encode, latent statistics) against diffusers'
//! `AutoencoderKLQwenImage21`, in both weight layouts.
//! Fixtures: tests/reference/qwen_vae_fixtures.py → tests/fixtures/qwen_vae/{diffusers,original,io}
//! (a tiny random five-level VAE, batch of 2, 3×2 latent ↔ 48×32 RGBA image; the original-layout
//! file stores Conv3d kernels [O, I, T, K, K], some with T = 3 and random earlier slices).
//! Tolerance: max abs error ≤ 1e-4 × max(1, |reference|) in f32.

mod common;

use std::rc::Rc;

use common::*;
use sd_cli::models::vae::qwen_image_2_1_vae::{
    LatentStats, QwenImage21Vae, QwenImage21VaeConfig, QwenVaeLayout, LATENTS_MEAN,
};
use sd_cli::runner::{SourceTensor, StoreSource, WeightLoader, WeightSource};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

const TOL: f32 = 1e-4;

/// The fixture file of `layout` added under the VAE component prefix, as `--vae` does.
fn weights(layout: QwenVaeLayout) -> TensorStore {
    let file = match layout {
        QwenVaeLayout::Diffusers => "qwen_vae/diffusers.safetensors",
        QwenVaeLayout::Original => "qwen_vae/original.safetensors",
    };
    let mut store = TensorStore::new();
    store
        .add_file(&fixture_path(file), Component::Vae.prefix())
        .unwrap();
    store
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

struct Outputs {
    decoded: Option<HostTensor>,
    encoded: Option<HostTensor>,
}

fn run(source: &dyn WeightSource, adjust: impl FnOnce(&mut QwenImage21VaeConfig)) -> Outputs {
    let io = open_fixture("qwen_vae/io.safetensors");
    let z = tensor(&io, "decode.z");
    let x = tensor(&io, "encode.x");
    let backend = cpu();
    let loader = WeightLoader::new(source, None);
    let mut config = QwenImage21VaeConfig::detect(&loader.root("")).unwrap();
    adjust(&mut config);
    let vae = QwenImage21Vae::new(&loader.root(""), config).unwrap();
    let w = loader.finish(&backend, "qwen_vae").unwrap();
    let r = runner(Some(w), Rc::clone(&backend), false);
    let got = r
        .compute(|g| {
            let mut outs = Vec::new();
            if vae.has_decoder() {
                outs.push(vae.decode(g, g.input_f32("z", z.ne, z.data.clone())));
            }
            if vae.has_encoder() {
                outs.push(vae.encode(g, g.input_f32("x", x.ne, x.data.clone())));
            }
            outs
        })
        .unwrap();
    let mut got = got.into_iter();
    Outputs {
        decoded: vae.has_decoder().then(|| got.next().unwrap()),
        encoded: vae.has_encoder().then(|| got.next().unwrap()),
    }
}

fn check_config(config: &QwenImage21VaeConfig, layout: QwenVaeLayout) {
    assert_eq!(config.layout, layout);
    assert_eq!(config.encoder_channels, vec![2, 2, 4, 8, 16, 16]);
    assert_eq!(config.decoder_channels, vec![24, 24, 24, 12, 6, 3]);
    assert_eq!(config.res_blocks, 2);
    assert_eq!(config.temporal_down, vec![false, true, true, true, false]);
    assert_eq!(config.temporal_up, vec![true, true, true, false, false]);
    assert_eq!(
        (config.in_channels, config.out_channels, config.z_dim),
        (4, 4, 8)
    );
    assert!(config.encoder && config.decoder);
    assert_eq!(
        config.latent_stats, None,
        "only the 64-channel model has built-in stats"
    );
    assert_eq!(config.scale_factor(), 16);
}

fn check_layout(layout: QwenVaeLayout) {
    let store = weights(layout);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    check_config(
        &QwenImage21VaeConfig::detect(&loader.root("")).unwrap(),
        layout,
    );

    let io = open_fixture("qwen_vae/io.safetensors");
    let out = run(&source, |_| {});
    let decoded = out.decoded.unwrap();
    assert_eq!(decoded.ne, [48, 32, 4, 2]);
    assert_close(
        &format!("{layout:?} decode"),
        &decoded,
        &tensor(&io, "decode.y"),
        TOL,
    );
    let clamped = HostTensor::new(
        decoded.ne,
        decoded.data.iter().map(|v| v.clamp(-1.0, 1.0)).collect(),
    )
    .unwrap();
    assert_close(
        &format!("{layout:?} decode, clamped"),
        &clamped,
        &tensor(&io, "decode.clamped"),
        TOL,
    );
    let encoded = out.encoded.unwrap();
    assert_eq!(encoded.ne, [3, 2, 8, 2]);
    assert_close(
        &format!("{layout:?} encode"),
        &encoded,
        &tensor(&io, "encode.mean"),
        TOL,
    );
}

#[test]
fn diffusers_layout_matches_diffusers() {
    check_layout(QwenVaeLayout::Diffusers);
}

#[test]
fn original_layout_with_conv3d_kernels_matches_diffusers() {
    check_layout(QwenVaeLayout::Original);
}

#[test]
fn decoder_only_and_stripped_time_convs() {
    let io = open_fixture("qwen_vae/io.safetensors");
    let store = weights(QwenVaeLayout::Original);
    // No `time_conv` weights at all: the temporal flags fall back to the released pattern.
    let source = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |name| name.contains(".time_conv."),
    };
    let loader = WeightLoader::new(&source, None);
    let config = QwenImage21VaeConfig::detect(&loader.root("")).unwrap();
    check_config(&config, QwenVaeLayout::Original);

    let out = run(&source, |c| c.encoder = false);
    assert!(out.encoded.is_none());
    assert_close(
        "decoder only",
        &out.decoded.unwrap(),
        &tensor(&io, "decode.y"),
        TOL,
    );

    // An encoder-only file (decoder stripped) detects the same encoder.
    let enc_only = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |name| name.starts_with("decoder.") || name.starts_with("conv2."),
    };
    let out = run(&enc_only, |_| {});
    assert!(out.decoded.is_none());
    assert_close(
        "encoder only",
        &out.encoded.unwrap(),
        &tensor(&io, "encode.mean"),
        TOL,
    );
}

/// The single-frame shortcuts depend on the temporal factors: with them switched off the
/// result is measurably different, so the parity tests above do check them.
#[test]
fn temporal_shortcut_factors_matter() {
    let io = open_fixture("qwen_vae/io.safetensors");
    let store = weights(QwenVaeLayout::Diffusers);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let out = run(&source, |c| {
        c.temporal_up.iter_mut().for_each(|f| *f = false);
        c.temporal_down.iter_mut().for_each(|f| *f = false);
    });
    let want_dec = tensor(&io, "decode.y");
    let want_enc = tensor(&io, "encode.mean");
    let dec_err = max_abs_diff(&out.decoded.unwrap(), &want_dec);
    let enc_err = max_abs_diff(&out.encoded.unwrap(), &want_enc);
    eprintln!("without temporal factors: decode error {dec_err:.3}, encode error {enc_err:.3}");
    assert!(dec_err > 1e-2 && enc_err > 1e-2);
}

#[test]
fn latent_statistics() {
    let io = open_fixture("qwen_vae/io.safetensors");
    let stats = LatentStats::released();
    assert_eq!(stats.channels(), 64);
    assert_eq!(stats.mean()[0], LATENTS_MEAN[0]);
    let z = tensor(&io, "stats.z");
    let want = tensor(&io, "stats.normalized");

    let mut host = z.clone();
    stats.normalize(&mut host).unwrap();
    assert_close("normalize (host)", &host, &want, 1e-6);
    stats.denormalize(&mut host).unwrap();
    assert_close("denormalize (host)", &host, &z, 1e-6);

    let r = runner(None, cpu(), false);
    let got = r
        .compute(|g| {
            let t = stats.normalize_graph(g, g.input_f32("z", z.ne, z.data.clone()));
            vec![t, stats.denormalize_graph(g, t)]
        })
        .unwrap();
    assert_close("normalize (graph)", &got[0], &want, 1e-6);
    assert_close("denormalize (graph)", &got[1], &z, 1e-6);

    // Wrong channel count and bad statistics are errors, not panics.
    let mut wrong = HostTensor::zeros([3, 2, 8, 1]);
    assert!(stats.normalize(&mut wrong).is_err());
    assert!(LatentStats::new(vec![0.0; 2], vec![1.0, 0.0]).is_err());
    assert!(LatentStats::new(vec![0.0; 2], vec![1.0]).is_err());
    let cfg = serde_json::json!({"latents_mean": [0.5, 1.0], "latents_std": [2.0, 4.0]});
    let parsed = LatentStats::from_diffusers_config(&cfg).unwrap().unwrap();
    assert_eq!(
        (parsed.mean(), parsed.std()),
        (&[0.5, 1.0][..], &[2.0, 4.0][..])
    );
    assert!(LatentStats::from_diffusers_config(&serde_json::json!({})).is_none());
}

#[test]
fn bad_inputs_are_errors() {
    let store = weights(QwenVaeLayout::Diffusers);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let config = QwenImage21VaeConfig::detect(&loader.root("")).unwrap();
    let vae = QwenImage21Vae::new(&loader.root(""), config.clone()).unwrap();
    assert!(vae.check_encode_size(48, 32).is_ok());
    assert!(vae.check_encode_size(40, 32).is_err());
    assert!(vae.check_encode_size(0, 32).is_err());

    // Inconsistent configuration.
    let mut bad = config.clone();
    bad.temporal_up.pop();
    let loader = WeightLoader::new(&source, None);
    assert!(QwenImage21Vae::new(&loader.root(""), bad).is_err());

    // A weight with the wrong width names its key.
    let mut wide = config;
    wide.decoder_channels[2] += 1;
    let loader = WeightLoader::new(&source, None);
    let err = QwenImage21Vae::new(&loader.root(""), wide)
        .unwrap_err()
        .to_string();
    assert!(err.contains("decoder.up_blocks"), "{err}");

    // Not a Qwen Image 2.1 VAE (an AutoencoderKL).
    let mut kl = TensorStore::new();
    kl.add_file(
        &fixture_path("vae/diffusers.safetensors"),
        Component::Vae.prefix(),
    )
    .unwrap();
    let source = StoreSource::new(&kl, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    assert!(QwenImage21VaeConfig::detect(&loader.root("")).is_err());
}
