//! Work handed out a piece at a time to whichever of ggml's threads asks next, instead of
//! fixed shares: on a busy machine a descheduled worker holds back at most the piece it is on,
//! and the others take the rest (issue 23: fixed halves made a step 2–2.8× slower under
//! contention where PyTorch slowed 1.2–1.7×).
//!
//! The counters live in two op-param words of the custom node that ggml's own custom-op
//! parameters leave free (they take words 0–5; ours start at 8). Every one of ggml's `nth`
//! threads calls the node's body once per evaluation (`ggml_compute_forward_custom` passes
//! each thread's `ith`/`nth`) and ggml waits for all of them before the next node, so the
//! last thread to finish can put both counters back to zero for the next evaluation.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::ggml::sys;

/// Pieces per thread a node's work is cut into: enough that a descheduled thread holds back
/// little, few enough that what each piece packs again stays a few percent of its work.
pub(super) const PIECES_PER_THREAD: usize = 4;

/// The op-param word holding the next unclaimed piece.
const NEXT: usize = 6;
/// The op-param word counting the threads done with this evaluation.
const DONE: usize = 7;

/// One thread's handle on a node's pieces; dropping it marks the thread done.
pub(super) struct Claims<'a> {
    next: &'a AtomicU32,
    done: &'a AtomicU32,
    threads: u32,
}

impl<'a> Claims<'a> {
    /// # Safety
    /// `dst` is a custom node built by [`super::custom_node`], being evaluated by ggml's `nth`
    /// threads, each of which makes exactly one `Claims` for this evaluation and drops it
    /// before returning; the node outlives `'a`.
    pub(super) unsafe fn of(dst: *mut sys::ggml_tensor, nth: usize) -> Self {
        // SAFETY: words 6 and 7 of the node's op params are aligned i32s that nothing else
        // reads or writes while it is evaluated (the contract above), so they may be shared
        // as atomics by its threads.
        let (next, done) = unsafe {
            let params = std::ptr::addr_of_mut!((*dst).op_params).cast::<u32>();
            (
                AtomicU32::from_ptr(params.add(NEXT)),
                AtomicU32::from_ptr(params.add(DONE)),
            )
        };
        Self {
            next,
            done,
            threads: nth.max(1) as u32,
        }
    }

    /// The next piece of `0..pieces` nobody has taken, or `None` when all are taken.
    pub(super) fn next(&self, pieces: usize) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        (i < pieces).then_some(i)
    }

    /// Calls `f` with each run of `0..items` this thread claims, the runs about
    /// [`PIECES_PER_THREAD`] per thread long.
    pub(super) fn each_run(&self, items: usize, f: impl FnMut(Range<usize>)) {
        self.each_run_at_most(items, usize::MAX, f)
    }

    /// As [`Self::each_run`], with runs of at most `most` items.
    pub(super) fn each_run_at_most(
        &self,
        items: usize,
        most: usize,
        mut f: impl FnMut(Range<usize>),
    ) {
        let per = items
            .div_ceil(PIECES_PER_THREAD * self.threads as usize)
            .min(most)
            .max(1);
        while let Some(piece) = self.next(items.div_ceil(per)) {
            f(piece * per..((piece + 1) * per).min(items))
        }
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        // The last one out resets the counters; ggml's barrier after the node orders these
        // stores before the node's next evaluation.
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.next.store(0, Ordering::Relaxed);
            self.done.store(0, Ordering::Relaxed);
        }
    }
}

/// How to walk a node's pieces on the calling thread: every piece in order (a caller that
/// already split the work), or as claimed from the node's counters.
pub(super) enum Pieces<'a> {
    All,
    Claimed(&'a Claims<'a>),
}

impl Pieces<'_> {
    /// Calls `f` with each piece of `0..pieces` this thread gets.
    pub(super) fn each(&self, pieces: usize, mut f: impl FnMut(usize)) {
        match self {
            Self::All => (0..pieces).for_each(f),
            Self::Claimed(c) => {
                while let Some(i) = c.next(pieces) {
                    f(i)
                }
            }
        }
    }
}
