//! A context plus an index of the tensors made in it: long-lived tensors (model weights,
//! cache entries) are referred to by index, so owners need no self-referential borrows.

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
    ctx: Context,
    tensors: Vec<NonNull<sys::ggml_tensor>>,
    capacity: usize,
}

impl Arena {
    /// Room for `capacity` tensors (metadata only).
    pub fn new(capacity: usize) -> Result<Self, GgmlError> {
        Ok(Self {
            replicas: RefCell::new(HashMap::new()),
            next_replica: Cell::new(0),
            ctx: Context::new(capacity, 0)?,
            tensors: Vec::new(),
            capacity,
        })
    }

    /// Adds a tensor and returns its index, or None when the arena is full.
    pub fn add(&mut self, ty: DType, ne: Ne, name: &str) -> Option<usize> {
        if self.tensors.len() >= self.capacity {
            return None;
        }
        let t = self.ctx.new_tensor(ty, ne).set_name(name);
        let raw = NonNull::new(t.raw())?;
        self.tensors.push(raw);
        Some(self.tensors.len() - 1)
    }

    pub fn get(&self, index: usize) -> Tensor<'_> {
        self.ctx.wrap(self.tensors[index].as_ptr())
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn context(&self) -> &Context {
        &self.ctx
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
