//! PyTorch checkpoints through `TensorStore`: real `torch.save` files (ZIP and legacy; a bare
//! state dict and a Lightning checkpoint with objects beside the weights) read exactly like
//! their safetensors twin, hostile files (code-running pickles, unknown globals, broken
//! archives, limits) give their specific errors and run nothing, `sd-cli -M convert` takes a
//! `.ckpt`, and seeded mutations of valid files never panic.
//! Fixtures: tests/reference/torch_ckpt_fixtures.py.

use std::path::{Path, PathBuf};
use std::process::Command;

use sd_cli::weights::torch::{parse_torch, TorchFormat};
use sd_cli::weights::{FileFormat, TensorStore, WeightsError};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch_ckpt")
        .join(name)
}

/// Where the hostile payloads would write if they ever ran.
const MARKER: &str = "/tmp/sd-cli-torch-ckpt-pwned";

/// The twin's tensors that the Lightning checkpoints leave out (GGUF, which the convert test
/// writes, holds no empty tensors).
const NOT_IN_LIGHTNING: [&str; 1] = ["empty.buf"];

/// The checkpoints' 0-d tensors, which the twin (a safetensors file) leaves out.
const SCALARS: [&str; 2] = ["model_ema.decay", "best_model_score"];

/// Same names, types, shapes, bytes and skipped list as the safetensors twin (besides the
/// checkpoint's 0-d tensors).
fn assert_same_as_twin(store: &TensorStore, what: &str) {
    let twin = TensorStore::open(&fixture("twin.safetensors")).unwrap();
    let skip = |n: &str| what.contains("lightning") && NOT_IN_LIGHTNING.contains(&n);
    let mut names: Vec<&str> = store
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !SCALARS.contains(n))
        .collect();
    let mut want: Vec<&str> = twin
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !skip(n))
        .collect();
    names.sort_unstable();
    want.sort_unstable();
    assert_eq!(names, want, "{what}: tensor names");
    for t in twin.iter().filter(|t| !skip(&t.name)) {
        let got = store.get(&t.name).unwrap();
        assert_eq!(got.dtype, t.dtype, "{what}: {} type", t.name);
        assert_eq!(got.source, t.source, "{what}: {} source type", t.name);
        assert_eq!(got.shape(), t.shape(), "{what}: {} shape", t.name);
        assert_eq!(
            store.get_bytes(got).unwrap(),
            twin.get_bytes(t).unwrap(),
            "{what}: {} bytes",
            t.name
        );
        assert_eq!(
            store.load_bytes(got).unwrap(),
            twin.load_bytes(t).unwrap(),
            "{what}: {} loaded bytes",
            t.name
        );
    }
    let mut skipped = store.skipped().to_vec();
    let mut want_skipped = twin.skipped().to_vec();
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    want_skipped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(skipped, want_skipped, "{what}: skipped tensors");
}

#[test]
fn checkpoints_read_like_their_safetensors_twin() {
    for (name, format) in [
        ("plain.pt", TorchFormat::Zip),
        ("plain_legacy.pt", TorchFormat::Legacy),
        ("lightning.ckpt", TorchFormat::Zip),
        ("lightning_legacy.ckpt", TorchFormat::Legacy),
    ] {
        let store = TensorStore::open(&fixture(name)).unwrap();
        assert_eq!(
            store.files()[0].format,
            FileFormat::PyTorch(format),
            "{name}"
        );
        assert_same_as_twin(&store, name);
        // 0-d tensors load as one value (a LoRA's `.alpha` is one), as in safetensors.
        let decay = store.get("model_ema.decay").expect("model_ema.decay");
        assert_eq!(store.to_f32(decay).unwrap(), vec![0.9999f32], "{name}");
    }
}

#[test]
fn shared_storages_and_tied_weights_map_into_one_range() {
    let raw = std::fs::read(fixture("plain.pt")).unwrap();
    let ckpt = parse_torch(&raw, Path::new("plain.pt")).unwrap();
    let find = |n: &str| ckpt.tensors.iter().find(|t| t.name == n).unwrap();
    let (a, b) = (find("shared.a"), find("shared.b"));
    // One storage of 10 f32: a = [0, 4), b = [4, 10) elements.
    assert_eq!(b.offset, a.offset + 16);
    assert_eq!((a.len, b.len), (16, 24));
    let tied = find("cond_stage_model.transformer.text_model.tied.weight");
    let emb = find("cond_stage_model.transformer.text_model.embeddings.token_embedding.weight");
    assert_eq!((tied.offset, tied.len), (emb.offset, emb.len));
}

