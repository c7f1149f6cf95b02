//! [`TensorStore`]: every tensor of every loaded model file, by name, with its ggml type,
//! shape (ggml `ne` order), file and byte range. The store owns the memory maps; no tensor data
//! is copied until a caller asks for it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::dtype::{convert_for_load, to_f32, SourceDType};
use super::error::{Result, WeightsError};
use super::gguf::{parse_gguf, GgufMetadata, MAX_DIMS};
use super::mmap::MappedFile;
use super::names::normalize_name;
use super::safetensors::{parse_index, parse_safetensors};
use super::torch::{is_torch_legacy, is_torch_zip, parse_torch, TorchFormat};
use crate::dtype::DType;

/// Container format of a mapped file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Gguf,
    Safetensors,
    /// A `torch.save` checkpoint (`.ckpt`, `.pt`, `.pth`, `.bin`), ZIP or legacy; see
    /// [`super::torch`].
    PyTorch(TorchFormat),
}

/// What the store knows about one mapped file.
#[derive(Debug, Clone)]
pub struct FileMeta {
    pub path: PathBuf,
    pub format: FileFormat,
    /// Prefix given to [`TensorStore::add_file`].
    pub prefix: String,
    /// GGUF key/value metadata (empty for other formats).
    pub gguf: GgufMetadata,
    /// safetensors `__metadata__` (empty for other formats).
    pub safetensors: BTreeMap<String, String>,
    /// `config.json` of the diffusers folder this file came from, if any.
    pub config: Option<Value>,
}

/// One tensor in the store.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Name in the store: the file's name, normalised and prefixed (see [`normalize_name`]).
    pub name: String,
    /// ggml type the tensor is loaded as.
    pub dtype: DType,
    /// Type of the bytes in the file ([`SourceDType::Ggml`] when identical to `dtype`).
    pub source: SourceDType,
    /// ggml order (innermost first); unused trailing entries are 1.
    pub ne: [usize; 4],
    /// Number of meaningful entries of `ne` (1..=4).
    pub n_dims: usize,
    /// Index into [`TensorStore::files`].
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: usize,
    /// Byte length in the file (in `source` type).
    pub len: usize,
}

impl TensorInfo {
    /// The meaningful part of `ne` (ggml order).
    pub fn shape(&self) -> &[usize] {
        &self.ne[..self.n_dims]
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        // Bounded by the file size at load time; saturating keeps hand-made infos panic-free.
        self.ne.iter().fold(1usize, |a, &n| a.saturating_mul(n))
    }

    /// Bytes the tensor occupies once loaded as `dtype`.
    pub fn load_len(&self) -> usize {
        let ne: Vec<u64> = self.ne.iter().map(|&n| n as u64).collect();
        self.dtype.nbytes(&ne).unwrap_or(u64::MAX) as usize
    }
}

/// Tensors from one or more model files, in load order.
#[derive(Debug, Default)]
pub struct TensorStore {
    maps: Vec<MappedFile>,
    files: Vec<FileMeta>,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    skipped: Vec<(String, SourceDType)>,
    /// While adding: keep only names starting with this ("" keeps all).
    keep: String,
}

/// Candidate weight files inside a diffusers component folder, in order of preference
/// (PyTorch `.bin` files only when there is no safetensors file).
const FOLDER_FILES: [&str; 10] = [
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.fp16.safetensors",
    "model.safetensors.index.json",
    "model.safetensors",
    "model.fp16.safetensors",
    "diffusion_pytorch_model.bin.index.json",
    "diffusion_pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
];

/// Largest `config.json` read from a folder.
const MAX_CONFIG_LEN: u64 = 16 << 20;

impl TensorStore {
    pub fn new() -> TensorStore {
        TensorStore::default()
    }

    /// Opens one model file or folder with no prefix.
    pub fn open(path: &Path) -> Result<TensorStore> {
        let mut store = TensorStore::new();
        store.add_file(path, "")?;
        Ok(store)
    }

    /// Adds a GGUF file, a safetensors file, a PyTorch checkpoint (`torch.save` output in
    /// either format, recognised by its magic bytes), a `*.safetensors.index.json` or
    /// `*.bin.index.json` (all shards), or a diffusers component folder. Tensor names are normalised with [`normalize_name`] using
    /// `prefix` (e.g. `"model.diffusion_model."`). Names already in the store are rejected.
    /// A file that fails validation leaves the store unchanged; for a sharded index, shards
    /// added before the failing one stay in the store.
    ///
    /// A folder's `config.json` is kept with its files; so is the `config.json` beside a
    /// weights file named as diffusers names a component's weights
    /// (`vae/diffusion_pytorch_model.safetensors`, `text_encoder/model.safetensors`, shards and
    /// their index), since that file means the same as its folder.
    pub fn add_file(&mut self, path: &Path, prefix: &str) -> Result<()> {
        self.add_part(path, prefix, "")
    }

