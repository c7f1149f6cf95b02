//! ggml contexts and tensor handles.
//!
//! A [`Context`] owns a `ggml_context` created with `no_alloc`: it holds tensor metadata only,
//! data lives in backend buffers. A [`Tensor`] is a `Copy` handle whose lifetime is tied to
//! the borrow of the context that made it, so it cannot outlive that context.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;

use super::error::GgmlError;
use super::sys;
use crate::dtype::DType;

pub use crate::tensor::Ne;

/// Owner of a `ggml_context` (metadata only; `no_alloc`).
pub struct Context {
    raw: NonNull<sys::ggml_context>,
}

impl Context {
    /// A metadata-only context with room for `max_tensors` tensors and one graph of
    /// `graph_size` nodes (0 when no graph will be built in it).
    pub fn new(max_tensors: usize, graph_size: usize) -> Result<Self, GgmlError> {
        // SAFETY: pure size computations.
        let mut bytes = max_tensors * unsafe { sys::ggml_tensor_overhead() };
        if graph_size > 0 {
            // SAFETY: pure size computation.
            bytes += unsafe { sys::ggml_graph_overhead_custom(graph_size, false) };
        }
        let params = sys::ggml_init_params {
            mem_size: bytes.max(1024),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: ggml allocates its own memory pool of `mem_size`; returns null on failure.
        let raw = unsafe { sys::ggml_init(params) };
        NonNull::new(raw)
            .map(|raw| Self { raw })
            .ok_or(GgmlError::ContextInit { bytes })
    }

    pub(super) fn raw(&self) -> *mut sys::ggml_context {
        self.raw.as_ptr()
    }

    pub(super) fn wrap<'c>(&'c self, t: *mut sys::ggml_tensor) -> Tensor<'c> {
        Tensor {
            raw: NonNull::new(t)
                .expect("ggml returned a null tensor (context out of metadata room)"),
            _ctx: PhantomData,
        }
    }

    /// A new tensor of type `ty` and shape `ne` (ggml order); `ne` entries past the rank are 1.
    pub fn new_tensor(&self, ty: DType, ne: Ne) -> Tensor<'_> {
        let ne64 = ne.map(|d| d as i64);
        // SAFETY: the context is live; ggml asserts on invalid shapes (programming errors).
        self.wrap(unsafe { sys::ggml_new_tensor(self.raw(), ty.raw(), 4, ne64.as_ptr()) })
    }

    /// Iterates the tensors created in this context, in creation order. Private to ggml: a
    /// graph context's tensors may be views of shorter-lived memory, which the lifetimes of
    /// the handles ops return keep track of, and this iteration would forget.
    pub(super) fn tensors(&self) -> Vec<Tensor<'_>> {
        let mut out = Vec::new();
        // SAFETY: iteration over the live context's object list.
        let mut t = unsafe { sys::ggml_get_first_tensor(self.raw()) };
        while !t.is_null() {
            out.push(self.wrap(t));
            // SAFETY: `t` is a tensor of this context.
            t = unsafe { sys::ggml_get_next_tensor(self.raw(), t) };
        }
        out
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: we own the context and free it exactly once.
        unsafe { sys::ggml_free(self.raw.as_ptr()) }
    }
}

/// A handle to a tensor in a [`Context`]. `Copy`; valid while the context borrow lives.
#[derive(Clone, Copy)]
pub struct Tensor<'c> {
    raw: NonNull<sys::ggml_tensor>,
    _ctx: PhantomData<&'c Context>,
}

impl<'c> Tensor<'c> {
    pub(super) fn raw(self) -> *mut sys::ggml_tensor {
        self.raw.as_ptr()
    }

    /// A handle for a tensor reached from another one (a source, a view's base). Callers
    /// pick `'c` no longer than the life of the context that holds it.
    pub(super) fn from_raw(raw: NonNull<sys::ggml_tensor>) -> Self {
        Tensor {
            raw,
            _ctx: PhantomData,
        }
    }

    fn get(&self) -> &sys::ggml_tensor {
        // SAFETY: the handle's lifetime keeps the owning context (and so the tensor) alive.
        unsafe { self.raw.as_ref() }
    }

    /// Shape in ggml order.
    pub fn ne(self) -> Ne {
        self.get().ne.map(|d| d as usize)
    }

    /// Strides in bytes, ggml order.
    pub fn nb(self) -> [usize; 4] {
        self.get().nb
    }

    pub fn ty(self) -> DType {
        DType::from_raw(self.get().type_).unwrap_or(DType::F32)
    }

    pub fn n_elements(self) -> usize {
        self.ne().iter().product()
    }

    /// Bytes of data (for contiguous tensors).
    pub fn n_bytes(self) -> usize {
        // SAFETY: reads the live tensor's metadata.
        unsafe { sys::ggml_nbytes(self.raw()) }
    }

    pub fn is_contiguous(self) -> bool {
        // SAFETY: reads the live tensor's metadata.
        unsafe { sys::ggml_is_contiguous(self.raw()) }
    }

    /// Whether the tensor is a view of another's memory (reshape, view, permute, transpose).
    /// Marking a view as an output does not keep its source's memory from being reused by
    /// ggml's graph allocator: copy it first (`cont`) when its value must survive the graph.
    pub fn is_view(self) -> bool {
        !self.get().view_src.is_null()
    }

    /// Byte offset of a view into its source's memory (0 for a tensor that is not a view).
    pub fn view_offset(self) -> usize {
        self.get().view_offs
    }

