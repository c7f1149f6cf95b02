//! Helpers shared by the parity tests: fixture loading, running one graph on the CPU, and
//! comparing against reference outputs with a stated tolerance.
#![allow(dead_code)]

pub mod av;
pub mod device;
mod qwen_fixture;
pub use device::test_backend;
// Not every test binary loads the Qwen fixtures.
#[allow(unused_imports)]
pub use qwen_fixture::{component, qwen_pipeline, qwen_store, QwenParts};

use std::path::PathBuf;
use std::rc::Rc;

use sd_cli::ggml::Backend;
use sd_cli::runner::{
    GraphCtx, ModelWeights, RunOptions, Runner, SourceTensor, StoreSource, WeightBuilder,
    WeightLoader, WeightSource,
};
use sd_cli::tensor::HostTensor;
use sd_cli::tensor::Ne;
use sd_cli::weights::TensorStore;

/// The A1111 parameters text of a PNG that sd-cli wrote (a frame of a video sequence, an image).
pub fn png_parameters(png: &std::path::Path) -> String {
    sd_cli::image_io::read_png_text_pairs(png)
        .unwrap()
        .into_iter()
        .find(|(k, _)| k == sd_cli::image_io::PARAMETERS_KEYWORD)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("{}: no parameters text", png.display()))
}

pub fn fixture_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