    /// Like [`TensorStore::add_file`], keeping only the tensors whose store names start with
    /// `keep` (one component of a checkpoint that holds several).
    pub fn add_part(&mut self, path: &Path, prefix: &str, keep: &str) -> Result<()> {
        let meta = fs::metadata(path).map_err(|e| WeightsError::io(path, e))?;
        let saved = std::mem::replace(&mut self.keep, keep.to_string());
        let result = if meta.is_dir() {
            self.add_folder(path, prefix)
        } else {
            let config = beside_config(path)?;
            let is_index = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".json"));
            if is_index {
                self.add_index(path, prefix, config)
            } else {
                self.add_single(path, prefix, config)
            }
        };
        self.keep = saved;
        result
    }

    fn add_folder(&mut self, dir: &Path, prefix: &str) -> Result<()> {
        let config_path = dir.join("config.json");
        let config = if config_path.is_file() {
            Some(read_json(&config_path)?)
        } else {
            None
        };
        for name in FOLDER_FILES {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return if name.ends_with(".json") {
                    self.add_index(&candidate, prefix, config)
                } else {
                    self.add_single(&candidate, prefix, config)
                };
            }
        }
        Err(WeightsError::NotAModel {
            path: dir.to_path_buf(),
            reason: format!("the folder holds none of {}", FOLDER_FILES.join(", ")),
        })
    }

    fn add_index(&mut self, path: &Path, prefix: &str, config: Option<Value>) -> Result<()> {
        let text = read_limited(path, super::safetensors::MAX_INDEX_LEN)?;
        let index = parse_index(&text, path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let first_file = self.files.len();
        for shard in index.shards() {
            self.add_single(&dir.join(shard), prefix, config.clone())?;
        }
        // Every tensor the index names must be in the shard it names.
        for (name, shard) in &index.weight_map {
            let full = normalize_name(name, prefix);
            let shard_path = dir.join(shard);
            let found = self
                .index
                .get(&full)
                .map(|&i| &self.tensors[i])
                .filter(|t| t.file >= first_file && self.files[t.file].path == shard_path);
            let skipped = self.skipped.iter().any(|(n, _)| *n == full);
            if found.is_none() && !skipped && full.starts_with(&self.keep) {
                return Err(WeightsError::MissingTensor {
                    key: name.clone(),
                    file: shard_path,
                });
            }
        }
        Ok(())
    }

    fn add_single(&mut self, path: &Path, prefix: &str, config: Option<Value>) -> Result<()> {
        let map = MappedFile::open(path)?;
        let bytes = map.bytes();
        let file = self.files.len();
        let mut meta = FileMeta {
            path: path.to_path_buf(),
            format: FileFormat::Safetensors,
            prefix: prefix.to_string(),
            gguf: GgufMetadata::default(),
            safetensors: BTreeMap::new(),
            config,
        };
        let mut new = Vec::new();
        if bytes.starts_with(b"GGUF") {
            let header = parse_gguf(bytes, path)?;
            meta.format = FileFormat::Gguf;
            meta.gguf = header.metadata;
            for t in header.tensors {
                let (ne, n_dims) = ggml_ne(&t.ne, &t.name, path)?;
                new.push(TensorInfo {
                    name: normalize_name(&t.name, prefix),
                    dtype: t.dtype,
                    source: SourceDType::Ggml(t.dtype),
                    ne,
                    n_dims,
                    file,
                    offset: t.offset as usize,
                    len: t.len as usize,
                });
            }
        } else if bytes.len() >= 9 && bytes[8] == b'{' {
            let header = parse_safetensors(bytes, path)?;
            meta.safetensors = header.metadata;
            for t in header.tensors {
                let at = (file, t.offset, t.len);
                if let Some(info) =
                    self.torch_order(&t.name, t.dtype, &t.shape, at, prefix, path)?
                {
                    new.push(info);
                }
            }
        } else if is_torch_zip(bytes) || is_torch_legacy(bytes) {
            let checkpoint = parse_torch(bytes, path)?;
            meta.format = FileFormat::PyTorch(checkpoint.format);
            for t in checkpoint.tensors {
                let at = (file, t.offset, t.len);
                if let Some(info) =
                    self.torch_order(&t.name, t.dtype, &t.shape, at, prefix, path)?
                {
                    new.push(info);
                }
            }
        } else {
            return Err(WeightsError::BadMagic {
                path: path.to_path_buf(),
            });
        }
        new.retain(|t| t.name.starts_with(&self.keep));
        // Validate all names first so a failed file leaves the store unchanged.
        let mut seen = HashMap::new();
        for t in &new {
            if self.index.contains_key(&t.name) || seen.insert(t.name.as_str(), ()).is_some() {
                return Err(WeightsError::Duplicate {
                    path: path.to_path_buf(),
                    key: t.name.clone(),
                });
            }
        }
        for t in new {
            self.index.insert(t.name.clone(), self.tensors.len());
            self.tensors.push(t);
        }
        self.maps.push(map);
        self.files.push(meta);
        Ok(())
    }

    /// The store entry of a tensor whose shape is in PyTorch order (safetensors and PyTorch
    /// checkpoints); `None` (and a note in [`TensorStore::skipped`]) for a type ggml does not
    /// take. `at` is (file index, byte offset, byte length).
    fn torch_order(
        &mut self,
        key: &str,
        source: SourceDType,
        shape: &[u64],
        at: (usize, u64, u64),
        prefix: &str,
        path: &Path,
    ) -> Result<Option<TensorInfo>> {
        let name = normalize_name(key, prefix);
        let Some(dtype) = source.load_dtype() else {
            log::debug!("{}: skipping {source} tensor '{key}'", path.display());
            self.skipped.push((name, source));
            return Ok(None);
        };
        let torch = squeeze_outer(shape, key, path)?;
        let torch = fold_conv3d(torch);
        let reversed: Vec<u64> = torch.iter().rev().copied().collect();
        let (ne, n_dims) = ggml_ne(&reversed, key, path)?;
        Ok(Some(TensorInfo {
            name,
            dtype,
            source,
            ne,
            n_dims,
            file: at.0,
            offset: at.1 as usize,
            len: at.2 as usize,
        }))
    }

    /// Files in load order (shards count as separate files).
    pub fn files(&self) -> &[FileMeta] {
        &self.files
    }

    /// All tensors in load order.
    pub fn iter(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.iter()
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Like [`TensorStore::get`], but a missing tensor is an error naming the key and the file
    /// that was expected to hold it (the last file added with a matching prefix).
    pub fn require(&self, name: &str) -> Result<&TensorInfo> {
        self.get(name).ok_or_else(|| {
            let file = self
                .files
                .iter()
                .rev()
                .find(|f| !f.prefix.is_empty() && name.starts_with(&f.prefix))
                .or(self.files.last())
                .map(|f| f.path.clone())
                .unwrap_or_default();
            WeightsError::MissingTensor {
                key: name.to_string(),
                file,
            }
        })
    }

    /// Tensors whose names start with `prefix`, in load order.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a TensorInfo> + 'a {
        self.tensors
            .iter()
            .filter(move |t| t.name.starts_with(prefix))
    }

    /// Tensors left out because ggml does not take their dtype (U8, BOOL, U16/32/64, F8_E8M0).
    pub fn skipped(&self) -> &[(String, SourceDType)] {
        &self.skipped
    }

    /// The tensor's bytes exactly as stored in the file (type `info.source`).
    pub fn get_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        let bad = || WeightsError::MissingTensor {
            key: info.name.clone(),
            file: self
                .files
                .get(info.file)
                .map(|f| f.path.clone())
                .unwrap_or_default(),
        };
        let map = self.maps.get(info.file).ok_or_else(bad)?;
        let end = info.offset.checked_add(info.len).ok_or_else(bad)?;
        map.bytes().get(info.offset..end).ok_or_else(bad)
    }

    /// Drops the resident pages of `bytes` if they are a slice of one of this store's maps (a
    /// no-op otherwise): loaders call it after copying a tensor out, so peak RSS stays near
    /// the copied weights instead of weights + mapped file.
    pub fn release_mapped(&self, bytes: &[u8]) {
        for m in &self.maps {
            if m.release(bytes) {
                return;
            }
        }
    }

    /// The tensor's bytes in its load type `info.dtype` (converted when the file type differs).
    pub fn load_bytes(&self, info: &TensorInfo) -> Result<Cow<'_, [u8]>> {
        let raw = self.get_bytes(info)?;
        convert_for_load(info.source, raw).map_err(|e| with_key(e, &info.name))
    }

    /// The tensor converted to f32 on the CPU (element-wise types only).
    pub fn to_f32(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        let raw = self.get_bytes(info)?;
        to_f32(info.source, raw).map_err(|e| with_key(e, &info.name))
    }

    /// A string metadata value: GGUF string KVs first, then safetensors `__metadata__`, across
    /// files in load order.
    pub fn meta_str(&self, key: &str) -> Option<&str> {
        self.files.iter().find_map(|f| {
            f.gguf
                .get_str(key)
                .or_else(|| f.safetensors.get(key).map(String::as_str))
        })
    }
}