    /// Sets the tensor's ggml name; names longer than ggml's 63 bytes are truncated by ggml, so
    /// callers keep long names on the Rust side.
    pub fn set_name(self, name: &str) -> Self {
        let mut buf: Vec<u8> = name
            .bytes()
            .filter(|&b| b != 0)
            .take(super::MAX_NAME_LEN)
            .collect();
        buf.push(0);
        // SAFETY: `buf` is NUL-terminated and ggml copies it into the tensor's name field.
        unsafe { sys::ggml_set_name(self.raw(), buf.as_ptr().cast()) };
        self
    }

    pub fn name(self) -> String {
        // SAFETY: ggml keeps the name NUL-terminated in a fixed-size field.
        unsafe { CStr::from_ptr(self.get().name.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Marks the tensor as a graph input so the allocator gives it its own memory.
    pub fn mark_input(self) -> Self {
        // SAFETY: sets a flag on the live tensor.
        unsafe { sys::ggml_set_input(self.raw()) };
        self
    }

    /// Marks the tensor as a graph output so the allocator does not reuse its memory.
    pub fn mark_output(self) -> Self {
        // SAFETY: sets a flag on the live tensor.
        unsafe { sys::ggml_set_output(self.raw()) };
        self
    }

    /// Whether the tensor has memory (in a backend buffer) yet.
    pub fn is_allocated(self) -> bool {
        !self.get().buffer.is_null()
    }

    /// Checks that the tensor's memory is bound and, for a view, that it still aliases its
    /// base where the base is now (a base can move: offloaded weights, re-allocated graphs).
    /// Every owner of memory unbinds its tensors when it lets the memory go, so a bound
    /// tensor's memory is live.
    pub fn check_bound(self) -> Result<(), GgmlError> {
        let t = self.get();
        if t.buffer.is_null() || t.data.is_null() {
            return Err(GgmlError::Unbound(self.name()));
        }
        if let Some(base) = self.view_base() {
            let b = base.get();
            let expected = (b.data as usize).wrapping_add(t.view_offs);
            if b.buffer != t.buffer || b.data.is_null() || t.data as usize != expected {
                return Err(GgmlError::Unbound(format!(
                    "{} (a view of '{}', which has moved or lost its memory)",
                    self.name(),
                    base.name()
                )));
            }
        }
        Ok(())
    }

    /// Forgets the compute-buffer memory an allocator lent this tensor, once the allocator may
    /// reuse or free it. A later graph can still name the tensor as a source's source (ggml's
    /// RPC client sends those too), and then it carries no pointer into memory that moved.
    pub fn release_compute_memory(self) {
        self.unbind();
    }

    /// Drops the tensor's binding to its memory (its owner is freeing that memory).
    pub(super) fn unbind(self) {
        // SAFETY: live tensor (lifetime 'c); only the binding fields change.
        let t = unsafe { &mut *self.raw() };
        t.buffer = std::ptr::null_mut();
        t.data = std::ptr::null_mut();
    }

    /// Copies `bytes` into the tensor's backend memory.
    pub fn write_bytes(self, bytes: &[u8]) -> Result<(), GgmlError> {
        self.check_bound()?;
        let n = self.n_bytes();
        if bytes.len() != n {
            return Err(GgmlError::DataSize {
                name: self.name(),
                expected: n,
                got: bytes.len(),
            });
        }
        // SAFETY: the tensor's memory is bound and live, and `bytes` has exactly its size.
        unsafe { sys::ggml_backend_tensor_set(self.raw(), bytes.as_ptr().cast(), 0, n) };
        Ok(())
    }

    /// Copies `bytes` into the tensor's backend memory from byte `offset` on.
    pub fn write_bytes_at(self, offset: usize, bytes: &[u8]) -> Result<(), GgmlError> {
        self.check_bound()?;
        let n = self.n_bytes();
        if offset.checked_add(bytes.len()).is_none_or(|end| end > n) {
            return Err(GgmlError::DataSize {
                name: self.name(),
                expected: n.saturating_sub(offset),
                got: bytes.len(),
            });
        }
        // SAFETY: the tensor's memory is bound and live, and offset + len lies inside it.
        unsafe {
            sys::ggml_backend_tensor_set(self.raw(), bytes.as_ptr().cast(), offset, bytes.len())
        };
        Ok(())
    }

    /// Writes f32 values into an f32 tensor.
    pub fn write_f32(self, data: &[f32]) -> Result<(), GgmlError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write_bytes(&bytes)
    }

    /// Writes i32 values into an i32 tensor.
    pub fn write_i32(self, data: &[i32]) -> Result<(), GgmlError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write_bytes(&bytes)
    }

    /// Reads the tensor's bytes back from backend memory.
    pub fn read_bytes(self) -> Result<Vec<u8>, GgmlError> {
        self.check_bound()?;
        let n = self.n_bytes();
        let mut out = vec![0u8; n];
        // SAFETY: the tensor's memory is bound and live, and `out` has exactly its size.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), 0, n) };
        Ok(out)
    }

    /// Reads a contiguous f32/f16/bf16 tensor back as f32.
    pub fn read_f32(self) -> Result<Vec<f32>, GgmlError> {
        let bytes = self.read_bytes()?;
        let ty = self.ty();
        let out = if ty == DType::F32 {
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        } else if ty == DType::F16 {
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()
        } else if ty == DType::BF16 {
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()
        } else {
            return Err(GgmlError::Unreadable {
                name: self.name(),
                ty: ty.name().to_string(),
            });
        };
        Ok(out)
    }
}
