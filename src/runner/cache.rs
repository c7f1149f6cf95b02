//! The runner's named persistent cache: tensors that outlive one graph (the prefix K/V of
//! Qwen Image 2.1).
//!
//! A graph stores into the cache by copying on the device: while it is built, each store gets
//! a destination tensor ([`CacheStores`]); before it runs, all of its destinations are given
//! memory in one buffer on the runner's backend; the graph's own copy ops fill them. Nothing is
//! read back to the host. Once the graph has run, the destinations become cache entries that
//! share that buffer, which is freed when the last of them is dropped.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::dtype::DType;
use crate::ggml::{Arena, Backend, Context, GgmlError, Tensor};
use crate::tensor::Ne;

/// Most stores one graph may make (Qwen Image 2.1 makes two per layer).
const MAX_STORES_PER_GRAPH: usize = 4096;

struct Entry {
    group: Rc<Arena>,
    index: usize,
}

#[derive(Default)]
pub struct NamedCache {
    entries: HashMap<String, Entry>,
}

impl NamedCache {
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.entries.get(name).map(|e| e.group.get(e.index))
    }

    /// Makes the destinations of a graph that ran entries of the cache (replacing older
    /// entries of the same names).
    pub(crate) fn insert(&mut self, stores: CacheStores) {
        let names = stores.names.into_inner();
        let Some(arena) = stores.arena.into_inner() else {
            return;
        };
        let group = Rc::new(arena);
        for (index, name) in names.into_iter().enumerate() {
            self.entries.insert(
                name,
                Entry {
                    group: group.clone(),
                    index,
                },
            );
        }
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

    /// Device bytes the entries hold (their shared buffers, each counted once).
    pub fn bytes(&self) -> usize {
        let mut seen = HashSet::new();
        self.entries
            .values()
            .filter(|e| seen.insert(Rc::as_ptr(&e.group)))
            .map(|e| e.group.buffer_size())
            .sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The cache stores of the graph being built: one destination tensor per store, given memory
/// (all in one buffer) once the graph is complete.
#[derive(Default)]
pub(crate) struct CacheStores {
    /// Made on the first store (most graphs have none).
    arena: OnceCell<Arena>,
    names: RefCell<Vec<String>>,
    /// Set when a destination could not be made; the graph then fails before it runs.
    failed: Cell<bool>,
}

impl CacheStores {
    /// Copies `t` into a new destination of type `ty` named `name`; returns the copy (a view
    /// of the destination), or `t` itself when no destination could be made (the run then
    /// fails with [`CacheStores::check`]).
    pub fn store<'g>(
        &'g self,
        ctx: &'g Context,
        name: &str,
        t: Tensor<'g>,
        ty: DType,
    ) -> Tensor<'g> {
        if self.arena.get().is_none() {
            match Arena::new(MAX_STORES_PER_GRAPH) {
                Ok(a) => {
                    let _ = self.arena.set(a);
                }
                Err(_) => {
                    self.failed.set(true);
                    return t;
                }
            }
        }
        let Some(arena) = self.arena.get() else {
            return t;
        };
        let Some(index) = arena.add(ty, t.ne(), name) else {
            self.failed.set(true);
            return t;
        };
        self.names.borrow_mut().push(name.to_string());
        ctx.cpy(t, arena.get(index))
    }

    /// Errors when a store could not get its destination.
    pub fn check(&self) -> Result<(), GgmlError> {
        if self.failed.get() {
            return Err(GgmlError::Binding(format!(
                "a graph made more than {MAX_STORES_PER_GRAPH} cache stores"
            )));
        }
        Ok(())
    }

    /// Gives the destinations their memory on `backend`; returns its bytes.
    pub fn allocate(&self, backend: &Backend, runner: &str) -> Result<usize, GgmlError> {
        match self.arena.get() {
            Some(a) if !a.is_empty() => {
                a.allocate(backend, &format!("{runner}: cache entries"))?;
                Ok(a.buffer_size())
            }
            _ => Ok(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.borrow().is_empty()
    }
}
