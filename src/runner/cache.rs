//! The runner's named persistent cache: tensors that outlive one graph (prefix K/V, tensors
//! handed between graph segments). Each entry owns its own small backend buffer.

use std::collections::HashMap;

use crate::dtype::DType;
use crate::ggml::{Arena, Backend, Buffer, GgmlError, Ne, Tensor};

struct Entry {
    arena: Arena,
    _buffer: Buffer,
}

#[derive(Default)]
pub struct NamedCache {
    entries: HashMap<String, Entry>,
}

impl NamedCache {
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.entries.get(name).map(|e| e.arena.get(0))
    }

    /// Stores `bytes` of type `ty` and shape `ne` under `name`, replacing an older entry.
    pub fn put(
        &mut self,
        backend: &Backend,
        name: &str,
        ty: DType,
        ne: Ne,
        bytes: &[u8],
    ) -> Result<(), GgmlError> {
        self.entries.remove(name);
        let mut arena = Arena::new(1)?;
        arena.add(ty, ne, name);
        let buffer = backend.alloc_context(arena.context(), &format!("cache entry '{name}'"))?;
        arena.get(0).write_bytes(bytes)?;
        self.entries.insert(
            name.to_string(),
            Entry {
                arena,
                _buffer: buffer,
            },
        );
        Ok(())
    }

    /// Frees every entry whose name starts with `prefix`.
    pub fn clear_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The storage type and shape of the entry `name`, if present.
    pub fn info(&self, name: &str) -> Option<(DType, Ne)> {
        self.get(name).map(|t| (t.ty(), t.ne()))
    }

    /// Total bytes held.
    pub fn bytes(&self) -> usize {
        self.entries
            .values()
            .map(|e| e.arena.get(0).n_bytes())
            .sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