fn with_key(e: WeightsError, key: &str) -> WeightsError {
    match e {
        WeightsError::Convert { reason, .. } => WeightsError::Convert {
            key: key.to_string(),
            reason,
        },
        other => other,
    }
}

/// PyTorch shapes with more than 4 dims are accepted when the extra outer dims are 1 (up to one
/// extra dim may remain: see [`fold_conv3d`]).
fn squeeze_outer<'a>(shape: &'a [u64], key: &str, path: &Path) -> Result<&'a [u64]> {
    let mut s = shape;
    while s.len() > MAX_DIMS && s[0] == 1 {
        s = &s[1..];
    }
    if s.len() > MAX_DIMS + 1 {
        return Err(WeightsError::BadShape {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: format!(
                "{} dimensions {shape:?}; ggml holds at most {MAX_DIMS}",
                shape.len()
            ),
        });
    }
    Ok(s)
}

/// A 5-D shape left after [`squeeze_outer`] (a Conv3d weight `[O, I, T, H, W]`) folds its two
/// outer dims into one, `[O·I, T, H, W]` (ggml `[W, H, T, I·O]`), as stable-diffusion.cpp stores
/// them; the memory layout is unchanged. Other shapes pass through.
fn fold_conv3d(shape: &[u64]) -> std::borrow::Cow<'_, [u64]> {
    if shape.len() == MAX_DIMS + 1 {
        let mut folded = vec![shape[0].saturating_mul(shape[1])];
        folded.extend_from_slice(&shape[2..]);
        std::borrow::Cow::Owned(folded)
    } else {
        std::borrow::Cow::Borrowed(shape)
    }
}

