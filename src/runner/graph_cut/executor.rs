//! Running a built graph monolithically or segment by segment within the device budget.

use std::collections::{HashMap, HashSet};

use super::plan::{plan, Plan};
use super::{human, RunReport, SegmentReport};
use crate::ggml::{Backend, BoundBuffer, Gallocr, GgmlError, Graph, SubGraph, Tensor};
use crate::runner::graph_ctx::GraphCtx;
use crate::runner::weights::ModelWeights;
use crate::runner::{write_input, Runner, RunnerError};

fn oom(runner: &Runner, cap: Option<usize>, what: String, bytes: usize) -> RunnerError {
    let device = match cap {
        Some(c) => format!("{} (budget {})", runner.backend.name(), human(c)),
        None => runner.backend.name().to_string(),
    };
    RunnerError::Ggml(GgmlError::OutOfMemory {
        device,
        what,
        bytes,
    })
}

fn measure<G: crate::ggml::ComputeGraph>(runner: &Runner, graph: &G) -> Result<usize, RunnerError> {
    let mut slot = runner.measure.borrow_mut();
    if slot.is_none() {
        *slot = Some(Gallocr::new(&runner.backend)?);
    }
    Ok(slot.as_mut().map_or(0, |m| m.measure(graph)))
}

fn buffer_size(slot: &Option<Gallocr>) -> usize {
    slot.as_ref().map_or(0, Gallocr::buffer_size)
}

/// The device limit for this call in "total bytes this runner may hold" terms: the managed
/// budget and, off the CPU, free device memory plus what the runner already holds, less the
/// scratch reserve.
fn capacity(runner: &Runner, held: usize) -> Option<usize> {
    let device = (!runner.backend.is_cpu()).then(|| {
        let (free, _) = runner.backend.memory();
        (free + held).saturating_sub(runner.options.memory.scratch_reserve)
    });
    match (runner.budget, device) {
        (Some(b), Some(d)) => Some(b.min(d)),
        (b, d) => b.or(d),
    }
}

fn weight_tensors<'w>(w: &'w ModelWeights, params: &[usize]) -> Vec<Tensor<'w>> {
    params.iter().map(|&p| w.arena().get(p)).collect()
}

/// Runs `graph` (built in `g`; `ends` are its outputs) monolithically when it fits the
/// budget, else segment by segment, and returns what `read` reads of the outputs while their
/// memory is still bound. Inputs are written here. `cache_bytes`: device memory the runner's
/// cache holds (this graph's store destinations included).
pub(crate) fn execute<'g, R>(
    runner: &Runner,
    g: &GraphCtx<'g>,
    graph: &Graph<'g>,
    ends: &[Tensor<'g>],
    cache_bytes: usize,
    read: impl FnOnce() -> Result<R, GgmlError>,
) -> Result<R, RunnerError> {
    let opts = &runner.options.memory;
    let weights = runner.weights.as_ref();
    let nodes = graph.nodes();
    let plan = plan(&nodes, &g.cuts.borrow(), weights, ends);
    let offload = weights.is_some_and(ModelWeights::is_offloaded);
    let fixed = weights.map_or(0, ModelWeights::device_bytes);

    let mono_compute = measure(runner, graph)?;
    let mono_buf = buffer_size(&runner.gallocr.borrow());
    let seg_buf = buffer_size(&runner.seg_gallocr.borrow());
    let replicas = runner.residency.borrow().bytes();
    let cap = capacity(runner, fixed + cache_bytes + replicas + mono_buf + seg_buf);
    let graph_weights = match weights {
        Some(w) if offload => runner.backend.bytes_for(&weight_tensors(w, &plan.params)),
        _ => 0,
    };
    let mono_need = fixed + cache_bytes + graph_weights + mono_compute.max(mono_buf);
    let can_split = opts.segmented && plan.segments.len() > 1;
    let segmented = match cap {
        _ if opts.force_segmented && can_split => true,
        None => false,
        Some(c) if mono_need + opts.planning_headroom <= c => false,
        Some(_) if can_split => true,
        Some(c) if mono_need <= c => false,
        Some(_) => {
            let why = if plan.segments.len() > 1 {
                "segmented compute is disabled"
            } else {
                "the graph has no cut points to split it at"
            };
            return Err(oom(
                runner,
                cap,
                format!(
                    "{} graph: weights {} + compute {} + cache {} ({why})",
                    runner.name,
                    human(fixed + graph_weights),
                    human(mono_compute),
                    human(cache_bytes)
                ),
                mono_need,
            ));
        }
    };
    if segmented {
        run_segments(runner, g, &nodes, &plan, cap, cache_bytes, read)
    } else {
        let need = (mono_need, mono_compute);
        run_whole(runner, g, graph, &plan, cap, need, read)
    }
}

