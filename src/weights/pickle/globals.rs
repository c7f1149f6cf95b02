//! The only globals the unpickler gives a meaning to, and the ones it refuses to name.
//!
//! Policy (nothing is ever imported or called; this table only decides what a name *means*):
//! - **Interpreted**: the constructors `torch.save` uses for tensors and state dicts
//!   (`torch._utils._rebuild_tensor{,_v2,_v3}`, `_rebuild_parameter{,_with_state}`,
//!   `torch._tensor._rebuild_from_type{,_v2}`, `collections.OrderedDict`, `torch.*Storage`,
//!   `torch.<dtype>`, `torch.Size`, `copyreg._reconstructor`). The unpickler builds a
//!   description of what they would return.
//! - **Inert**: harmless classes and functions that real checkpoints carry next to the weights
//!   (Lightning callbacks and `AttributeDict`, `argparse.Namespace`, omegaconf configs, numpy
//!   scalars and dtypes, `_codecs.encode`, `builtins.set`...). Applying one gives an opaque
//!   placeholder that is never built, so the tensors beside it still load.
//! - **Refused on sight**: anything that can run code or touch the system (`os.*`, `posix.*`,
//!   `nt.*`, `subprocess.*`, `builtins.eval` / `exec` / `getattr` / `__import__` / `open`,
//!   `runpy.*`, `importlib.*`, `pickle.*`, `functools.*`, `operator.*`, ...).
//! - **Unknown**: any other name may appear as a value (a pickle may store a class as data),
//!   but applying it (REDUCE, NEWOBJ, INST, OBJ, or `copyreg._reconstructor` of it) is refused,
//!   naming it: building it would mean running that class's code, and there is no tensor to
//!   find there (e.g. a whole `nn.Module` saved instead of its `state_dict()`).

use crate::dtype::DType;
use crate::weights::dtype::SourceDType;

/// A PyTorch element type: its name (`torch.<name>`), bytes per element, and how this program
/// loads it (`None`: complex and quantized types, which no model here uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TorchDType {
    pub name: &'static str,
    pub size: u64,
    pub source: Option<SourceDType>,
}

const fn dt(name: &'static str, size: u64, source: Option<SourceDType>) -> TorchDType {
    TorchDType { name, size, source }
}

use SourceDType as S;

/// Every dtype a checkpoint may name, with the legacy `torch.<X>Storage` class that stands for
/// it (from `torch/storage.py`, `_dtype_to_storage_type_map`; dtypes added later are saved as
/// `torch.UntypedStorage` plus the dtype, through `_rebuild_tensor_v3`).
const DTYPES: [(TorchDType, Option<&str>); 24] = [
    (dt("float64", 8, Some(S::F64)), Some("DoubleStorage")),
    (
        dt("float32", 4, Some(S::Ggml(DType::F32))),
        Some("FloatStorage"),
    ),
    (
        dt("float16", 2, Some(S::Ggml(DType::F16))),
        Some("HalfStorage"),
    ),
    (
        dt("bfloat16", 2, Some(S::Ggml(DType::BF16))),
        Some("BFloat16Storage"),
    ),
    (dt("int64", 8, Some(S::I64)), Some("LongStorage")),
    (
        dt("int32", 4, Some(S::Ggml(DType::I32))),
        Some("IntStorage"),
    ),
    (
        dt("int16", 2, Some(S::Ggml(DType::I16))),
        Some("ShortStorage"),
    ),
    (dt("int8", 1, Some(S::Ggml(DType::I8))), Some("CharStorage")),
    (dt("uint8", 1, Some(S::U8)), Some("ByteStorage")),
    (dt("bool", 1, Some(S::Bool)), Some("BoolStorage")),
    (dt("complex128", 16, None), Some("ComplexDoubleStorage")),
    (dt("complex64", 8, None), Some("ComplexFloatStorage")),
    (dt("qint8", 1, None), Some("QInt8Storage")),
    (dt("qint32", 4, None), Some("QInt32Storage")),
    (dt("quint8", 1, None), Some("QUInt8Storage")),
    (dt("quint4x2", 1, None), Some("QUInt4x2Storage")),
    (dt("quint2x4", 1, None), Some("QUInt2x4Storage")),
    (dt("float8_e4m3fn", 1, Some(S::F8E4M3)), None),
    (dt("float8_e5m2", 1, Some(S::F8E5M2)), None),
    (dt("float8_e8m0fnu", 1, Some(S::F8E8M0)), None),
    (dt("uint16", 2, Some(S::U16)), None),
    (dt("uint32", 4, Some(S::U32)), None),
    (dt("uint64", 8, Some(S::U64)), None),
    (dt("complex32", 4, None), None),
];