/// Pads a ggml-order shape to 4 entries (scalars become `[1,1,1,1]` with one dim).
fn ggml_ne(ne: &[u64], key: &str, path: &Path) -> Result<([usize; 4], usize)> {
    let mut out = [1usize; 4];
    for (o, &n) in out.iter_mut().zip(ne) {
        *o = usize::try_from(n).map_err(|_| WeightsError::BadShape {
            path: path.to_path_buf(),
            key: key.to_string(),
            reason: format!("dimension {n} does not fit this platform"),
        })?;
    }
    Ok((out, ne.len().clamp(1, MAX_DIMS)))
}

/// Weight file names diffusers gives a component inside its folder (shards start with these).
const DIFFUSERS_WEIGHT_STEMS: [&str; 3] = ["diffusion_pytorch_model", "model", "pytorch_model"];

/// Endings of those weight files (and of their shard indexes).
const DIFFUSERS_WEIGHT_ENDINGS: [&str; 4] = [
    ".safetensors",
    ".safetensors.index.json",
    ".bin",
    ".bin.index.json",
];

/// The `config.json` beside `path` when `path` is a diffusers component's weights file (see
/// [`TensorStore::add_file`]); `None` for any other file.
fn beside_config(path: &Path) -> Result<Option<Value>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let diffusers_named = DIFFUSERS_WEIGHT_STEMS.iter().any(|stem| {
        name.strip_prefix(stem)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
            && DIFFUSERS_WEIGHT_ENDINGS.iter().any(|e| name.ends_with(e))
    });
    let config = path.with_file_name("config.json");
    if diffusers_named && config.is_file() {
        Ok(Some(read_json(&config)?))
    } else {
        Ok(None)
    }
}

fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let len = fs::metadata(path)
        .map_err(|e| WeightsError::io(path, e))?
        .len();
    if len > limit {
        return Err(WeightsError::HeaderTooLarge {
            path: path.to_path_buf(),
            len,
            limit,
        });
    }
    fs::read(path).map_err(|e| WeightsError::io(path, e))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = read_limited(path, MAX_CONFIG_LEN)?;
    serde_json::from_slice(&text).map_err(|e| WeightsError::BadJson {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
