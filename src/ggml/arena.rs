//! A context plus an index of the tensors made in it, and the memory they are bound to:
//! long-lived tensors (model weights, cache entries) are referred to by index, so owners need
//! no self-referential borrows, and the memory cannot be freed while the tensors exist.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;

use super::backend::{Backend, Buffer};
use super::context::{Context, Ne, Tensor};
use super::error::GgmlError;
use super::sys;
use crate::dtype::DType;

/// A handle to a device copy of some of an arena's tensors (see [`Arena::replicate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplicaId(u64);

struct Replica {
    /// (tensor index, original buffer, original data) for each moved tensor.
    moved: Vec<(usize, *mut sys::ggml_backend_buffer, *mut c_void)>,
    buffer: Buffer,
}

pub struct Arena {
    // Declared first: replicas are released before the context that holds their tensors.
    replicas: RefCell<HashMap<u64, Replica>>,
    next_replica: Cell<u64>,
    /// The memory of every tensor (after [`Arena::allocate`]); freed before the context.
    buffer: RefCell<Option<Buffer>>,
    ctx: Context,
    tensors: RefCell<Vec<NonNull<sys::ggml_tensor>>>,
    capacity: usize,
}

impl Arena {
    /// Room for `capacity` tensors (metadata only).
    pub fn new(capacity: usize) -> Result<Self, GgmlError> {
        Ok(Self {
            replicas: RefCell::new(HashMap::new()),
            next_replica: Cell::new(0),
            buffer: RefCell::new(None),
            ctx: Context::new(capacity, 0)?,
            tensors: RefCell::new(Vec::new()),
            capacity,
        })
    }

    /// Adds a tensor and returns its index, or None when the arena is full or already has
    /// its memory.
    pub fn add(&self, ty: DType, ne: Ne, name: &str) -> Option<usize> {
        let mut tensors = self.tensors.borrow_mut();
        if tensors.len() >= self.capacity || self.buffer.borrow().is_some() {
            return None;
        }
        let t = self.ctx.new_tensor(ty, ne).set_name(name);
        tensors.push(NonNull::new(t.raw())?);
        Some(tensors.len() - 1)
    }

    pub fn get(&self, index: usize) -> Tensor<'_> {
        self.ctx.wrap(self.tensors.borrow()[index].as_ptr())
    }

    pub fn len(&self) -> usize {
        self.tensors.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.borrow().is_empty()
    }

    /// Gives every tensor memory on `backend` (one buffer, kept by the arena; tensors added
    /// later are refused).
    pub fn allocate(&self, backend: &Backend, what: &str) -> Result<(), GgmlError> {
        self.bind_with(|ctx| backend.alloc_context(ctx, what))
    }

    /// Gives every tensor memory on the host: the device's pinned host buffer type when it
    /// has one (fast, async-capable uploads), else plain RAM.
    pub fn allocate_host(&self, backend: &Backend, what: &str) -> Result<(), GgmlError> {
        self.bind_with(|ctx| backend.alloc_context_host(ctx, what))
    }

    fn bind_with(
        &self,
        alloc: impl FnOnce(&Context) -> Result<Buffer, GgmlError>,
    ) -> Result<(), GgmlError> {
        let mut slot = self.buffer.borrow_mut();
        if slot.is_some() {
            return Err(GgmlError::Binding(
                "the arena already has its memory".into(),
            ));
        }
        *slot = Some(alloc(&self.ctx)?);
        Ok(())
    }

    /// Whether the tensors have their memory.
    pub fn is_allocated(&self) -> bool {
        self.buffer.borrow().is_some()
    }

    /// Bytes of the arena's buffer (0 before [`Arena::allocate`]).
    pub fn buffer_size(&self) -> usize {
        self.buffer.borrow().as_ref().map_or(0, Buffer::size)
    }

    /// The arena's memory: its buffer type's name and whether the CPU addresses it directly
    /// (`None` before [`Arena::allocate`]).
    pub fn memory(&self) -> Option<(String, bool)> {
        self.buffer
            .borrow()
            .as_ref()
            .map(|b| (b.type_name(), b.is_host()))
    }
}

