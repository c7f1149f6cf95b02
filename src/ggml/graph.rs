//! Computation graphs.

use std::ptr::NonNull;

use super::context::{Context, Tensor};
use super::sys;

/// A `ggml_cgraph` living inside a [`Context`]'s metadata pool.
pub struct Graph<'c> {
    raw: NonNull<sys::ggml_cgraph>,
    ctx: &'c Context,
}

impl<'c> Graph<'c> {
    /// A graph with room for `size` nodes; the context must have been created with at least
    /// that `graph_size`.
    pub fn new(ctx: &'c Context, size: usize) -> Self {
        // SAFETY: the context reserved room for a graph of `size` nodes (see Context::new).
        let raw = unsafe { sys::ggml_new_graph_custom(ctx.raw(), size, false) };
        Self {
            raw: NonNull::new(raw).expect("ggml context has no room for the graph"),
            ctx,
        }
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_cgraph {
        self.raw.as_ptr()
    }

    /// Adds `t` and everything it depends on to the graph.
    pub fn expand(&self, t: Tensor<'c>) {
        // SAFETY: graph and tensor belong to live contexts borrowed for 'c.
        unsafe { sys::ggml_build_forward_expand(self.raw(), t.raw()) }
    }

    pub fn n_nodes(&self) -> usize {
        // SAFETY: reads the live graph.
        unsafe { sys::ggml_graph_n_nodes(self.raw()) as usize }
    }

    /// The i-th node in execution order.
    pub fn node(&self, i: usize) -> Tensor<'c> {
        // SAFETY: index checked against the node count below by ggml (asserts), and the node
        // belongs to a context that lives for 'c.
        self.ctx
            .wrap(unsafe { sys::ggml_graph_node(self.raw(), i as i32) })
    }
}
