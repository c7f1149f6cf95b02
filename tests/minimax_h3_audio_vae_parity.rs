//! Parity of the MiniMax-H3 audio VAE (encode to the normalised posterior mean, decode a
//! normalised latent to stereo samples, detection) against diffusers'
//! `AutoencoderKLMiniMaxH3Audio` with the pipeline's latent normalisation, in both layouts.
//! Fixtures: tests/reference/minimax_h3_audio_vae_fixtures.py → tests/fixtures/minimax_h3_audio_vae/
//! (model A: hop 6, 4 heads pooled unevenly to 8 channels, two AMP blocks of two dilations,
//! hyper-parameters from config.json; model B: hop 12, released defaults for heads and AMP
//! dilations; each as a diffusers folder (weight-norm pairs) and as an original single file
//! (folded kernels, statistics tensors)).
//! Tolerance: max abs error ≤ 2e-5 × max(1, |reference|) in f32 (|reference| ≤ 5 here, so at
//! most 1e-4 absolute; measured ≤ 1.3e-5 encode, ≤ 2.4e-6 decode, SNR ≥ 112 dB); the SNR is
//! printed.

mod common;

use std::rc::Rc;

use common::*;
use sd_cli::models::vae::minimax_h3_audio_vae::{
    AudioVaeLayout, AudioVaeSource, MiniMaxH3AudioVae, MiniMaxH3AudioVaeConfig,
};
use sd_cli::runner::{Runner, SourceTensor, StoreSource, WeightLoader, WeightSource};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const TOL: f32 = 2e-5;

fn weights(model: &str, layout: AudioVaeLayout) -> TensorStore {
    let file = match layout {
        AudioVaeLayout::Diffusers => format!("minimax_h3_audio_vae/{model}"),
        AudioVaeLayout::Original => format!("minimax_h3_audio_vae/{model}_original.safetensors"),
    };
    let mut store = TensorStore::new();
    store.add_file(&fixture_path(&file), "").unwrap();
    store
}

