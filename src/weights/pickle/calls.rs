//! The opcodes that would run code in Python (REDUCE, NEWOBJ, INST, OBJ, BUILD, BINPERSID),
//! done by rule: tensors and containers are described, harmless classes become placeholders,
//! and everything else is refused (see `globals.rs` for the policy).

use super::globals::{Global, Rebuild};
use super::machine::{malformed, Fault, Machine, Step};
use super::value::{Object, StorageRef, TensorRef, Value};

/// Most dimensions accepted in a tensor's size or stride (ggml holds 4; the store squeezes
/// leading ones). A small bound keeps every rebuild a constant amount of work.
const MAX_TENSOR_DIMS: usize = 16;

/// Longest storage key accepted (torch writes decimal numbers; the bound keeps each storage
/// and tensor description small).
const MAX_STORAGE_KEY: usize = 64;

const UNKNOWN_REASON: &str = "it is not a tensor or container constructor this reader knows \
     (the file holds a pickled Python object; building it would run its code. Save the model's \
     state_dict() instead)";

impl Machine<'_> {
    fn global_of(&self, v: Value) -> Option<Global> {
        match self.obj(v) {
            Some(Object::Global(g)) => Some(g.clone()),
            _ => None,
        }
    }

    /// The items of a tuple of at most `max` entries (checked before anything is copied, so a
    /// huge tuple reused many times costs nothing).
    fn small_tuple(&self, v: Value, max: usize, what: &str) -> Step<Vec<Value>> {
        match self.obj(v) {
            Some(Object::Tuple(items)) if items.len() <= max => Ok(items.clone()),
            Some(Object::Tuple(items)) => malformed(format!(
                "{what}: {} items, expected at most {max}",
                items.len()
            )),
            _ => malformed(format!(
                "{what}: expected a tuple, found a {}",
                self.kind(v)
            )),
        }
    }

    fn non_negative(&self, v: Value, what: &str) -> Step<u64> {
        match v {
            Value::Int(i) if i >= 0 => Ok(i as u64),
            Value::Int(i) => malformed(format!("{what} is negative ({i})")),
            _ => malformed(format!("{what}: expected an int, found a {}", self.kind(v))),
        }
    }

    fn dims(&self, v: Value, what: &str) -> Step<Vec<u64>> {
        let items = self.small_tuple(v, MAX_TENSOR_DIMS, what)?;
        items
            .into_iter()
            .map(|d| self.non_negative(d, what))
            .collect()
    }

    fn refuse<T>(global: String) -> Step<T> {
        Err(Fault::Refused {
            global,
            reason: UNKNOWN_REASON.to_string(),
        })
    }

    /// REDUCE: `callable(*args)`.
    pub(super) fn reduce(&mut self, callable: Value, args: Value) -> Step<Value> {
        let Some(g) = self.global_of(callable) else {
            return malformed(format!(
                "REDUCE applies a {}, not a global",
                self.kind(callable)
            ));
        };
        match g {
            Global::RebuildTensor(kind) => {
                let a = self.small_tuple(args, 8, "the arguments of _rebuild_tensor")?;
                self.rebuild_tensor(kind, &a)
            }
            Global::RebuildParameter => {
                let a = self.small_tuple(args, 4, "the arguments of _rebuild_parameter")?;
                match a.first() {
                    Some(&t) if matches!(self.obj(t), Some(Object::Tensor(_))) => Ok(t),
                    _ => malformed("_rebuild_parameter without a tensor"),
                }
            }
            Global::RebuildFromType => {
                let a = self.small_tuple(args, 4, "the arguments of _rebuild_from_type")?;
                let [func, _new_type, inner, _state] = a[..] else {
                    return malformed("_rebuild_from_type takes 4 arguments");
                };
                match self.global_of(func) {
                    Some(Global::RebuildTensor(_) | Global::RebuildParameter) => {
                        self.reduce(func, inner)
                    }
                    Some(Global::Unknown(name)) => Self::refuse(name),
                    _ => malformed("_rebuild_from_type of something other than a tensor"),
                }
            }
            Global::DictClass => {
                // OrderedDict() / defaultdict(factory) start empty; items come by SETITEMS. A
                // list of items given as an argument is not read (torch.save never writes one).
                match self.obj(args) {
                    Some(Object::Tuple(a)) if a.is_empty() => self.alloc(Object::Dict(Vec::new())),
                    Some(Object::Tuple(a))
                        if a.len() == 1
                            && !matches!(
                                self.obj(a[0]),
                                Some(Object::List(_) | Object::Dict(_))
                            ) =>
                    {
                        self.alloc(Object::Dict(Vec::new()))
                    }
                    _ => self.alloc(Object::Opaque(callable)),
                }
            }
            Global::Size => {
                let a = self.small_tuple(args, 1, "the arguments of torch.Size")?;
                match a.first() {
                    Some(&t) if matches!(self.obj(t), Some(Object::Tuple(_))) => Ok(t),
                    _ => malformed("torch.Size of something other than a tuple"),
                }
            }
            Global::Reconstructor => {
                let a = self.small_tuple(args, 3, "the arguments of copyreg._reconstructor")?;
                match a.first() {
                    Some(&cls) => self.instantiate(cls),
                    None => malformed("copyreg._reconstructor without a class"),
                }
            }
            Global::TypedStorage(_)
            | Global::DType(_)
            | Global::UntypedStorage
            | Global::Inert(_) => self.alloc(Object::Opaque(callable)),
            Global::Unknown(name) => Self::refuse(name),
        }
    }

    /// NEWOBJ / NEWOBJ_EX / INST / OBJ / `copyreg._reconstructor`: an instance of `cls`
    /// (its arguments are never read).
    pub(super) fn instantiate(&mut self, cls: Value) -> Step<Value> {
        match self.global_of(cls) {
            Some(Global::DictClass) => self.alloc(Object::Dict(Vec::new())),
            Some(Global::Unknown(name)) => Self::refuse(name),
            Some(_) => self.alloc(Object::Opaque(cls)),
            None => malformed(format!(
                "an instance of a {}, not of a class",
                self.kind(cls)
            )),
        }
    }

    /// BUILD: Python would call the target's `__setstate__`; here state is dropped (no target
    /// the machine can build has state that matters to the weights).
    pub(super) fn build(&mut self, target: Value, _state: Value) -> Step<()> {
        match self.global_of(target) {
            Some(Global::Unknown(name)) => Self::refuse(name),
            _ => Ok(()),
        }
    }

    /// BINPERSID: torch's persistent ids name storages kept outside the pickle.
    pub(super) fn persistent_load(&mut self, pid: Value) -> Step<Value> {
        let items = self.small_tuple(pid, 6, "a persistent id")?;
        let tag = match items.first().and_then(|&v| self.obj(v)) {
            Some(Object::Str(s)) => s.clone(),
            _ => return malformed("a persistent id without its type name"),
        };
        match tag.as_str() {
            "storage" => self.storage(&items),
            // A saved nn.Module class (legacy format): kept as data, never built.
            "module" => self.alloc(Object::Opaque(Value::None)),
            _ => malformed(format!(
                "unknown persistent id '{}'",
                tag.chars().take(40).collect::<String>()
            )),
        }
    }

    /// `('storage', <storage class>, key, location, numel[, view_metadata])`.
    fn storage(&mut self, items: &[Value]) -> Step<Value> {
        if items.len() < 5 {
            return malformed("a storage persistent id has fewer than 5 items");
        }
        let dtype = match self.global_of(items[1]) {
            Some(Global::TypedStorage(d)) => Some(d),
            Some(Global::UntypedStorage) => None,
            Some(Global::Unknown(name) | Global::Inert(name)) => {
                return malformed(format!("'{name}' is not a torch storage type"))
            }
            _ => return malformed("a storage persistent id without a storage type"),
        };
        let key = match (items[2], self.obj(items[2])) {
            (_, Some(Object::Str(s))) if s.len() <= MAX_STORAGE_KEY => s.clone(),
            (Value::Int(i), _) => i.to_string(),
            _ => return malformed("a storage key that is not a short string"),
        };
        let numel = self.non_negative(items[4], "a storage's element count")?;
        if items.get(5).is_some_and(|&v| v != Value::None) {
            return malformed(format!(
                "storage '{key}' is a view of another storage (legacy view metadata), which is not supported"
            ));
        }
        let s = StorageRef { key, dtype, numel };
        match self.storages.get(&s.key) {
            Some(old) if *old != s => {
                return malformed(format!(
                    "storage '{}' is declared twice, differently",
                    s.key
                ))
            }
            Some(_) => {}
            None => {
                self.storages.insert(s.key.clone(), s.clone());
            }
        }
        self.alloc(Object::Storage(s))
    }

    /// `torch._utils._rebuild_tensor{,_v2,_v3}(storage, storage_offset, size, stride, ...)`.
    fn rebuild_tensor(&mut self, kind: Rebuild, a: &[Value]) -> Step<Value> {
        let (min, max) = match kind {
            Rebuild::V1 => (4, 4),
            Rebuild::V2 => (6, 7),
            Rebuild::V3 => (7, 8),
        };
        if a.len() < min || a.len() > max {
            return malformed(format!(
                "_rebuild_tensor got {} arguments, expected {min}..={max}",
                a.len()
            ));
        }
        let storage = match self.obj(a[0]) {
            Some(Object::Storage(s)) => s.clone(),
            _ => {
                return malformed(format!(
                    "_rebuild_tensor of a {}, not a storage",
                    self.kind(a[0])
                ))
            }
        };
        let storage_offset = self.non_negative(a[1], "a tensor's storage offset")?;
        let size = self.dims(a[2], "a tensor's size")?;
        let stride = self.dims(a[3], "a tensor's stride")?;
        if size.len() != stride.len() {
            return malformed(format!(
                "a tensor with {} sizes but {} strides",
                size.len(),
                stride.len()
            ));
        }
        let (dtype, metadata) = match kind {
            Rebuild::V3 => match self.global_of(a[6]) {
                Some(Global::DType(d)) => (d, a.get(7)),
                _ => return malformed("_rebuild_tensor_v3 without a torch dtype"),
            },
            Rebuild::V1 | Rebuild::V2 => match storage.dtype {
                Some(d) => (d, a.get(6)),
                None => return malformed("an untyped storage rebuilt without a dtype"),
            },
        };
        let lazy_bits = metadata.is_some_and(|&m| self.sets_lazy_bit(m));
        self.alloc(Object::Tensor(TensorRef {
            storage,
            dtype,
            storage_offset,
            size,
            stride,
            lazy_bits,
        }))
    }

    /// Tensor metadata `{'neg': True}` / `{'conj': True}`: the bytes hold the values before a
    /// pending negation or conjugation.
    fn sets_lazy_bit(&self, metadata: Value) -> bool {
        match self.obj(metadata) {
            Some(Object::Dict(items)) => items.iter().any(|&(_, v)| v == Value::Bool(true)),
            _ => false,
        }
    }
}
