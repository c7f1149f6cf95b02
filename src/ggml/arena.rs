//! A context plus an index of the tensors made in it: long-lived tensors (model weights,
//! cache entries) are referred to by index, so owners need no self-referential borrows.

use std::ptr::NonNull;

use super::context::{Context, Ne, Tensor};
use super::error::GgmlError;
use super::sys;
use super::types::GgmlType;

pub struct Arena {
    ctx: Context,
    tensors: Vec<NonNull<sys::ggml_tensor>>,
    capacity: usize,
}

impl Arena {
    /// Room for `capacity` tensors (metadata only).
    pub fn new(capacity: usize) -> Result<Self, GgmlError> {
        Ok(Self {
            ctx: Context::new(capacity, 0)?,
            tensors: Vec::new(),
            capacity,
        })
    }

    /// Adds a tensor and returns its index, or None when the arena is full.
    pub fn add(&mut self, ty: GgmlType, ne: Ne, name: &str) -> Option<usize> {
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