/// `torch.<alias>` spellings of the dtypes above.
const DTYPE_ALIASES: [(&str, &str); 8] = [
    ("float", "float32"),
    ("double", "float64"),
    ("half", "float16"),
    ("long", "int64"),
    ("int", "int32"),
    ("short", "int16"),
    ("cfloat", "complex64"),
    ("cdouble", "complex128"),
];

fn dtype_named(name: &str) -> Option<TorchDType> {
    let name = DTYPE_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, canonical)| canonical);
    DTYPES.iter().find(|(d, _)| d.name == name).map(|(d, _)| *d)
}

fn storage_named(class: &str) -> Option<TorchDType> {
    DTYPES
        .iter()
        .find(|(_, s)| *s == Some(class))
        .map(|(d, _)| *d)
}

/// Which `torch._utils._rebuild_tensor*` a global is (they differ in their arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    /// `(storage, storage_offset, size, stride)`
    V1,
    /// `(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])`
    V2,
    /// `(storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])`
    V3,
}

/// What a global name means to the unpickler.
#[derive(Debug, Clone, PartialEq)]
pub enum Global {
    RebuildTensor(Rebuild),
    /// `torch._utils._rebuild_parameter{,_with_state}`: the tensor in its first argument.
    RebuildParameter,
    /// `torch._tensor._rebuild_from_type{,_v2}(func, type, args, state)`: `func(*args)`.
    RebuildFromType,
    /// `collections.OrderedDict`, `collections.defaultdict`, `builtins.dict`.
    DictClass,
    /// `torch.FloatStorage` and friends.
    TypedStorage(TorchDType),
    UntypedStorage,
    /// `torch.float16` and friends.
    DType(TorchDType),
    /// `torch.Size(tuple)`: the tuple.
    Size,
    /// `copyreg._reconstructor(cls, base, state)`: an instance of `cls`.
    Reconstructor,
    /// A harmless name: applying it gives an opaque placeholder.
    Inert(String),
    /// Any other name: a value, but applying it is refused.
    Unknown(String),
}

/// Longest module or attribute name accepted (real ones are short; the limit keeps copies of
/// names cheap).
pub const MAX_GLOBAL_NAME: usize = 256;

/// Modules whose names (and submodules) are refused on sight: they run programs, import or
/// evaluate code, open files or sockets, or build callables from other callables.
const CODE_RUNNING_MODULES: [&str; 44] = [
    "os",
    "posix",
    "nt",
    "subprocess",
    "sys",
    "runpy",
    "importlib",
    "imp",
    "pickle",
    "_pickle",
    "cPickle",
    "marshal",
    "shelve",
    "dill",
    "shutil",
    "socket",
    "ctypes",
    "pty",
    "code",
    "codeop",
    "webbrowser",
    "multiprocessing",
    "threading",
    "_thread",
    "signal",
    "pdb",
    "bdb",
    "tempfile",
    "io",
    "_io",
    "urllib",
    "http",
    "asyncio",
    "operator",
    "_operator",
    "functools",
    "types",
    "inspect",
    "gc",
    "platform",
    "commands",
    "pydoc",
    "timeit",
    "torch.hub",
];

/// The `builtins` that are plain data types (everything else in `builtins`, e.g. `eval`,
/// `exec`, `getattr`, `__import__`, `open`, `compile`, is refused on sight).
const DATA_BUILTINS: [&str; 15] = [
    "dict",
    "bool",
    "set",
    "frozenset",
    "slice",
    "complex",
    "bytearray",
    "bytes",
    "object",
    "range",
    "list",
    "tuple",
    "int",
    "float",
    "str",
];

/// Harmless names seen in real checkpoints (besides the prefixes below).
const INERT: [&str; 28] = [
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.dtype",
    "numpy.ndarray",
    "_codecs.encode",
    "collections.deque",
    "collections.Counter",
    "argparse.Namespace",
    "pathlib.Path",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib.PurePosixPath",
    "pathlib.PureWindowsPath",
    "datetime.datetime",
    "datetime.date",
    "datetime.time",
    "datetime.timedelta",
    "datetime.timezone",
    "uuid.UUID",
    "decimal.Decimal",
    "torch.device",
    "torch.Tensor",
    "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout",
    "torch.layout",
    "torch.memory_format",
];

