//! Looking inside built graphs for the graph-cut planner: a tensor's sources, the base a view
//! aliases, allocation state and flags; and re-deriving a view's memory after its base moved.

use std::ffi::CStr;
use std::ptr::NonNull;

use super::context::Tensor;
use super::error::GgmlError;
use super::sys;

/// Most sources an op can have (`GGML_MAX_SRC`).
pub const MAX_SRC: usize = sys::GGML_MAX_SRC as usize;

impl<'c> Tensor<'c> {
    fn meta(self) -> &'c sys::ggml_tensor {
        // SAFETY: the handle's lifetime keeps the owning context (and so the tensor) alive.
        unsafe { &*self.raw() }
    }

    /// A stable identity for maps and sets (the tensor's address; never dereferenced).
    pub fn id(self) -> usize {
        self.raw() as usize
    }

    /// The `j`-th source of an op, if any. Sources outlive the op: a graph op's operands are
    /// handles whose lifetimes cover the op's (`Tensor` is covariant in its lifetime).
    pub fn src(self, j: usize) -> Option<Tensor<'c>> {
        self.meta()
            .src
            .get(j)
            .and_then(|&p| NonNull::new(p))
            .map(Tensor::from_raw)
    }

    /// All sources of an op, in order.
    pub fn srcs(self) -> Vec<Tensor<'c>> {
        (0..MAX_SRC).filter_map(|j| self.src(j)).collect()
    }

    /// The tensor whose memory this view aliases (ggml keeps it a non-view), if a view.
    pub fn view_base(self) -> Option<Tensor<'c>> {
        NonNull::new(self.meta().view_src).map(Tensor::from_raw)
    }

    /// The tensor that owns this one's memory: its view base, or itself.
    pub fn storage(self) -> Tensor<'c> {
        self.view_base().unwrap_or(self)
    }

    /// Whether the tensor's data pointer is set (in some backend buffer).
    pub fn has_data(self) -> bool {
        !self.meta().data.is_null()
    }

    pub fn is_input(self) -> bool {
        self.meta().flags & sys::GGML_TENSOR_FLAG_INPUT as i32 != 0
    }

    pub fn is_output(self) -> bool {
        self.meta().flags & sys::GGML_TENSOR_FLAG_OUTPUT as i32 != 0
    }

    /// Whether the tensor is a graph leaf (no op).
    pub fn is_leaf(self) -> bool {
        self.meta().op == sys::GGML_OP_NONE
    }

    /// The op's short name (e.g. "MUL_MAT"), for logs.
    pub fn op_name(self) -> String {
        // SAFETY: ggml returns a static string for any tensor.
        let p = unsafe { sys::ggml_op_desc(self.raw()) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Re-derives a view's memory from its base (after the base was re-bound elsewhere).
    /// No-op for non-views and for views whose base has no memory yet.
    pub fn refresh_view(self) -> Result<(), GgmlError> {
        let Some(base) = self.view_base() else {
            return Ok(());
        };
        if !base.has_data() || base.meta().buffer.is_null() {
            return Ok(());
        }
        // SAFETY: the view and its base are live (lifetime 'c); clearing the binding and
        // re-initialising it from the base is what ggml's allocator does for fresh views.
        let status = unsafe {
            let t = &mut *self.raw();
            t.buffer = std::ptr::null_mut();
            t.data = std::ptr::null_mut();
            sys::ggml_backend_view_init(self.raw())
        };
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(GgmlError::OutOfMemory {
                device: "view".into(),
                what: format!("re-binding view '{}'", self.name()),
                bytes: 0,
            })
        }
    }
}
