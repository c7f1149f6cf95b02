//! Computation graphs, whole or as runs of nodes (graph-cut segments).

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

    /// The graph's nodes in execution order.
    pub fn nodes(&self) -> Vec<Tensor<'c>> {
        (0..self.n_nodes()).map(|i| self.node(i)).collect()
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

mod sealed {
    /// Gives the raw graph to the backend and allocator (sealed: only this module's types).
    pub trait Sealed {
        fn graph_ptr(&self) -> *mut super::sys::ggml_cgraph;
    }
}

pub(crate) fn sealed_ptr<G: sealed::Sealed>(g: &G) -> *mut sys::ggml_cgraph {
    g.graph_ptr()
}

/// A graph that can be allocated and computed: a full [`Graph`] or a [`SubGraph`].
pub trait ComputeGraph: sealed::Sealed {}

impl sealed::Sealed for Graph<'_> {
    fn graph_ptr(&self) -> *mut sys::ggml_cgraph {
        self.raw()
    }
}
impl ComputeGraph for Graph<'_> {}

/// An ordered run of another graph's nodes, computed on its own (a graph-cut segment).
/// Tensors the nodes read that are not among them must already have memory when it is
/// allocated, or the allocator places them in the compute buffer like intermediates.
pub struct SubGraph<'t> {
    raw: NonNull<sys::ggml_cgraph>,
    n_nodes: usize,
    _ctx: Context,
    _nodes: std::marker::PhantomData<Tensor<'t>>,
}

impl<'t> SubGraph<'t> {
    pub fn new(nodes: &[Tensor<'t>]) -> Result<Self, super::GgmlError> {
        let size = nodes.len().max(1);
        let ctx = Context::new(0, size)?;
        // SAFETY: the context reserved room for a graph of `size` nodes.
        let raw = unsafe { sys::ggml_new_graph_custom(ctx.raw(), size, false) };
        let raw = NonNull::new(raw).ok_or(super::GgmlError::ContextInit { bytes: size })?;
        for t in nodes {
            // SAFETY: `size` ≥ nodes.len(), so ggml's capacity assert holds; the nodes live
            // for 't, which outlives this graph.
            unsafe { sys::ggml_graph_add_node(raw.as_ptr(), t.raw()) };
        }
        Ok(Self {
            raw,
            n_nodes: nodes.len(),
            _ctx: ctx,
            _nodes: std::marker::PhantomData,
        })
    }

    pub fn n_nodes(&self) -> usize {
        self.n_nodes
    }
}

impl sealed::Sealed for SubGraph<'_> {
    fn graph_ptr(&self) -> *mut sys::ggml_cgraph {
        self.raw.as_ptr()
    }
}
impl ComputeGraph for SubGraph<'_> {}
