//! Parity of the Wan 2.1 / Qwen Image VAE (decode, encode, detection, latent statistics)
//! against diffusers' `AutoencoderKLQwenImage`, in both weight layouts.
//! Fixtures: tests/reference/wan_vae_fixtures.py → tests/fixtures/wan_vae/
//! (model A: four levels, z 16, batch 2, 6×5 latent ↔ 48×40 image; model B: three levels,
//! two resnets per level, z 8 with statistics in config.json, 6×5 latent ↔ 24×20 image; each
//! as a diffusers folder and as an original-names single file with folded Conv3d kernels,
//! some with three temporal slices, some plain Conv2d, flat gammas).
//! Tolerance: max abs error ≤ 3e-5 × max(1, |reference|) in f32 (measured ≤ 5.2e-6).

mod common;

use std::rc::Rc;

use common::*;
use sd_cli::models::vae::wan_vae::{
    LatentStats, WanVae, WanVaeConfig, WanVaeLayout, LATENTS_MEAN, LATENTS_STD,
};
use sd_cli::models::vae::Vae;
use sd_cli::runner::{SourceTensor, StoreSource, WeightLoader, WeightSource};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

const TOL: f32 = 3e-5;

/// The weight file of `model` ("a" or "b") in `layout`, under the VAE component prefix.
fn weights(model: &str, layout: WanVaeLayout) -> TensorStore {
    let file = match layout {
        WanVaeLayout::Diffusers => format!("wan_vae/{model}/diffusion_pytorch_model.safetensors"),
        WanVaeLayout::Original => format!("wan_vae/{model}_original.safetensors"),
    };
    let mut store = TensorStore::new();
    store
        .add_file(&fixture_path(&file), Component::Vae.prefix())
        .unwrap();
    store
}

