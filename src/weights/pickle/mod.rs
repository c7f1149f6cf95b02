//! A restricted unpickler for the pickles `torch.save` writes. It never imports, calls or
//! evaluates anything.
//!
//! A pickle is a program for a small stack machine, and Python's unpickler imports and calls
//! whatever globals that program names: that is how a `.ckpt` can run code on `torch.load`.
//! This machine runs the same opcodes (protocols 0–5; not the extension registry, text
//! persistent ids or out-of-band buffers) but gives globals a meaning only from a fixed
//! table (`globals.rs`, which documents the policy): tensor and container constructors are
//! interpreted into descriptions ([`TensorRef`]: storage key, offset, size, stride), harmless
//! classes become inert placeholders, code-running names are refused on sight, and applying
//! any other name is refused. Errors name the global and the opcode's byte offset.
//!
//! Memory is bounded by the pickle's size: every opcode adds at most one value or object
//! (plus a copy of at most a few small tuples), string lengths are checked against the bytes
//! left, and [`Limits`] caps the stack, open marks, memo and object count. Nothing recurses
//! over the data.

mod calls;
mod cursor;
pub mod globals;
mod machine;
mod ops;
pub mod value;

use std::collections::HashMap;

pub use globals::TorchDType;
pub use value::{ObjId, Object, StorageRef, TensorRef, Value};

/// Caps on the machine's state. The defaults are far above what `torch.save` writes for any
/// model (about ten objects and memo entries per tensor; a state dict keeps the stack at a few
/// thousand entries) and keep a hostile pickle's footprint to a few hundred MB at most.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_stack: usize,
    pub max_marks: usize,
    pub max_memo: usize,
    pub max_objects: usize,
    /// GLOBAL / STACK_GLOBAL / INST opcodes (a real pickle names each global once and reuses
    /// it through the memo; each one copies up to two names).
    pub max_globals: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_stack: 1 << 20,
            max_marks: 4096,
            max_memo: 1 << 20,
            max_objects: 1 << 20,
            max_globals: 1 << 16,
        }
    }
}

/// Why a pickle was not read. Offsets are relative to the pickle's first byte.
#[derive(Debug, Clone, PartialEq)]
pub enum PickleError {
    Malformed {
        offset: usize,
        reason: String,
    },
    /// A global that would run code, or that is not on the allowlist and was applied.
    Refused {
        offset: usize,
        global: String,
        reason: String,
    },
}

/// The result of one pickle: its root value and the objects it refers to.
#[derive(Debug)]
pub struct Unpickled {
    objects: Vec<Object>,
    storages: HashMap<String, StorageRef>,
    /// The value STOP returned.
    pub root: Value,
    /// Bytes the pickle took, its STOP included (the next pickle of a legacy file starts here).
    pub len: usize,
}

impl Unpickled {
    /// The object a value refers to (`None` for scalars).
    pub fn get(&self, v: Value) -> Option<&Object> {
        match v {
            Value::Obj(ObjId(i)) => self.objects.get(i as usize),
            _ => None,
        }
    }

    /// The string a value refers to, if it is one.
    pub fn str(&self, v: Value) -> Option<&str> {
        match self.get(v) {
            Some(Object::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// Every storage the pickle's persistent ids declared, by key.
    pub fn storages(&self) -> &HashMap<String, StorageRef> {
        &self.storages
    }
}

/// Runs the pickle at the start of `bytes` up to its STOP opcode.
pub fn unpickle(bytes: &[u8]) -> Result<Unpickled, PickleError> {
    unpickle_with(bytes, Limits::default())
}

/// [`unpickle`] with explicit limits.
pub fn unpickle_with(bytes: &[u8], limits: Limits) -> Result<Unpickled, PickleError> {
    machine::Machine::new(bytes, limits).run()
}

#[cfg(test)]
mod tests;