fn config_json(model: &str) -> serde_json::Value {
    let path = fixture_path(&format!("minimax_h3_audio_vae/{model}/config.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A source that hides the tensors `hide` selects.
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

fn detect(
    source: &dyn WeightSource,
    json: Option<&serde_json::Value>,
) -> Result<MiniMaxH3AudioVaeConfig, sd_cli::runner::RunnerError> {
    let source = AudioVaeSource::new(source);
    let loader = WeightLoader::new(&source, None);
    MiniMaxH3AudioVaeConfig::detect(&loader.root(""), &source, json)
}

fn build(
    source: &dyn WeightSource,
    json: Option<&serde_json::Value>,
) -> Result<(MiniMaxH3AudioVae, Runner), sd_cli::runner::RunnerError> {
    build_with(source, json, true)
}

/// [`build`] with (`blocked`) or without the blocked CPU kernels.
fn build_with(
    source: &dyn WeightSource,
    json: Option<&serde_json::Value>,
    blocked: bool,
) -> Result<(MiniMaxH3AudioVae, Runner), sd_cli::runner::RunnerError> {
    let source = AudioVaeSource::new(source);
    let loader = WeightLoader::new(&source, None);
    let config = MiniMaxH3AudioVaeConfig::detect(&loader.root(""), &source, json)?;
    let vae = MiniMaxH3AudioVae::new(&loader.root(""), config)?;
    let backend = cpu();
    let w = loader.finish(&backend, "minimax_h3_audio_vae")?;
    Ok((
        vae,
        runner_with_kernels(Some(w), Rc::clone(&backend), false, blocked),
    ))
}

/// Signal-to-noise ratio of `got` against `want`, in dB.
fn snr_db(got: &HostTensor, want: &HostTensor) -> f64 {
    let (mut signal, mut noise) = (0.0f64, 0.0f64);
    for (g, w) in got.data.iter().zip(&want.data) {
        signal += f64::from(*w) * f64::from(*w);
        noise += f64::from(g - w) * f64::from(g - w);
    }
    10.0 * (signal / noise.max(1e-30)).log10()
}

fn compare(what: &str, got: &HostTensor, want: &HostTensor) {
    let err = assert_close(what, got, want, TOL);
    eprintln!("{what}: max abs {err:.3e}, SNR {:.1} dB", snr_db(got, want));
}

fn check_config(c: &MiniMaxH3AudioVaeConfig, model: &str, layout: AudioVaeLayout) {
    assert_eq!(c.layout, layout);
    assert!(c.encoder && c.decoder);
    assert_eq!(c.sample_rate, 32_000);
    let stats = c.latent_stats.as_ref().expect("statistics");
    let json = config_json(model);
    let mean0 = json["latents_mean"][0].as_f64().unwrap() as f32;
    assert_eq!(stats.mean()[0], mean0);
    match model {
        "a" => {
            assert_eq!((c.encoder_dim, c.latent_dim, c.latent_channels), (4, 48, 8));
            assert_eq!(c.encoder_rates, vec![2, 3]);
            assert_eq!(c.num_heads, 4);
            assert_eq!(c.decoder_dim, 16);
            assert_eq!(
                (c.decoder_rates.clone(), c.decoder_kernels.clone()),
                (vec![3, 2], vec![7, 4])
            );
            assert_eq!(c.resblock_kernels, vec![3, 5]);
            assert_eq!(c.resblock_dilations, vec![vec![1, 2], vec![1, 3]]);
            assert_eq!(c.hop_length(), 6);
        }
        _ => {
            assert_eq!((c.encoder_dim, c.latent_dim, c.latent_channels), (2, 32, 4));
            assert_eq!(c.encoder_rates, vec![2, 2, 3]);
            assert_eq!(c.num_heads, 8);
            assert_eq!(c.decoder_dim, 16);
            assert_eq!(
                (c.decoder_rates.clone(), c.decoder_kernels.clone()),
                (vec![2, 3, 2], vec![4, 5, 4])
            );
            assert_eq!(c.resblock_kernels, vec![3, 7, 11]);
            assert_eq!(c.resblock_dilations, vec![vec![1, 3, 5]; 3]);
            assert_eq!(c.hop_length(), 12);
        }
    }
}

fn check(model: &str, layout: AudioVaeLayout, json: Option<&serde_json::Value>) {
    check_with(model, layout, json, true);
}

fn check_with(
    model: &str,
    layout: AudioVaeLayout,
    json: Option<&serde_json::Value>,
    blocked: bool,
) {
    let store = weights(model, layout);
    let json = json.or_else(|| store.files().iter().find_map(|f| f.config.as_ref()));
    let source = StoreSource::new(&store, "");
    check_config(&detect(&source, json).unwrap(), model, layout);
    let (vae, runner) = build_with(&source, json, blocked).unwrap();

    let io = open_fixture("minimax_h3_audio_vae/io.safetensors");
    let what = format!("model {model}, {layout:?}, blocked kernels {blocked}");

    // Decode: normalised latent [T, C, 2] → two channels of samples.
    let z = tensor(&io, &format!("{model}.decode.z"));
    let want = tensor(&io, &format!("{model}.decode.y"));
    let channels = vae.decode_latent(&runner, &z).unwrap();
    assert_eq!(channels.len(), 2);
    let got = HostTensor::new(want.ne, channels.concat()).expect("decoded length");
    compare(&format!("{what} decode"), &got, &want);

    // Encode: stereo samples → normalised posterior mean [T, C, 2].
    let x = tensor(&io, &format!("{model}.encode.x"));
    let n = x.ne[0];
    let stereo: Vec<Vec<f32>> = x.data.chunks(n).map(<[f32]>::to_vec).collect();
    let got = vae.encode_channels(&runner, &stereo).unwrap();
    compare(
        &format!("{what} encode (normalised mean)"),
        &got,
        &tensor(&io, &format!("{model}.encode.normalized")),
    );

    // The graph entry point: raw posterior mean of the hop-padded waveform.
    let hop = vae.hop_length();
    let padded = n.div_ceil(hop) * hop;
    let mut data = Vec::new();
    for ch in &stereo {
        data.extend_from_slice(ch);
        data.resize(data.len() + padded - n, 0.0);
    }
    let raw = runner
        .compute(|g| vec![vae.encode_mean(g, g.input_f32("x", [padded, 1, 2, 1], data))])
        .unwrap()
        .remove(0);
    compare(
        &format!("{what} encode (raw mean)"),
        &raw,
        &tensor(&io, &format!("{model}.encode.mean")),
    );
}

#[test]
fn model_a_diffusers_folder_matches_diffusers() {
    check("a", AudioVaeLayout::Diffusers, None);
}

#[test]
fn model_a_original_file_with_config_json_matches_diffusers() {
    check("a", AudioVaeLayout::Original, Some(&config_json("a")));
}

#[test]
fn model_b_diffusers_folder_matches_diffusers() {
    check("b", AudioVaeLayout::Diffusers, None);
}

#[test]
fn model_b_original_file_alone_matches_diffusers() {
    check("b", AudioVaeLayout::Original, None);
}

#[test]
fn model_a_with_ggml_kernels_only() {
    // What CPUs without AVX-512/AVX2 run (and the path other backends mirror).
    check_with("a", AudioVaeLayout::Diffusers, None, false);
}

#[test]
fn original_file_without_what_the_weights_cannot_say_is_an_error() {
    // Model A's dilations (two per AMP block) and rates are not the released ones: without
    // its config.json the file alone cannot be decoded, and the error says what to give.
    let store = weights("a", AudioVaeLayout::Original);
    let source = StoreSource::new(&store, "");
    let err = detect(&source, None).unwrap_err().to_string();
    assert!(
        err.contains("decoder.resblocks.0.convs1") && err.contains("config.json"),
        "{err}"
    );
}

#[test]
fn missing_and_misshapen_tensors_are_errors_naming_them() {
    let store = weights("b", AudioVaeLayout::Diffusers);
    let source = Hiding {
        inner: StoreSource::new(&store, ""),
        hide: |n| n == "decoder.resblocks.4.convs2.1.weight_v",
    };
    let json = store.files().iter().find_map(|f| f.config.as_ref());
    let err = build(&source, json)
        .err()
        .expect("missing tensor")
        .to_string();
    assert!(err.contains("decoder.resblocks.4.convs2.1.weight"), "{err}");

    let store_o = weights("b", AudioVaeLayout::Original);
    let source = Hiding {
        inner: StoreSource::new(&store_o, ""),
        hide: |n| n == "pre_block.attn.v_bias",
    };
    let err = build(&source, None)
        .err()
        .expect("missing tensor")
        .to_string();
    assert!(err.contains("pre_block.attn.v_bias"), "{err}");

    // A configuration that disagrees with the file: the shape error names the weight.
    let source = StoreSource::new(&store_o, "");
    let wrapped = AudioVaeSource::new(&source);
    let loader = WeightLoader::new(&wrapped, None);
    let mut config = MiniMaxH3AudioVaeConfig::detect(&loader.root(""), &wrapped, None).unwrap();
    config.latent_dim += 4;
    let err = MiniMaxH3AudioVae::new(&loader.root(""), config)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("encoder.block.5.weight") || err.contains("pre_block"),
        "{err}"
    );
}

#[test]
fn decoder_only_file_and_bad_inputs() {
    let store = weights("b", AudioVaeLayout::Original);
    let source = Hiding {
        inner: StoreSource::new(&store, ""),
        hide: |n| {
            n.starts_with("encoder.")
                || n.starts_with("pre_block.")
                || n.starts_with("mean_proj.")
                || n.starts_with("logs_proj.")
        },
    };
    let (vae, runner) = build(&source, None).unwrap();
    assert!(vae.has_decoder() && !vae.has_encoder());
    let io = open_fixture("minimax_h3_audio_vae/io.safetensors");
    let z = tensor(&io, "b.decode.z");
    let channels = vae.decode_latent(&runner, &z).unwrap();
    let want = tensor(&io, "b.decode.y");
    compare(
        "decoder-only file",
        &HostTensor::new(want.ne, channels.concat()).unwrap(),
        &want,
    );
    let err = vae
        .encode_channels(&runner, &[vec![0.0; 24]])
        .unwrap_err()
        .to_string();
    assert!(err.contains("encoder"), "{err}");

    // A latent with the wrong channel count, ragged channels.
    let (vae, runner) = build(&StoreSource::new(&store, ""), None).unwrap();
    let wrong = HostTensor::zeros([5, 3, 2, 1]);
    assert!(vae.decode_latent(&runner, &wrong).is_err());
    assert!(vae
        .encode_channels(&runner, &[vec![0.0; 24], vec![0.0; 12]])
        .is_err());
    assert!(vae.encode_channels(&runner, &[]).is_err());
}

#[test]
fn other_models_are_not_detected() {
    for file in [
        "wan_vae/a_original.safetensors",
        "vae/diffusers.safetensors",
    ] {
        let mut store = TensorStore::new();
        store.add_file(&fixture_path(file), "").unwrap();
        let source = StoreSource::new(&store, "");
        assert!(detect(&source, None).is_err(), "{file}");
    }
}

/// The released model's architecture (every name and shape of the original single file, from
/// diffusers' default config) with random weights: detection falls back to the released
/// heads, rates and dilations; a short clip encodes and decodes to finite samples of the right
/// length. About 1.3 GB of memory, so run it on request:
/// `cargo test --release --test minimax_h3_audio_vae_parity -- --ignored`.
#[test]
#[ignore]
fn released_size_model_runs() {
    use sd_cli::runner::MemorySource;
    let path = fixture_path("minimax_h3_audio_vae/released_shapes.json");
    let shapes: std::collections::BTreeMap<String, Vec<usize>> =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let mut source = MemorySource::new();
    for (name, shape) in &shapes {
        let mut ne = [1usize; 4];
        for (i, d) in shape.iter().rev().enumerate() {
            ne[i] = *d;
        }
        let n: usize = shape.iter().product();
        let fan_in = n / shape[0].max(1);
        let data: Vec<f32> = if name.ends_with(".alpha") && shape.len() == 3 {
            vec![1.0; n] // Snake frequency
        } else if name.ends_with("filter") {
            vec![1.0 / n as f32; n]
        } else if name.contains("norm") && name.ends_with("weight") {
            vec![1.0; n]
        } else if name.ends_with("weight") {
            let s = (3.0 / fan_in as f32).sqrt();
            (0..n).map(|_| next() * s).collect()
        } else {
            vec![0.0; n] // biases, SnakeBeta log-scales, the zero key bias
        };
        source.insert(name.clone(), ne, data);
    }
    source.insert("latents_mean", [32, 1, 1, 1], vec![0.0; 32]);
    source.insert("latents_std", [32, 1, 1, 1], vec![1.0; 32]);
    let (vae, runner) = build(&source, None).unwrap();
    let c = vae.config();
    assert_eq!(
        (c.encoder_dim, c.latent_dim, c.latent_channels),
        (64, 2048, 32)
    );
    assert_eq!(c.encoder_rates, vec![2, 4, 4, 5, 5]);
    assert_eq!(c.decoder_rates, vec![5, 5, 2, 2, 2, 2, 2]);
    assert_eq!(
        (c.num_heads, c.decoder_dim, c.sample_rate),
        (8, 1024, 32_000)
    );
    assert_eq!(c.resblock_dilations, vec![vec![1, 3, 5]; 3]);
    assert_eq!(vae.hop_length(), 800);

    // `SD_CLI_AUDIO_FRAMES=40` times one second of audio.
    let t = std::env::var("SD_CLI_AUDIO_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let z = HostTensor::new([t, 32, 2, 1], (0..t * 64).map(|_| next()).collect()).unwrap();
    let start = std::time::Instant::now();
    let channels = vae.decode_latent(&runner, &z).unwrap();
    eprintln!(
        "released-size decode of {t} frames: {:.2}s",
        start.elapsed().as_secs_f64()
    );
    assert_eq!(channels.len(), 2);
    assert!(channels
        .iter()
        .all(|ch| ch.len() == t * 800 && ch.iter().all(|v| v.is_finite())));

    let start = std::time::Instant::now();
    let z = vae.encode_channels(&runner, &channels).unwrap();
    eprintln!(
        "released-size encode of {} samples: {:.2}s",
        t * 800,
        start.elapsed().as_secs_f64()
    );
    assert_eq!(z.ne, [t, 32, 2, 1]);
    assert!(z.data.iter().all(|v| v.is_finite()));
}

#[test]
fn wav_round_trip_through_the_vae() {
    use sd_cli::image_io::audio::{read_wav, write_wav, Audio};
    let store = weights("b", AudioVaeLayout::Original);
    let (vae, runner) = build(&StoreSource::new(&store, ""), None).unwrap();
    let io = open_fixture("minimax_h3_audio_vae/io.safetensors");
    let dir = std::env::temp_dir().join(format!("sd_cli_mmh3_audio_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // Generated audio: decode → 16-bit stereo WAV at the VAE's rate.
    let channels = vae
        .decode_latent(&runner, &tensor(&io, "b.decode.z"))
        .unwrap();
    let out = Audio {
        sample_rate: vae.sample_rate(),
        channels,
    };
    let path = dir.join("generated.wav");
    write_wav(&path, &out).unwrap();
    let back = read_wav(&path).unwrap();
    assert_eq!(
        (back.sample_rate, back.channels.len(), back.len()),
        (32_000, 2, out.len())
    );

    // Reference audio: the fixture's stereo clip as a mono 16 kHz file is upmixed and resampled
    // to 32 kHz stereo, then encoded (16-bit rounding and interpolation change the clip, so
    // only the shapes and finiteness are checked here; parity is the tests above).
    let x = tensor(&io, "b.encode.x");
    let n = x.ne[0];
    let left = &x.data[..n];
    let half: Vec<f32> = left.iter().step_by(2).copied().collect();
    let path = dir.join("reference.wav");
    write_wav(
        &path,
        &Audio {
            sample_rate: 16_000,
            channels: vec![half.clone()],
        },
    )
    .unwrap();
    let reference = read_wav(&path).unwrap().to_stereo(vae.sample_rate());
    assert_eq!(reference.channels.len(), 2);
    assert_eq!(reference.channels[0], reference.channels[1]);
    assert_eq!(reference.len(), 2 * half.len());
    let z = vae.encode_channels(&runner, &reference.channels).unwrap();
    assert_eq!(z.ne, [reference.len().div_ceil(vae.hop_length()), 4, 2, 1]);
    assert!(z.data.iter().all(|v| v.is_finite()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn load_entry_point_skips_the_encoder_unless_asked() {
    use sd_cli::runner::{LoadOptions, RunOptions};
    let opts = || LoadOptions {
        backend: cpu(),
        wtype: None,
        run: RunOptions::default(),
        adapters: None,
    };
    let store = weights("a", AudioVaeLayout::Diffusers);
    let json = store.files().iter().find_map(|f| f.config.as_ref());
    let source = StoreSource::new(&store, "");
    let loaded = MiniMaxH3AudioVae::load("audio_vae", &source, json, opts(), false).unwrap();
    assert!(loaded.model.has_decoder() && !loaded.model.has_encoder());
    let io = open_fixture("minimax_h3_audio_vae/io.safetensors");
    let want = tensor(&io, "a.decode.y");
    let got = loaded
        .model
        .decode_latent(&loaded.runner, &tensor(&io, "a.decode.z"))
        .unwrap();
    compare(
        "load(): decode",
        &HostTensor::new(want.ne, got.concat()).unwrap(),
        &want,
    );
    let loaded = MiniMaxH3AudioVae::load("audio_vae", &source, json, opts(), true).unwrap();
    assert!(loaded.model.has_encoder());

    let dec_only = Hiding {
        inner: StoreSource::new(&store, ""),
        hide: |n| n.starts_with("encoder."),
    };
    let err = MiniMaxH3AudioVae::load("audio_vae", &dec_only, json, opts(), true)
        .err()
        .expect("no encoder")
        .to_string();
    assert!(err.contains("encoder"), "{err}");
}
