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

    pub(super) fn raw(&self) -> *mut sys::ggml_cgraph {
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

pub(super) fn sealed_ptr<G: sealed::Sealed>(g: &G) -> *mut sys::ggml_cgraph {
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
        let padding = 4 * outside_tensors(nodes);
        let size = (nodes.len() + padding).max(1);
        let ctx = Context::new(padding, size)?;
        // SAFETY: the context reserved room for a graph of `size` nodes.
        let raw = unsafe { sys::ggml_new_graph_custom(ctx.raw(), size, false) };
        let raw = NonNull::new(raw).ok_or(super::GgmlError::ContextInit { bytes: size })?;
        let pads = (0..padding).map(|_| ctx.new_tensor(crate::dtype::DType::F32, [1, 1, 1, 1]));
        for t in nodes.iter().map(|t| t.raw()).chain(pads.map(|t| t.raw())) {
            // SAFETY: `size` ≥ the node count added, so ggml's capacity assert holds; the
            // nodes live for 't and the pads as long as this graph's own context.
            unsafe { sys::ggml_graph_add_node(raw.as_ptr(), t) };
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

/// How many tensors the nodes read without computing them (weights, inputs, earlier
/// segments' results, view bases).
///
/// ggml's allocator sizes its hash table from the graph's node and leaf counts alone (with a
/// 25 % margin) and aborts when more tensors than that show up; a run of nodes has no leafs,
/// so [`SubGraph::new`] pads it with this many times four inert 1-element nodes (op NONE:
/// allocated, never computed), which keeps the table large enough for any mix of sources.
fn outside_tensors(nodes: &[Tensor<'_>]) -> usize {
    let inside: std::collections::HashSet<usize> = nodes.iter().map(|t| t.id()).collect();
    let mut outside = std::collections::HashSet::new();
    for t in nodes {
        for s in t.srcs().into_iter().chain(t.view_base()) {
            for u in std::iter::once(s).chain(s.view_base()) {
                if !inside.contains(&u.id()) {
                    outside.insert(u.id());
                }
            }
        }
    }
    outside.len()
}

impl sealed::Sealed for SubGraph<'_> {
    fn graph_ptr(&self) -> *mut sys::ggml_cgraph {
        self.raw.as_ptr()
    }
}
impl ComputeGraph for SubGraph<'_> {}