impl Arena {
    /// Copies the tensors at `indices` (which must live in host memory) into one new buffer
    /// on `backend` and re-binds them there, so graphs built from now on read the copy.
    /// With `stream`, the uploads are queued on it asynchronously: synchronize that stream
    /// before a graph reads them. [`Arena::release`] binds them back to host memory.
    pub fn replicate(
        &self,
        backend: &Backend,
        indices: &[usize],
        stream: Option<&Backend>,
    ) -> Result<ReplicaId, GgmlError> {
        let tensors: Vec<Tensor<'_>> = indices.iter().map(|&i| self.get(i)).collect();
        for t in &tensors {
            // SAFETY: live tensor of this arena.
            let meta = unsafe { &*t.raw() };
            // SAFETY: the buffer pointer is checked for null first.
            let host =
                !meta.buffer.is_null() && unsafe { sys::ggml_backend_buffer_is_host(meta.buffer) };
            if !host || meta.data.is_null() || !meta.view_src.is_null() {
                return Err(GgmlError::Binding(format!(
                    "'{}' is not a host-resident tensor, so it cannot be replicated",
                    t.name()
                )));
            }
        }
        let (buffer, offsets) = backend.alloc_for(&tensors, "weight replica")?;
        let mut moved = Vec::with_capacity(indices.len());
        for ((&i, t), off) in indices.iter().zip(&tensors).zip(offsets) {
            // SAFETY: live tensor of this arena; we own its binding while replicated.
            let meta = unsafe { &mut *t.raw() };
            let (old_buf, old_data) = (meta.buffer, meta.data);
            meta.buffer = std::ptr::null_mut();
            meta.data = std::ptr::null_mut();
            if let Err(e) = buffer.bind(*t, off) {
                meta.buffer = old_buf;
                meta.data = old_data;
                Self::restore(&tensors[..moved.len()], &moved);
                return Err(e);
            }
            let n = t.n_bytes();
            match stream {
                // SAFETY: `old_data` is host memory of `n` bytes that outlives the copy (the
                // arena's host buffer); the tensor now lives in `buffer`.
                Some(s) => unsafe {
                    sys::ggml_backend_tensor_set_async(s.raw(), t.raw(), old_data, 0, n)
                },
                // SAFETY: as above, synchronous.
                None => unsafe { sys::ggml_backend_tensor_set(t.raw(), old_data, 0, n) },
            }
            moved.push((i, old_buf, old_data));
        }
        let id = self.next_replica.get();
        self.next_replica.set(id + 1);
        self.replicas
            .borrow_mut()
            .insert(id, Replica { moved, buffer });
        Ok(ReplicaId(id))
    }

    fn restore(
        tensors: &[Tensor<'_>],
        moved: &[(usize, *mut sys::ggml_backend_buffer, *mut c_void)],
    ) {
        for (t, &(_, buf, data)) in tensors.iter().zip(moved) {
            // SAFETY: live tensor of this arena, re-bound to the host memory it came from.
            let meta = unsafe { &mut *t.raw() };
            meta.buffer = buf;
            meta.data = data;
        }
    }

    /// Binds a replica's tensors back to host memory and frees its device buffer.
    /// Returns the bytes freed (0 for an unknown id).
    pub fn release(&self, id: ReplicaId) -> usize {
        let Some(r) = self.replicas.borrow_mut().remove(&id.0) else {
            return 0;
        };
        let tensors: Vec<Tensor<'_>> = r.moved.iter().map(|m| self.get(m.0)).collect();
        Self::restore(&tensors, &r.moved);
        r.buffer.size()
    }

    /// Device bytes a replica holds.
    pub fn replica_bytes(&self, id: ReplicaId) -> usize {
        self.replicas
            .borrow()
            .get(&id.0)
            .map_or(0, |r| r.buffer.size())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.replicas.borrow().keys().copied().collect();
        for id in ids {
            self.release(ReplicaId(id));
        }
    }
}
