//! Turning a built graph into an ordered list of segments at its cut marks.
//!
//! A graph's nodes are in execution order, so cutting the node list after each cut tensor
//! gives runs that can be computed one after another. What a run reads from outside itself
//! falls in three kinds: model weights (which the residency manager puts on the device),
//! tensors produced by earlier runs, and data-less leaves (graph inputs). The last two are
//! "pins": they get memory of their own, outside the compute buffer that the runs share, from
//! the start of the run that first needs them to the end of the run that last reads them.
//! Cut outputs are pins like any other hand-over (PixArt's shared adaLN vector, the caption
//! projection read by every block), and so are graph outputs, which must outlive the run that
//! makes them. (Cache stores copy into cache tensors that already have memory.)

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use super::super::graph_ctx::CutMark;
use super::super::weights::ModelWeights;
use crate::ggml::Tensor;

/// One run of consecutive nodes.
pub(crate) struct Segment<'g> {
    /// The cut group that closes it (the last run is named after the graph's end).
    pub name: String,
    pub nodes: Range<usize>,
    /// Weights (parameter indices) its nodes read.
    pub params: Vec<usize>,
    /// Views of weights made in an earlier run and read here: re-derived before the run,
    /// since the weight may have moved (device replica loaded or evicted) in between.
    pub weight_views: Vec<Tensor<'g>>,
}

/// A tensor with memory of its own for a span of runs.
pub(crate) struct Pin<'g> {
    pub tensor: Tensor<'g>,
    /// First and last run that need its memory.
    pub first: usize,
    pub last: usize,
}

pub(crate) struct Plan<'g> {
    pub segments: Vec<Segment<'g>>,
    pub pins: Vec<Pin<'g>>,
    /// Every weight the graph reads.
    pub params: Vec<usize>,
}

impl Plan<'_> {
    /// Bytes of pins alive during run `s`.
    pub fn pin_bytes_at(&self, s: usize) -> usize {
        self.pins
            .iter()
            .filter(|p| p.first <= s && s <= p.last)
            .map(|p| p.tensor.n_bytes())
            .sum()
    }
}

/// Plans `nodes` (execution order) split after each cut tensor that is one of them.
/// `ends` are tensors read after the graph ran (its outputs).
pub(crate) fn plan<'g>(
    nodes: &[Tensor<'g>],
    cuts: &[(Tensor<'g>, CutMark)],
    weights: Option<&ModelWeights>,
    ends: &[Tensor<'g>],
) -> Plan<'g> {
    let node_index: HashMap<usize, usize> =
        nodes.iter().enumerate().map(|(i, t)| (t.id(), i)).collect();

    // Run boundaries: after each cut node (not after the last node).
    let mut bounds: Vec<(usize, String)> = cuts
        .iter()
        .filter_map(|(t, m)| node_index.get(&t.id()).map(|&i| (i, m.group.clone())))
        .filter(|&(i, _)| i + 1 < nodes.len())
        .collect();
    bounds.sort_by_key(|b| b.0);
    bounds.dedup_by_key(|b| b.0);
    let mut segments = Vec::with_capacity(bounds.len() + 1);
    let mut start = 0;
    for (end, name) in bounds {
        segments.push(Segment {
            name,
            nodes: start..end + 1,
            params: Vec::new(),
            weight_views: Vec::new(),
        });
        start = end + 1;
    }
    segments.push(Segment {
        name: "graph end".into(),
        nodes: start..nodes.len(),
        params: Vec::new(),
        weight_views: Vec::new(),
    });
    let mut seg_of = vec![0usize; nodes.len()];
    for (s, seg) in segments.iter().enumerate() {
        for i in seg.nodes.clone() {
            seg_of[i] = s;
        }
    }

    let weight_of = |t: Tensor<'g>| weights.and_then(|w| w.index_of(t.id()));
    // Pins by storage identity: (tensor, first, last).
    let mut pins: HashMap<usize, Pin<'g>> = HashMap::new();
    let mut pin = |t: Tensor<'g>, first: usize, user: usize| {
        let p = pins.entry(t.id()).or_insert(Pin {
            tensor: t,
            first,
            last: user,
        });
        p.first = p.first.min(first);
        p.last = p.last.max(user);
    };
    let mut all_params = BTreeSet::new();
    for (s, seg) in segments.iter_mut().enumerate() {
        let mut params = BTreeSet::new();
        let mut views: HashMap<usize, Tensor<'g>> = HashMap::new();
        for i in seg.nodes.clone() {
            let node = nodes[i];
            let mut reads = node.srcs();
            reads.extend(node.view_base());
            for src in reads {
                let storage = src.storage();
                if let Some(p) = weight_of(storage) {
                    params.insert(p);
                    let made_earlier = node_index.get(&src.id()).is_some_and(|&j| seg_of[j] < s);
                    if src.view_base().is_some() && made_earlier {
                        views.insert(src.id(), src);
                    }
                } else if let Some(&j) = node_index.get(&storage.id()) {
                    if seg_of[j] < s {
                        pin(storage, seg_of[j], s);
                    }
                } else if !storage.has_data() {
                    // A graph input (or another leaf without memory).
                    pin(storage, s, s);
                }
            }
        }
        all_params.extend(params.iter().copied());
        seg.params = params.into_iter().collect();
        seg.weight_views = views.into_values().collect();
    }
    let last = segments.len() - 1;
    for &t in ends {
        let storage = t.storage();
        if weight_of(storage).is_some()
            || (storage.has_data() && !node_index.contains_key(&storage.id()))
        {
            continue;
        }
        let first = node_index.get(&storage.id()).map_or(0, |&j| seg_of[j]);
        pin(storage, first, last);
    }
    let mut pins: Vec<Pin<'g>> = pins.into_values().collect();
    pins.sort_by_key(|p| (p.first, p.last, p.tensor.id()));
    Plan {
        segments,
        pins,
        params: all_params.into_iter().collect(),
    }
}
