//! Per-op timing of a graph, for finding where time goes (`SD_CLI_PROFILE=1`): every node is
//! computed on its own and its time added to its op's total (matrix products split by weight
//! type and whether the activation operand is contiguous). Running node by node costs some
//! speed, so use it to compare shares, not to benchmark.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::ggml::{Backend, BlockedOp, GgmlError, Graph, SubGraph, Tensor};

/// Whether `SD_CLI_PROFILE` asks for profiles.
pub(crate) fn enabled() -> bool {
    std::env::var_os("SD_CLI_PROFILE").is_some_and(|v| v != "0" && !v.is_empty())
}

fn key(node: Tensor<'_>) -> String {
    let op = node.op_name();
    match (BlockedOp::of(node), op.as_str(), node.src(0), node.src(1)) {
        (None, "MUL_MAT", Some(a), Some(b)) => format!(
            "MUL_MAT {} {:?} x {} {:?}{}",
            a.ty(),
            a.ne(),
            b.ty(),
            b.ne(),
            if b.is_contiguous() { "" } else { " (strided)" }
        ),
        // The blocked kernels (`ggml::gemm`) are ggml custom ops.
        (Some(BlockedOp::Attention), _, Some(q), _) => format!("BLOCKED_ATTENTION q {:?}", q.ne()),
        (Some(BlockedOp::Linear), _, Some(x), Some(w)) => format!(
            "BLOCKED_GEMM {} {:?} x {} {:?}",
            w.ty(),
            w.ne(),
            x.ty(),
            x.ne()
        ),
        (Some(BlockedOp::Im2col), ..) => "BLOCKED_IM2COL".into(),
        (Some(BlockedOp::Transpose), ..) => "BLOCKED_TRANSPOSE".into(),
        (Some(BlockedOp::Geglu), ..) => "BLOCKED_GEGLU".into(),
        (Some(BlockedOp::Gelu), ..) => "BLOCKED_GELU".into(),
        (Some(BlockedOp::Rope), ..) => "BLOCKED_ROPE".into(),
        (Some(BlockedOp::Norm), ..) => "BLOCKED_NORM".into(),
        (Some(BlockedOp::Conv), _, _, Some(w)) => format!("BLOCKED_CONV {} {:?}", w.ty(), w.ne()),
        _ => op,
    }
}

/// Computes `graph` node by node and prints each op's share of the time to stderr.
pub(crate) fn compute_profiled(
    name: &str,
    backend: &Backend,
    graph: &Graph<'_>,
) -> Result<(), GgmlError> {
    let mut totals: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    let start = Instant::now();
    for i in 0..graph.n_nodes() {
        let node = graph.node(i);
        let sub = SubGraph::new(&[node])?;
        let t = Instant::now();
        backend.compute(&sub)?;
        let e = totals.entry(key(node)).or_default();
        e.0 += t.elapsed().as_secs_f64();
        e.1 += 1;
    }
    let all = start.elapsed().as_secs_f64();
    let mut rows: Vec<_> = totals.into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    eprintln!("profile {name}: {all:.3} s over {} nodes", graph.n_nodes());
    for (op, (secs, count)) in rows.iter().filter(|r| r.1 .0 >= all * 0.002) {
        eprintln!(
            "  {op:<64} {secs:8.3} s {:5.1}%  ({count} nodes)",
            100.0 * secs / all
        );
    }
    Ok(())
}