fn run_whole<'g, R>(
    runner: &Runner,
    g: &GraphCtx<'g>,
    graph: &Graph<'g>,
    plan: &Plan<'g>,
    cap: Option<usize>,
    (need, compute): (usize, usize),
    read: impl FnOnce() -> Result<R, GgmlError>,
) -> Result<R, RunnerError> {
    *runner.seg_gallocr.borrow_mut() = None;
    let mut report = SegmentReport {
        name: "whole graph".into(),
        nodes: graph.n_nodes(),
        compute_bytes: compute,
        ..SegmentReport::default()
    };
    if let Some(w) = runner.weights.as_ref().filter(|w| w.is_offloaded()) {
        let mut res = runner.residency.borrow_mut();
        report.weight_bytes = runner.backend.bytes_for(&weight_tensors(w, &plan.params));
        let missing = res.missing(&plan.params);
        if let Some(c) = cap {
            let over = (need - report.weight_bytes
                + res.bytes()
                + runner.backend.bytes_for(&weight_tensors(w, &missing)))
            .saturating_sub(c);
            if over > 0 {
                report.evicted_bytes = res.evict(w, &plan.params, over);
            }
        }
        report.loaded_bytes = res.load(w, &runner.backend, &missing, 0, None)?;
        settle(runner, &mut res);
    }
    let mut slot = runner.gallocr.borrow_mut();
    if slot.is_none() {
        *slot = Some(Gallocr::new(&runner.backend)?);
    }
    let galloc = slot.as_mut().expect("allocator just created");
    let allocation = galloc.alloc(graph)?;
    for (t, name, data) in g.inputs.borrow().iter() {
        if t.is_allocated() {
            write_input(*t, name, data)?;
        }
    }
    runner.backend.compute(graph)?;
    let results = read()?;
    drop(allocation);
    report.device_bytes = need;
    report.required_bytes = need;
    *runner.report.borrow_mut() = Some(RunReport {
        segmented: false,
        peak_bytes: need,
        capacity: cap,
        segments: vec![report],
    });
    Ok(results)
}

/// Waits for uploads still in flight on the copy stream.
fn settle(runner: &Runner, res: &mut super::Residency) {
    if res.in_flight() {
        if let Some(Some(stream)) = runner.stream.borrow().as_ref() {
            stream.synchronize();
        }
        res.landed();
    }
}

/// The copy stream for async prefetch, opened on first use (None on devices without async
/// transfers: the prefetch then happens synchronously, one segment ahead).
fn copy_stream(runner: &Runner) -> Option<std::cell::Ref<'_, Backend>> {
    {
        let mut slot = runner.stream.borrow_mut();
        if slot.is_none() {
            let s = if runner.backend.supports_async() {
                runner.backend.new_stream().ok()
            } else {
                None
            };
            *slot = Some(s);
        }
    }
    std::cell::Ref::filter_map(runner.stream.borrow(), |s| {
        s.as_ref().and_then(Option::as_ref)
    })
    .ok()
}