#[test]
fn format_is_recognised_by_magic_not_extension() {
    let dir = tempfile::tempdir().unwrap();
    for src in ["plain.pt", "plain_legacy.pt"] {
        let odd = dir.path().join(format!("{src}.weights"));
        std::fs::copy(fixture(src), &odd).unwrap();
        assert_same_as_twin(&TensorStore::open(&odd).unwrap(), src);
    }
}

#[test]
fn diffusers_and_transformers_folders_take_bin_files() {
    for file in ["diffusion_pytorch_model.bin", "pytorch_model.bin"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture("plain.pt"), dir.path().join(file)).unwrap();
        std::fs::write(dir.path().join("config.json"), br#"{"hidden_size": 4}"#).unwrap();
        let store = TensorStore::open(dir.path()).unwrap();
        assert_same_as_twin(&store, file);
        let config = store.files()[0].config.as_ref().expect("config.json kept");
        assert_eq!(config["hidden_size"], 4);
        // The file named directly also brings its config.json.
        let store = TensorStore::open(&dir.path().join(file)).unwrap();
        assert!(store.files()[0].config.is_some(), "{file}");
    }
}

#[test]
fn a_bin_index_brings_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let shard = "pytorch_model-00001-of-00001.bin";
    std::fs::copy(fixture("plain.pt"), dir.path().join(shard)).unwrap();
    let index = format!(
        r#"{{"metadata": {{}}, "weight_map": {{"shared.a": "{shard}", "i8.buf": "{shard}"}}}}"#
    );
    std::fs::write(dir.path().join("pytorch_model.bin.index.json"), index).unwrap();
    assert_same_as_twin(&TensorStore::open(dir.path()).unwrap(), "bin index");
}

#[test]
fn a_prefix_and_a_part_apply_as_for_safetensors() {
    let mut store = TensorStore::new();
    store
        .add_part(&fixture("lightning.ckpt"), "", "first_stage_model.")
        .unwrap();
    let names: Vec<&str> = store.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "first_stage_model.decoder.conv_in.weight",
            "first_stage_model.decoder.conv_in.bias"
        ]
    );
}

/// Loads a hostile fixture: it must fail, and its payload must not have run.
fn hostile(name: &str) -> WeightsError {
    let _ = std::fs::remove_file(MARKER);
    let err = match TensorStore::open(&fixture(name)) {
        Ok(_) => panic!("{name}: accepted"),
        Err(e) => e,
    };
    assert!(!Path::new(MARKER).exists(), "{name}: the payload ran");
    assert!(err.to_string().contains(name), "{name}: {err}");
    err
}

#[test]
fn code_running_pickles_are_refused_naming_the_global() {
    for (file, global) in [
        ("os_system.pt", "posix.system"),
        ("os_system_legacy.pt", "posix.system"),
        ("eval.pt", "__builtin__.eval"),
        ("getattr.pt", "__builtin__.getattr"),
        ("popen.pt", "subprocess.Popen"),
    ] {
        let e = hostile(file);
        assert!(
            matches!(&e, WeightsError::PickleRefused { global: g, .. } if g == global),
            "{file}: {e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!(
                "refuses to call {global}: a pickle that runs code"
            )),
            "{file}: {msg}"
        );
    }
}

#[test]
fn unknown_globals_are_never_applied() {
    for (file, global) in [
        ("unknown_reduce.pt", "evilmod.run"),
        ("whole_module.pt", "torch.nn.modules.linear.Linear"),
    ] {
        let e = hostile(file);
        assert!(
            matches!(&e, WeightsError::PickleRefused { global: g, .. } if g == global),
            "{file}: {e:?}"
        );
        assert!(e.to_string().contains("state_dict()"), "{file}: {e}");
    }
}

