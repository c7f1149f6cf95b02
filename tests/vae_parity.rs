//! Parity of the AutoencoderKL (encode and decode) against diffusers, in both weight layouts.
//! Fixtures: tests/reference/vae_fixtures.py → tests/fixtures/vae/{diffusers,ldm,io}.safetensors
//! (a tiny random 3-level VAE with 8 norm groups; LDM names made by inverting diffusers' own
//! single-file conversion, attention weights as 1×1 convs).
//! Tolerance: max abs error ≤ 1e-4 × max(1, |reference|) in f32.

mod common;

use std::rc::Rc;

use common::*;
use sd_cli::models::vae::autoencoder_kl::{AutoencoderKl, AutoencoderKlConfig, VaeLayout};
use sd_cli::runner::{StoreSource, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::{Component, TensorStore};

const TOL: f32 = 1e-4;
/// The fixture's `norm_num_groups` (not recorded in the weights).
const FIXTURE_GROUPS: usize = 8;

/// The fixture's weights as a model file would put them in the store: the diffusers file added
/// under the VAE component prefix (as `--vae` does), the LDM file with its own
/// `first_stage_model.` names (as in a full single-file checkpoint).
fn weights(layout: VaeLayout) -> TensorStore {
    let mut store = TensorStore::new();
    match layout {
        VaeLayout::Diffusers => store
            .add_file(
                &fixture_path("vae/diffusers.safetensors"),
                Component::Vae.prefix(),
            )
            .unwrap(),
        VaeLayout::Ldm => store
            .add_file(&fixture_path("vae/ldm.safetensors"), "")
            .unwrap(),
    }
    store
}

struct Outputs {
    decoded: Option<HostTensor>,
    encoded: Option<[HostTensor; 3]>,
}

/// The fixture input `name` repeated `batch` times along the batch axis (ne[3]).
fn batched(io: &TensorStore, name: &str, batch: usize) -> HostTensor {
    let t = tensor(io, name);
    let [w, h, c, _] = t.ne;
    HostTensor::new([w, h, c, batch], t.data.repeat(batch)).unwrap()
}

fn run(
    store: &TensorStore,
    batch: usize,
    adjust: impl FnOnce(&mut AutoencoderKlConfig),
) -> Outputs {
    let io = open_fixture("vae/io.safetensors");
    let z = batched(&io, "decode.z", batch);
    let x = batched(&io, "encode.x", batch);
    let noise = batched(&io, "encode.noise", batch);

    let backend = cpu();
    let source = StoreSource::new(store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let mut config = AutoencoderKlConfig::detect(&loader.root("")).unwrap();
    config.norm_groups = FIXTURE_GROUPS;
    adjust(&mut config);
    let vae = AutoencoderKl::new(&loader.root(""), config).unwrap();
    let w = loader.finish(&backend, "vae").unwrap();
    let r = runner(Some(w), Rc::clone(&backend), false);
    let got = r
        .compute(|g| {
            let mut outs = Vec::new();
            if vae.has_decoder() {
                outs.push(vae.decode(g, g.input_f32("z", z.ne, z.data.clone())));
            }
            if vae.has_encoder() {
                let (mean, logvar) = vae.encode(g, g.input_f32("x", x.ne, x.data.clone()));
                let eps = g.input_f32("noise", noise.ne, noise.data.clone());
                outs.extend([mean, logvar, AutoencoderKl::sample(g, mean, logvar, eps)]);
            }
            outs
        })
        .unwrap();
    let mut got = got.into_iter();
    let decoded = vae.has_decoder().then(|| got.next().unwrap());
    let encoded = vae.has_encoder().then(|| {
        [
            got.next().unwrap(),
            got.next().unwrap(),
            got.next().unwrap(),
        ]
    });
    Outputs { decoded, encoded }
}

fn check_layout(layout: VaeLayout) {
    let store = weights(layout);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let config = AutoencoderKlConfig::detect(&loader.root("")).unwrap();
    assert_eq!(config.layout, layout);
    assert_eq!(config.block_out_channels, vec![16, 24, 32]);
    assert_eq!(config.layers_per_block, 1);
    assert_eq!(
        (
            config.in_channels,
            config.out_channels,
            config.latent_channels
        ),
        (3, 3, 4)
    );
    assert!(config.mid_attention && config.encoder && config.decoder);
    assert!(config.quant_conv && config.post_quant_conv);
    assert_eq!(config.scale_factor(), 4);

    let io = open_fixture("vae/io.safetensors");
    let out = run(&store, 1, |_| {});
    let what = format!("{layout:?}");
    assert_close(
        &format!("{what} decode"),
        out.decoded.as_ref().unwrap(),
        &tensor(&io, "decode.y"),
        TOL,
    );
    let [mean, logvar, sample] = out.encoded.as_ref().unwrap();
    assert_close(
        &format!("{what} encode mean"),
        mean,
        &tensor(&io, "encode.mean"),
        TOL,
    );
    assert_close(
        &format!("{what} encode logvar"),
        logvar,
        &tensor(&io, "encode.logvar"),
        TOL,
    );
    assert_close(
        &format!("{what} encode sample"),
        sample,
        &tensor(&io, "encode.sample"),
        TOL,
    );
}

#[test]
fn diffusers_layout_matches_diffusers() {
    check_layout(VaeLayout::Diffusers);
}

#[test]
fn ldm_layout_matches_diffusers() {
    check_layout(VaeLayout::Ldm);
}

#[test]
fn decoder_only_and_encoder_only() {
    let io = open_fixture("vae/io.safetensors");
    let store = weights(VaeLayout::Ldm);
    let out = run(&store, 1, |c| c.encoder = false);
    assert!(out.encoded.is_none());
    assert_close(
        "decoder only",
        out.decoded.as_ref().unwrap(),
        &tensor(&io, "decode.y"),
        TOL,
    );
    let out = run(&store, 1, |c| c.decoder = false);
    assert!(out.decoded.is_none());
    assert_close(
        "encoder only",
        &out.encoded.as_ref().unwrap()[0],
        &tensor(&io, "encode.mean"),
        TOL,
    );
}

#[test]
fn batch_of_two_matches_per_item() {
    let io = open_fixture("vae/io.safetensors");
    let out = run(&weights(VaeLayout::Diffusers), 2, |_| {});
    let decoded = out.decoded.unwrap();
    let [mean, logvar, _] = out.encoded.unwrap();
    for (what, got, want) in [
        ("decode", &decoded, "decode.y"),
        ("encode mean", &mean, "encode.mean"),
        ("encode logvar", &logvar, "encode.logvar"),
    ] {
        let want = tensor(&io, want);
        let n = want.len();
        assert_eq!(got.ne, [want.ne[0], want.ne[1], want.ne[2], 2], "{what}");
        for b in 0..2 {
            let item = HostTensor::new(want.ne, got.data[b * n..(b + 1) * n].to_vec()).unwrap();
            assert_close(&format!("batch item {b} {what}"), &item, &want, TOL);
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    // Not a VAE at all.
    let store = open_fixture("nn/blocks.safetensors");
    let source = StoreSource::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let err = AutoencoderKlConfig::detect(&loader.root("")).unwrap_err();
    assert!(err.to_string().contains("decoder.conv_in.weight"), "{err}");

    // 32 groups (the detected default) do not divide the fixture's 16/24 channels.
    let store = weights(VaeLayout::Diffusers);
    let source = StoreSource::new(&store, Component::Vae.prefix());
    let loader = WeightLoader::new(&source, None);
    let config = AutoencoderKlConfig::detect(&loader.root("")).unwrap();
    assert_eq!(config.norm_groups, 32);
    let err = AutoencoderKl::new(&loader.root(""), config.clone()).unwrap_err();
    assert!(err.to_string().contains("groups"), "{err}");

    // A layout claimed against the other layout's names names the missing tensor.
    let config = AutoencoderKlConfig {
        layout: VaeLayout::Ldm,
        norm_groups: FIXTURE_GROUPS,
        ..config
    };
    let err = AutoencoderKl::new(&loader.root(""), config).unwrap_err();
    assert!(err.to_string().contains("missing tensor"), "{err}");
}