fn config_json(model: &str) -> serde_json::Value {
    let path = fixture_path(&format!("wan_vae/{model}/config.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
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

/// Decoded and encoded outputs of the parts the detected VAE has.
fn run(source: &dyn WeightSource, model: &str) -> (Option<HostTensor>, Option<HostTensor>) {
    let io = open_fixture("wan_vae/io.safetensors");
    let z = tensor(&io, &format!("{model}.decode.z"));
    let x = tensor(&io, &format!("{model}.encode.x"));
    let backend = cpu();
    let loader = WeightLoader::new(source, None);
    let config = WanVaeConfig::detect(&loader.root("")).unwrap();
    let vae = WanVae::new(&loader.root(""), config).unwrap();
    let w = loader.finish(&backend, "wan_vae").unwrap();
    let r = runner(Some(w), Rc::clone(&backend), false);
    let got = r
        .compute(|g| {
            let mut outs = Vec::new();
            if vae.has_decoder() {
                outs.push(vae.decode(g, g.input_f32("z", z.ne, z.data.clone())));
            }
            if vae.has_encoder() {
                // Through the `Vae` interface, as the pipeline calls it.
                let x = g.input_f32("x", x.ne, x.data.clone());
                outs.push(Vae::encode_mean(&vae, g, x));
            }
            outs
        })
        .unwrap();
    let mut got = got.into_iter();
    let decoded = vae.has_decoder().then(|| got.next().unwrap());
    let encoded = vae.has_encoder().then(|| got.next().unwrap());
    (decoded, encoded)
}

fn check_config(config: &WanVaeConfig, model: &str, layout: WanVaeLayout) {
    assert_eq!(config.layout, layout);
    assert!(config.encoder && config.decoder);
    assert_eq!((config.in_channels, config.out_channels), (3, 3));
    match model {
        "a" => {
            assert_eq!(config.encoder_channels, vec![4, 4, 8, 12, 12]);
            assert_eq!(config.decoder_channels, vec![12, 12, 12, 8, 4]);
            assert_eq!((config.res_blocks, config.z_dim), (1, 16));
            assert_eq!(config.scale_factor(), 8);
            let stats = config
                .latent_stats
                .as_ref()
                .expect("built-in 16-channel stats");
            assert_eq!(
                (stats.mean(), stats.std()),
                (&LATENTS_MEAN[..], &LATENTS_STD[..])
            );
        }
        _ => {
            assert_eq!(config.encoder_channels, vec![5, 5, 10, 10]);
            assert_eq!(config.decoder_channels, vec![10, 10, 10, 5]);
            assert_eq!((config.res_blocks, config.z_dim), (2, 8));
            assert_eq!(config.scale_factor(), 4);
            assert_eq!(config.latent_stats, None, "only z 16 has built-in stats");
        }
    }
}

fn check(model: &str, layout: WanVaeLayout) {
    let store = weights(model, layout);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    check_config(
        &WanVaeConfig::detect(&loader.root("")).unwrap(),
        model,
        layout,
    );

    let io = open_fixture("wan_vae/io.safetensors");
    let (decoded, encoded) = run(&source, model);
    let what = format!("model {model}, {layout:?}");
    assert_close(
        &format!("{what} decode (clamped)"),
        &decoded.unwrap(),
        &tensor(&io, &format!("{model}.decode.clamped")),
        TOL,
    );
    assert_close(
        &format!("{what} encode (posterior mean)"),
        &encoded.unwrap(),
        &tensor(&io, &format!("{model}.encode.mean")),
        TOL,
    );
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
fn model_b_original_layout_with_plain_kernels_matches_diffusers() {
    check("b", WanVaeLayout::Original);
}

#[test]
fn decoder_only_and_encoder_only_files() {
    let io = open_fixture("wan_vae/io.safetensors");
    for layout in [WanVaeLayout::Diffusers, WanVaeLayout::Original] {
        let store = weights("a", layout);
        let dec_only = Hiding {
            inner: StoreSource::new(&store, Component::Vae.prefix()),
            hide: |n| {
                n.starts_with("encoder.")
                    || n.starts_with("quant_conv.")
                    || n == "conv1.weight"
                    || n == "conv1.bias"
            },
        };
        let (decoded, encoded) = run(&dec_only, "a");
        assert!(encoded.is_none());
        assert_close(
            &format!("{layout:?} decoder only"),
            &decoded.unwrap(),
            &tensor(&io, "a.decode.clamped"),
            TOL,
        );
        let enc_only = Hiding {
            inner: StoreSource::new(&store, Component::Vae.prefix()),
            hide: |n| {
                n.starts_with("decoder.")
                    || n.starts_with("post_quant_conv.")
                    || n.starts_with("conv2.")
            },
        };
        let (decoded, encoded) = run(&enc_only, "a");
        assert!(decoded.is_none());
        assert_close(
            &format!("{layout:?} encoder only"),
            &encoded.unwrap(),
            &tensor(&io, "a.encode.mean"),
            TOL,
        );
    }
}

#[test]
fn latent_statistics_from_config_json() {
    // diffusers writes the released statistics into model A's config.json.
    let a = LatentStats::from_diffusers_config(&config_json("a"))
        .unwrap()
        .unwrap();
    assert_eq!(a.channels(), 16);
    assert_eq!((a.mean(), a.std()), (&LATENTS_MEAN[..], &LATENTS_STD[..]));
    let b = LatentStats::from_diffusers_config(&config_json("b"))
        .unwrap()
        .unwrap();
    assert_eq!(b.channels(), 8);
    assert_eq!(b.mean()[0], -1.7);
    assert_eq!(b.std()[7], 2.75);
}

#[test]
fn missing_tensor_is_an_error_naming_it() {
    for (layout, key) in [
        (
            WanVaeLayout::Diffusers,
            "decoder.mid_block.attentions.0.proj.weight",
        ),
        (WanVaeLayout::Original, "decoder.middle.1.proj.weight"),
    ] {
        let store = weights("a", layout);
        let hide: fn(&str) -> bool = match layout {
            WanVaeLayout::Diffusers => {
                |n| n.ends_with("decoder.mid_block.attentions.0.proj.weight")
            }
            WanVaeLayout::Original => |n| n.ends_with("decoder.middle.1.proj.weight"),
        };
        let source = Hiding {
            inner: StoreSource::new(&store, Component::Vae.prefix()),
            hide,
        };
        let loader = WeightLoader::new(&source, None);
        let config = WanVaeConfig::detect(&loader.root("")).unwrap();
        let err = WanVae::new(&loader.root(""), config)
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err}");
    }

    // A gamma missing from the block lists detection reads from: still an error, not a panic.
    let store = weights("b", WanVaeLayout::Original);
    let source = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |n| n.ends_with("encoder.downsamples.4.residual.3.gamma"),
    };
    let loader = WeightLoader::new(&source, None);
    let config = WanVaeConfig::detect(&loader.root("")).unwrap();
    let err = WanVae::new(&loader.root(""), config)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("encoder.downsamples.4.residual.3.gamma"),
        "{err}"
    );
}

#[test]
fn bad_inputs_are_errors() {
    let store = weights("a", WanVaeLayout::Diffusers);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let config = WanVaeConfig::detect(&loader.root("")).unwrap();
    let vae = WanVae::new(&loader.root(""), config.clone()).unwrap();
    assert_eq!(Vae::scale_factor(&vae), 8);
    assert_eq!(vae.image_channels(), 3);
    assert!(vae.check_encode_size(48, 40).is_ok());
    assert!(vae.check_encode_size(44, 40).is_err());
    assert!(vae.check_encode_size(0, 40).is_err());

    // Inconsistent configuration.
    let mut bad = config.clone();
    bad.decoder_channels.pop();
    let loader = WeightLoader::new(&source, None);
    assert!(WanVae::new(&loader.root(""), bad).is_err());

    // A weight with the wrong width names its key.
    let mut wide = config;
    wide.decoder_channels[2] += 2;
    let loader = WeightLoader::new(&source, None);
    let err = WanVae::new(&loader.root(""), wide).unwrap_err().to_string();
    assert!(err.contains("decoder.up_blocks"), "{err}");

    // A missing block in the middle of a list breaks the level pattern: an error naming the part.
    let gap = Hiding {
        inner: StoreSource::new(&store, Component::Vae.prefix()),
        hide: |n| n.contains("encoder.down_blocks.3."),
    };
    let loader = WeightLoader::new(&gap, None);
    let err = WanVaeConfig::detect(&loader.root(""))
        .unwrap_err()
        .to_string();
    assert!(err.contains("encoder"), "{err}");

    // Not a Wan VAE: an AutoencoderKL, and the Qwen Image 2.1 (Wan 2.2 style) VAE.
    for file in [
        "vae/diffusers.safetensors",
        "qwen_vae/diffusers.safetensors",
        "qwen_vae/original.safetensors",
    ] {
        let mut other = TensorStore::new();
        other
            .add_file(&fixture_path(file), Component::Vae.prefix())
            .unwrap();
        let source = StoreSource::new(&other, Component::Vae.prefix());
        let loader = WeightLoader::new(&source, None);
        assert!(WanVaeConfig::detect(&loader.root("")).is_err(), "{file}");
    }
}