#[test]
fn broken_archives_and_pickles_give_specific_errors() {
    use WeightsError as E;
    let e = hostile("truncated.pt");
    assert!(matches!(e, E::BadZip { .. }), "{e:?}");
    // Cut inside the last storage's bytes or its element count, by the storage sizes.
    let e = hostile("truncated_legacy.pt");
    assert!(
        matches!(e, E::OffsetOutOfBounds { .. } | E::Truncated { .. }),
        "{e:?}"
    );
    let e = hostile("offset_past_end.pt");
    assert!(
        matches!(e, E::BadZip { ref reason, .. } if reason.contains("past the end")),
        "{e:?}"
    );
    let e = hostile("missing_storage.pt");
    assert!(
        matches!(e, E::BadZip { ref reason, .. } if reason.contains("/data/1")),
        "{e:?}"
    );
    let e = hostile("compressed.pt");
    assert!(
        matches!(e, E::UnsupportedTorch { ref reason, .. } if reason.contains("compressed")),
        "{e:?}"
    );
    let e = hostile("big_endian.pt");
    assert!(
        matches!(e, E::UnsupportedTorch { ref reason, .. } if reason.contains("byte order")),
        "{e:?}"
    );
    let e = hostile("transposed.pt");
    assert!(
        matches!(e, E::BadShape { ref key, ref reason, .. } if key == "t" && reason.contains("contiguous")),
        "{e:?}"
    );
    let e = hostile("deep_marks.pt");
    assert!(
        matches!(e, E::BadPickle { ref reason, .. } if reason.contains("MARK")),
        "{e:?}"
    );
    // 20000 nested dicts are walked without recursion; there is no tensor in them.
    let e = hostile("deep_dicts.pt");
    assert!(
        matches!(e, E::UnsupportedTorch { ref reason, .. } if reason.contains("no tensors")),
        "{e:?}"
    );
    for file in ["huge_length.pt", "huge_length8.pt"] {
        let e = hostile(file);
        assert!(
            matches!(e, E::BadPickle { ref reason, .. } if reason.contains("ends inside")),
            "{file}: {e:?}"
        );
    }
}

#[test]
fn convert_turns_a_ckpt_into_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lightning.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-M", "convert", "-m"])
        .arg(fixture("lightning.ckpt"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let gguf = TensorStore::open(&out).unwrap();
    let twin = TensorStore::open(&fixture("twin.safetensors")).unwrap();
    // The checkpoint's two 0-d tensors come along as one-value tensors.
    assert_eq!(
        gguf.len(),
        twin.len() - NOT_IN_LIGHTNING.len() + SCALARS.len()
    );
    for t in twin
        .iter()
        .filter(|t| !NOT_IN_LIGHTNING.contains(&t.name.as_str()))
    {
        let g = gguf.get(&t.name).unwrap();
        assert_eq!(g.shape(), t.shape(), "{}", t.name);
        assert_eq!(
            gguf.to_f32(g).unwrap(),
            twin.to_f32(t).unwrap(),
            "{}",
            t.name
        );
    }
}

/// Checkpoints past 4 GB (ZIP64 sizes and offsets; a legacy storage past 4 GB). Too big to
/// commit; make them with
/// `python3 -c "import torch; b = torch.zeros(4_400_000_000, dtype=torch.uint8); s = torch.arange(4.); torch.save({'big': b, 'small': s}, '/tmp/big.pt'); torch.save({'small': s, 'big': b}, '/tmp/big_legacy.pt', _use_new_zipfile_serialization=False)"`
/// and run with `SD_CLI_BIG_CKPTS=/tmp/big.pt,/tmp/big_legacy.pt cargo test --release
/// --test torch_ckpt -- --ignored`.
#[test]
#[ignore]
fn reads_checkpoints_past_4_gb() {
    let paths = std::env::var("SD_CLI_BIG_CKPTS").expect("set SD_CLI_BIG_CKPTS");
    for p in paths.split(',') {
        let store = TensorStore::open(Path::new(p)).unwrap();
        let small = store.get("small").unwrap();
        assert_eq!(store.to_f32(small).unwrap(), [0.0, 1.0, 2.0, 3.0], "{p}");
        assert!(
            small.offset > u32::MAX as usize,
            "{p}: 'small' lies before 4 GB"
        );
        let skipped = store.skipped();
        assert_eq!(skipped.len(), 1, "{p}: the uint8 tensor is skipped");
        assert_eq!(skipped[0].0, "big");
    }
}

/// xorshift64*: seeded and reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn mutations_never_panic() {
    let path = Path::new("mutated.pt");
    for (seed, file) in [
        (1u64, "plain.pt"),
        (2, "plain_legacy.pt"),
        (3, "lightning.ckpt"),
    ] {
        let good = std::fs::read(fixture(file)).unwrap();
        // Every truncation of the legacy file (its pickles sit at the start); sampled for ZIPs.
        let step = if file.ends_with("legacy.pt") { 1 } else { 7 };
        for n in (0..good.len()).step_by(step) {
            let _ = parse_torch(&good[..n], path);
        }
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut accepted = 0;
        for _ in 0..1500 {
            let mut b = good.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(b.len());
                b[at] = match rng.below(4) {
                    0 => b[at] ^ (1 << rng.below(8)),
                    1 => 0xff,
                    2 => 0,
                    _ => rng.next() as u8,
                };
            }
            if let Ok(c) = parse_torch(&b, path) {
                accepted += 1;
                for t in &c.tensors {
                    assert!(
                        t.offset + t.len <= b.len() as u64,
                        "{file}: {} past the end",
                        t.name
                    );
                }
            }
        }
        eprintln!("{file}: {accepted} of 1500 mutations still parse");
    }
}