/// Packages whose classes checkpoints carry as training metadata (callbacks, hyperparameter
/// containers, configs): placeholders, never built.
const INERT_PREFIXES: [&str; 5] = [
    "pytorch_lightning.",
    "lightning.",
    "lightning_fabric.",
    "omegaconf.",
    "numpy.dtypes.",
];

/// True when `module` is `m` or inside it.
fn within(module: &str, m: &str) -> bool {
    module == m || module.strip_prefix(m).is_some_and(|r| r.starts_with('.'))
}

/// True when a name is refused on sight.
fn runs_code(module: &str, name: &str) -> bool {
    if CODE_RUNNING_MODULES.iter().any(|m| within(module, m)) {
        return true;
    }
    if module == "builtins" || module == "__builtin__" {
        return !DATA_BUILTINS.contains(&name);
    }
    // Dunder attributes reach interpreter internals (`__class__`, `__subclasses__`...).
    name.starts_with("__") || name.contains(".__")
}

/// Resolves `module.name`. `Err` carries the reason the name is refused on sight.
pub fn resolve(module: &str, name: &str) -> Result<Global, &'static str> {
    if runs_code(module, name) {
        return Err("a pickle that runs code");
    }
    if module == "torch" {
        if let Some(d) = storage_named(name) {
            return Ok(Global::TypedStorage(d));
        }
        if let Some(d) = dtype_named(name) {
            return Ok(Global::DType(d));
        }
    }
    let full = format!("{module}.{name}");
    Ok(match (module, name) {
        ("torch._utils", "_rebuild_tensor") => Global::RebuildTensor(Rebuild::V1),
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensor(Rebuild::V2),
        ("torch._utils", "_rebuild_tensor_v3") => Global::RebuildTensor(Rebuild::V3),
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
            Global::RebuildParameter
        }
        ("torch._tensor", "_rebuild_from_type" | "_rebuild_from_type_v2") => {
            Global::RebuildFromType
        }
        ("collections", "OrderedDict" | "defaultdict") | ("builtins" | "__builtin__", "dict") => {
            Global::DictClass
        }
        ("torch" | "torch.storage", "UntypedStorage") => Global::UntypedStorage,
        ("torch", "Size") => Global::Size,
        ("copyreg" | "copy_reg", "_reconstructor") => Global::Reconstructor,
        _ if module == "builtins" || module == "__builtin__" => Global::Inert(full),
        _ if INERT.contains(&full.as_str()) => Global::Inert(full),
        _ if INERT_PREFIXES.iter().any(|p| full.starts_with(p)) => Global::Inert(full),
        _ => Global::Unknown(full),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_running_names_are_refused() {
        for (m, n) in [
            ("os", "system"),
            ("posix", "system"),
            ("nt", "system"),
            ("subprocess", "Popen"),
            ("subprocess", "check_output"),
            ("builtins", "eval"),
            ("builtins", "exec"),
            ("builtins", "getattr"),
            ("builtins", "__import__"),
            ("builtins", "open"),
            ("__builtin__", "eval"),
            ("runpy", "run_path"),
            ("os.path", "join"),
            ("torch.hub", "load"),
            ("functools", "partial"),
            ("collections", "__class__"),
        ] {
            assert!(resolve(m, n).is_err(), "{m}.{n}");
        }
    }

    #[test]
    fn torch_names_are_interpreted() {
        assert_eq!(
            resolve("torch._utils", "_rebuild_tensor_v2"),
            Ok(Global::RebuildTensor(Rebuild::V2))
        );
        let Ok(Global::TypedStorage(d)) = resolve("torch", "BFloat16Storage") else {
            panic!("BFloat16Storage");
        };
        assert_eq!((d.name, d.size), ("bfloat16", 2));
        let Ok(Global::DType(d)) = resolve("torch", "float8_e4m3fn") else {
            panic!("float8_e4m3fn");
        };
        assert_eq!(d.source, Some(SourceDType::F8E4M3));
        assert_eq!(
            resolve("torch", "half").map(|g| matches!(g, Global::DType(_))),
            Ok(true)
        );
        assert!(matches!(
            resolve(
                "pytorch_lightning.callbacks.model_checkpoint",
                "ModelCheckpoint"
            ),
            Ok(Global::Inert(_))
        ));
        assert!(matches!(
            resolve("mymodel", "Net"),
            Ok(Global::Unknown(n)) if n == "mymodel.Net"
        ));
    }
}