pub fn open_fixture(rel: &str) -> TensorStore {
    let path = fixture_path(rel);
    TensorStore::open(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// A reference tensor as (ggml-order shape, values).
pub fn tensor(store: &TensorStore, name: &str) -> HostTensor {
    let info = store
        .get(name)
        .unwrap_or_else(|| panic!("fixture has no tensor '{name}'"));
    let data = store.to_f32(info).unwrap_or_else(|e| panic!("{name}: {e}"));
    HostTensor::new(info.ne, data).expect("consistent fixture tensor")
}

/// The backend in-process tests run on: the CPU, unless `SD_CLI_TEST_BACKEND` names another
/// device (see `device.rs`).
pub fn cpu() -> Rc<Backend> {
    test_backend(2)
}

/// Declares a block's weights from `prefix` of `store` and loads them on the CPU.
pub fn load_block<B>(
    store: &TensorStore,
    prefix: &str,
    declare: impl FnOnce(&WeightBuilder<'_, '_>) -> B,
) -> (B, ModelWeights, Rc<Backend>) {
    let backend = cpu();
    let source = StoreSource::new(store, prefix);
    let loader = WeightLoader::new(&source, None);
    let block = declare(&loader.root(""));
    let weights = loader.finish(&backend, prefix).expect("weights load");
    (block, weights, backend)
}

pub fn runner(weights: Option<ModelWeights>, backend: Rc<Backend>, flash_attn: bool) -> Runner {
    runner_with_kernels(weights, backend, flash_attn, true)
}

/// A runner that may (`blocked`) or may not use the blocked CPU kernels, so tests cover both
/// them and ggml's own kernels (what CPUs without AVX-512 run).
pub fn runner_with_kernels(
    weights: Option<ModelWeights>,
    backend: Rc<Backend>,
    flash_attn: bool,
    blocked: bool,
) -> Runner {
    Runner::new(
        "test",
        backend,
        weights,
        RunOptions {
            flash_attn,
            blocked_kernels: blocked,
            ..RunOptions::default()
        },
    )
}

/// Max |a - b| over all elements, after checking shapes match.
pub fn max_abs_diff(got: &HostTensor, want: &HostTensor) -> f32 {
    assert_eq!(got.ne, want.ne, "shape (ggml order)");
    got.data
        .iter()
        .zip(&want.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// Asserts max |got - want| ≤ tol · max(1, max |want|) and returns the error. `tol` is the
/// CPU's; on a GPU-class test device it widens to that device's floor (`device::tolerance`).
pub fn assert_close(what: &str, got: &HostTensor, want: &HostTensor, tol: f32) -> f32 {
    let tol = device::tolerance(tol);
    let err = max_abs_diff(got, want);
    let scale = want.data.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    assert!(
        err <= tol * scale && err.is_finite(),
        "{what}: max abs error {err} exceeds {tol} x scale {scale}"
    );
    eprintln!("{what}: max abs error {err:.3e} (scale {scale:.2})");
    err
}

pub fn ne_of(t: &HostTensor) -> Ne {
    t.ne
}

pub type Build<'a> = dyn for<'g> FnOnce(&'g GraphCtx<'g>) -> Vec<sd_cli::ggml::Tensor<'g>> + 'a;

/// Writes the tensors of `inputs` (safetensors files, in order) into one safetensors file at
/// `out`, names as stored (how transformers saves a model whose parts the fixtures keep apart).
pub fn merge_safetensors(out: &std::path::Path, inputs: &[&std::path::Path]) {
    let stores: Vec<TensorStore> = inputs
        .iter()
        .map(|p| TensorStore::open(p).unwrap())
        .collect();
    let mut items = Vec::new();
    let mut shapes = Vec::new();
    let mut dtypes = Vec::new();
    for s in &stores {
        for t in s.iter() {
            shapes.push(
                t.shape()
                    .iter()
                    .rev()
                    .map(|&d| d as u64)
                    .collect::<Vec<_>>(),
            );
            dtypes.push(t.source.name().to_uppercase());
        }
    }
    let mut i = 0;
    for s in &stores {
        for t in s.iter() {
            items.push(sd_cli::weights::safetensors::SafetensorsItem {
                name: &t.name,
                dtype: &dtypes[i],
                shape: &shapes[i],
                data: s.get_bytes(t).unwrap(),
            });
            i += 1;
        }
    }
    sd_cli::weights::safetensors::write_safetensors(out, &Default::default(), &items).unwrap();
}

/// Assembles the single-file checkpoint of a fixture recipe (see
/// tests/reference/sd_pipeline_fixtures.py): the tensors of `<stem>.safetensors`, plus every
/// entry of `<stem>.borrow.json` (`name -> [file under base, source name, PyTorch shape]`)
/// copied from the diffusers folder's files. Returns the path of the file written in `dir`.
pub fn assemble_checkpoint(
    base: &std::path::Path,
    stem: &str,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    use std::collections::BTreeMap;
    let recipe: BTreeMap<String, (String, String, Vec<u64>)> =
        serde_json::from_slice(&std::fs::read(base.join(format!("{stem}.borrow.json"))).unwrap())
            .unwrap();
    // The recipe's own tensors under their names as written (a store would normalise them).
    let own_path = base.join(format!("{stem}.safetensors"));
    let own_bytes = std::fs::read(&own_path).unwrap();
    let own = sd_cli::weights::safetensors::parse_safetensors(&own_bytes, &own_path).unwrap();
    let mut sources: BTreeMap<&str, TensorStore> = BTreeMap::new();
    for (file, _, _) in recipe.values() {
        sources
            .entry(file.as_str())
            .or_insert_with(|| TensorStore::open(&base.join(file)).unwrap());
    }
    // (name, dtype, shape, bytes)
    let mut parts: Vec<(String, String, Vec<u64>, Vec<u8>)> = Vec::new();
    for t in &own.tensors {
        let start = t.offset as usize;
        let bytes = own_bytes[start..start + t.len as usize].to_vec();
        parts.push((
            t.name.clone(),
            t.dtype.name().to_uppercase(),
            t.shape.clone(),
            bytes,
        ));
    }
    for (name, (file, src, shape)) in &recipe {
        let store = &sources[file.as_str()];
        let t = store
            .get(src)
            .unwrap_or_else(|| panic!("{file} has no tensor {src}"));
        let bytes = store.get_bytes(t).unwrap().to_vec();
        parts.push((
            name.clone(),
            t.source.name().to_uppercase(),
            shape.clone(),
            bytes,
        ));
    }
    let items: Vec<_> = parts
        .iter()
        .map(
            |(name, dtype, shape, data)| sd_cli::weights::safetensors::SafetensorsItem {
                name,
                dtype,
                shape,
                data,
            },
        )
        .collect();
    let out = dir.join(format!("{stem}.safetensors"));
    sd_cli::weights::safetensors::write_safetensors(&out, &Default::default(), &items).unwrap();
    out
}

/// A reference picture ([W, H, C] in ggml order: PyTorch's [C, H, W], values in [0, 1]) as the
/// interleaved 8-bit pixels a PNG holds.
pub fn image_bytes(t: &HostTensor) -> Vec<u8> {
    let (w, h, channels) = (t.ne[0], t.ne[1], t.ne[2]);
    let mut out = vec![0u8; w * h * channels];
    for c in 0..channels {
        for i in 0..w * h {
            out[i * channels + c] = (t.data[c * w * h + i] * 255.0).round() as u8;
        }
    }
    out
}

/// PSNR in dB between two 8-bit images of the same size (∞ when identical).
pub fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len(), "images of different sizes");
    let mse = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }
}

/// A weight source without one tensor (for the missing-tensor error tests).
pub struct Without<'s> {
    pub inner: StoreSource<'s>,
    pub missing: &'static str,
}

impl WeightSource for Without<'_> {
    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        (name != self.missing)
            .then(|| self.inner.tensor(name))
            .flatten()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}
