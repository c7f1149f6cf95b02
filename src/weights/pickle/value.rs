//! What the restricted unpickler builds. Scalars are held inline in [`Value`]; everything else
//! lives in one arena of [`Object`]s and is referred to by index, so DUP, the memo and nested
//! containers share an object the way Python does, nothing is ever deep-copied, and dropping
//! the result never recurses (a hostile pickle can nest containers a million deep).

use super::globals::{Global, TorchDType};

/// Index of an [`Object`] in [`super::Unpickled`]'s arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjId(pub(super) u32);

/// One stack or memo entry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Obj(ObjId),
}

/// A storage as a persistent id declares it: `('storage', <type>, key, location, numel)`.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageRef {
    /// The storage's name: `data/<key>` in a zip checkpoint, a position in the key list of a
    /// legacy one.
    pub key: String,
    /// Element type of a typed storage (`torch.FloatStorage`...); `None` for
    /// `torch.UntypedStorage`, whose elements are bytes.
    pub dtype: Option<TorchDType>,
    /// Elements (bytes for an untyped storage).
    pub numel: u64,
}

impl StorageRef {
    /// Bytes per storage element.
    pub fn elem_size(&self) -> u64 {
        self.dtype.map_or(1, |d| d.size)
    }
}

/// A tensor as `torch._utils._rebuild_tensor*` would rebuild it: a view into a storage.
/// Nothing here is checked yet beyond its types; the reader that maps it checks the layout.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    pub storage: StorageRef,
    pub dtype: TorchDType,
    /// In elements of `dtype`.
    pub storage_offset: u64,
    /// PyTorch order (outermost first).
    pub size: Vec<u64>,
    /// In elements, PyTorch order.
    pub stride: Vec<u64>,
    /// The tensor carries torch's lazy conjugate or negative bit (its values would need a
    /// sign flip that the bytes do not hold).
    pub lazy_bits: bool,
}

/// A heap object of the unpickler.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    Str(String),
    /// `bytes` / `bytearray` (only the length is kept: nothing here reads them).
    Bytes(usize),
    /// An integer wider than 64 bits, as little-endian two's complement bytes.
    BigInt(Vec<u8>),
    Tuple(Vec<Value>),
    /// Lists, and sets (the reader never needs their set semantics).
    List(Vec<Value>),
    /// dict / OrderedDict / defaultdict: items in insertion order.
    Dict(Vec<(Value, Value)>),
    Global(Global),
    Storage(StorageRef),
    Tensor(TensorRef),
    /// An instance of a harmless class that was never built: it absorbs the arguments, items
    /// and state given to it. Holds the global that made it (`None` when none did), not a
    /// copy of its name, so making many costs no memory beyond the arena entry.
    Opaque(Value),
}

impl Object {
    /// A short name of the kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Str(_) => "string",
            Object::Bytes(_) => "bytes",
            Object::BigInt(_) => "integer",
            Object::Tuple(_) => "tuple",
            Object::List(_) => "list",
            Object::Dict(_) => "dict",
            Object::Global(_) => "global",
            Object::Storage(_) => "storage",
            Object::Tensor(_) => "tensor",
            Object::Opaque(_) => "object",
        }
    }
}