fn run_segments<'g, R>(
    runner: &Runner,
    g: &GraphCtx<'g>,
    nodes: &[Tensor<'g>],
    plan: &Plan<'g>,
    cap: Option<usize>,
    cache_bytes: usize,
    read: impl FnOnce() -> Result<R, GgmlError>,
) -> Result<R, RunnerError> {
    *runner.gallocr.borrow_mut() = None;
    let opts = &runner.options.memory;
    let weights = runner.weights.as_ref();
    let offload = weights.is_some_and(ModelWeights::is_offloaded);
    let fixed = weights.map_or(0, ModelWeights::device_bytes);
    let n = plan.segments.len();
    let inputs = g.inputs.borrow();
    let input_at: HashMap<usize, usize> = inputs
        .iter()
        .enumerate()
        .map(|(i, (t, _, _))| (t.id(), i))
        .collect();

    // Pins grouped by lifetime: one buffer per (first, last) span.
    let mut groups: Vec<((usize, usize), Vec<Tensor<'g>>)> = Vec::new();
    for p in &plan.pins {
        match groups.iter_mut().find(|(k, _)| *k == (p.first, p.last)) {
            Some((_, v)) => v.push(p.tensor),
            None => groups.push(((p.first, p.last), vec![p.tensor])),
        }
    }
    let pinned_ids: HashSet<usize> = plan.pins.iter().map(|p| p.tensor.id()).collect();
    let node_ids: HashSet<usize> = nodes.iter().map(|t| t.id()).collect();
    let mut pinned_views: Vec<Tensor<'g>> = Vec::new();
    // Hand-over buffers with the last segment that reads them; outputs live to the end.
    let mut live: Vec<(usize, BoundBuffer<'g>)> = Vec::new();
    let mut reports = Vec::with_capacity(n);
    let mut peak = 0usize;
    for (s, seg) in plan.segments.iter().enumerate() {
        for ((first, last), tensors) in groups.iter().filter(|((f, _), _)| *f == s) {
            let what = format!(
                "{}: hand-over tensors of segments {first}..={last}",
                runner.name
            );
            live.push((*last, runner.backend.alloc_tensors(tensors, &what)?));
            for t in tensors {
                if let Some(&i) = input_at.get(&t.id()) {
                    let (t, name, data) = &inputs[i];
                    write_input(*t, name, data)?;
                }
            }
        }
        let sub = SubGraph::new(&nodes[seg.nodes.clone()])?;
        let compute = measure(runner, &sub)?;
        let pinned = plan.pin_bytes_at(s);
        let mut compute_held = compute.max(buffer_size(&runner.seg_gallocr.borrow()));
        // The compute buffer another segment (or an earlier call) grew is given back where
        // keeping it would put this segment over the budget: it needs only its own. Without
        // this, a budget that fits every segment of the first call refuses a smaller segment
        // on the next, behind the previous call's larger last segment.
        let own_weights = match weights.filter(|_| offload) {
            Some(w) => runner.backend.bytes_for(&weight_tensors(w, &seg.params)),
            None => 0,
        };
        let need = fixed + cache_bytes + pinned + compute_held + own_weights;
        if compute_held > compute && cap.is_some_and(|c| need > c) {
            *runner.seg_gallocr.borrow_mut() = None;
            compute_held = compute;
        }
        let base = fixed + cache_bytes + pinned + compute_held;
        let mut rep = SegmentReport {
            name: seg.name.clone(),
            nodes: seg.nodes.len(),
            compute_bytes: compute,
            pinned_bytes: pinned,
            ..SegmentReport::default()
        };
        let mut missing = Vec::new();
        let mut usage = base;
        if let Some(w) = weights.filter(|_| offload) {
            let mut res = runner.residency.borrow_mut();
            rep.weight_bytes = own_weights;
            missing = res.missing(&seg.params);
            let missing_bytes = runner.backend.bytes_for(&weight_tensors(w, &missing));
            if let Some(c) = cap {
                let over = (base + res.bytes() + missing_bytes).saturating_sub(c);
                if over > 0 {
                    rep.evicted_bytes = res.evict(w, &seg.params, over);
                }
            }
            usage += res.bytes() + missing_bytes;
        } else if let Some(w) = weights {
            rep.weight_bytes = weight_tensors(w, &seg.params)
                .iter()
                .map(|t| t.n_bytes())
                .sum();
        }
        rep.required_bytes = base + if offload { rep.weight_bytes } else { 0 };
        if let Some(c) = cap.filter(|&c| usage > c) {
            return Err(oom(
                runner,
                Some(c),
                format!(
                    "{} segment {}/{n} '{}': weights {} + compute {} + hand-over {} + resident {}; the budget is smaller than this segment needs",
                    runner.name,
                    s + 1,
                    seg.name,
                    human(if offload { rep.weight_bytes } else { 0 }),
                    human(compute_held),
                    human(pinned),
                    human(fixed + cache_bytes)
                ),
                usage,
            ));
        }
        if let Some(w) = weights.filter(|_| offload) {
            let mut res = runner.residency.borrow_mut();
            rep.loaded_bytes = res.load(w, &runner.backend, &missing, s, None)?;
            settle(runner, &mut res);
        }
        for v in &seg.weight_views {
            v.refresh_view()?;
        }
        // Prefetch the next segment's weights while this one runs, making room by evicting
        // (from the last segment backward) anything neither segment reads.
        if let (Some(w), true, Some(next)) = (
            weights.filter(|_| offload),
            opts.prefetch,
            plan.segments.get(s + 1),
        ) {
            let stream = copy_stream(runner);
            let mut res = runner.residency.borrow_mut();
            let mut missing = res.missing(&next.params);
            if stream.is_none() && !opts.sync_prefetch {
                missing.clear();
            }
            let bytes = runner.backend.bytes_for(&weight_tensors(w, &missing));
            let cap = cap.unwrap_or(usize::MAX);
            if !missing.is_empty() && base + res.bytes() + bytes > cap {
                let keep: Vec<usize> = seg.params.iter().chain(&next.params).copied().collect();
                let over = base + res.bytes() + bytes - cap;
                rep.evicted_bytes += res.evict(w, &keep, over);
            }
            if !missing.is_empty() && base + res.bytes() + bytes <= cap {
                rep.prefetched_bytes =
                    res.load(w, &runner.backend, &missing, s + 1, stream.as_deref())?;
            }
        }
        rep.device_bytes = base + runner.residency.borrow().bytes();
        peak = peak.max(rep.device_bytes);
        {
            let mut slot = runner.seg_gallocr.borrow_mut();
            if slot.is_none() {
                *slot = Some(Gallocr::new(&runner.backend)?);
            }
            let galloc = slot.as_mut().expect("allocator just created");
            let _allocation = galloc.alloc(&sub)?;
            runner.backend.compute(&sub)?;
        }
        release_intermediates(
            &nodes[seg.nodes.clone()],
            |t| node_ids.contains(&t.id()) || weights.is_some_and(|w| w.index_of(t.id()).is_some()),
            &pinned_ids,
            &mut pinned_views,
        );
        if s + 1 < n {
            live.retain(|(last, _)| *last != s);
            // Views of hand-over tensors whose buffer just went keep no pointer into it.
            pinned_views.retain(|v| {
                let freed = !v.storage().has_data();
                if freed {
                    v.release_compute_memory();
                }
                !freed
            });
        }
        log_segment(runner, s, n, &rep);
        reports.push(rep);
    }
    settle(runner, &mut runner.residency.borrow_mut());
    let report = RunReport {
        segmented: true,
        segments: reports,
        peak_bytes: peak,
        capacity: cap,
    };
    log_plan(runner, &report);
    *runner.report.borrow_mut() = Some(report);
    let results = read()?;
    drop(live);
    Ok(results)
}

/// Unbinds what a finished segment's nodes hold in memory that moves: intermediates live in
/// the segment allocator's buffer, which the next segment reuses or reallocates, and views of
/// weights are re-derived by the segments that read them (the weight may be evicted or
/// reloaded). `movable` says whether a storage tensor is such (a node or a weight); views of
/// other memory (a cache store, an input) keep theirs. Views of hand-over tensors go to
/// `pinned_views`, to be unbound when their buffer goes.
fn release_intermediates<'g>(
    seg_nodes: &[Tensor<'g>],
    movable: impl Fn(Tensor<'g>) -> bool,
    pinned: &HashSet<usize>,
    pinned_views: &mut Vec<Tensor<'g>>,
) {
    for t in seg_nodes {
        let storage = t.storage();
        if pinned.contains(&storage.id()) {
            if storage.id() != t.id() {
                pinned_views.push(*t);
            }
        } else if movable(storage) {
            t.release_compute_memory();
        }
    }
}

fn log_segment(runner: &Runner, s: usize, n: usize, r: &SegmentReport) {
    let first = runner.logged_segments.get() != n;
    let level = if first {
        log::Level::Debug
    } else {
        log::Level::Trace
    };
    log::log!(
        level,
        "{} segment {}/{n} '{}': {} nodes, weights {}, compute {}, hand-over {}; loaded {}, prefetched {}, evicted {}; device {}",
        runner.name,
        s + 1,
        r.name,
        r.nodes,
        human(r.weight_bytes),
        human(r.compute_bytes),
        human(r.pinned_bytes),
        human(r.loaded_bytes),
        human(r.prefetched_bytes),
        human(r.evicted_bytes),
        human(r.device_bytes)
    );
}

fn log_plan(runner: &Runner, r: &RunReport) {
    let n = r.segments.len();
    let first = runner.logged_segments.replace(n) != n;
    let level = if first {
        log::Level::Debug
    } else {
        log::Level::Trace
    };
    log::log!(
        level,
        "{}: ran in {n} segments (budget {}), peak {}; weights loaded {}, prefetched {}, evicted {}; {} of weights resident",
        runner.name,
        r.capacity.map_or("none".to_string(), human),
        human(r.peak_bytes),
        human(r.loaded_bytes()),
        human(r.prefetched_bytes()),
        human(r.evicted_bytes()),
        human(runner.residency.borrow().bytes())
    );
}
