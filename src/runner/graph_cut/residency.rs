//! Which offloaded weights have a device copy right now.
//!
//! Offloaded weights live in host memory; a run copies the weights a segment reads to the
//! device in one batch (a replica) before the segment runs. Replicas stay resident across
//! segments and calls while memory allows, so a model that fits is uploaded once. Under
//! pressure, replicas are evicted from the last segment backward: the early segments then
//! stay resident for good and the later ones stream through the remaining room, instead of
//! every segment missing in turn as it would under least-recently-used eviction of a cyclic
//! access pattern.

use std::collections::HashMap;

use super::super::weights::ModelWeights;
use crate::ggml::{Backend, GgmlError, ReplicaId};

struct Batch {
    id: ReplicaId,
    /// The segment that loaded it (eviction order).
    owner: usize,
    params: Vec<usize>,
    bytes: usize,
    /// Uploaded on the copy stream and not yet waited for.
    in_flight: bool,
}

#[derive(Default)]
pub(crate) struct Residency {
    batches: Vec<Batch>,
    /// Parameter → position in `batches`' ids.
    home: HashMap<usize, ReplicaId>,
}

impl Residency {
    pub fn bytes(&self) -> usize {
        self.batches.iter().map(|b| b.bytes).sum()
    }

    /// The parameters of `params` without a device copy.
    pub fn missing(&self, params: &[usize]) -> Vec<usize> {
        params
            .iter()
            .copied()
            .filter(|p| !self.home.contains_key(p))
            .collect()
    }

    /// Frees replicas holding none of `keep`, from the highest owning segment down, until
    /// `need` bytes are freed or nothing more can go. Returns the bytes freed.
    pub fn evict(&mut self, weights: &ModelWeights, keep: &[usize], need: usize) -> usize {
        let mut order: Vec<usize> = (0..self.batches.len())
            .filter(|&i| !self.batches[i].params.iter().any(|p| keep.contains(p)))
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.batches[i].owner));
        let mut freed = 0;
        let mut gone = Vec::new();
        for i in order {
            if freed >= need {
                break;
            }
            freed += weights.arena().release(self.batches[i].id);
            gone.push(self.batches[i].id);
        }
        self.forget(&gone);
        freed
    }

    fn forget(&mut self, ids: &[ReplicaId]) {
        self.batches.retain(|b| !ids.contains(&b.id));
        self.home.retain(|_, id| !ids.contains(id));
    }

    /// Copies `params` to `backend` as one replica owned by segment `owner` (asynchronously
    /// on `stream` when given). Returns the device bytes it takes.
    pub fn load(
        &mut self,
        weights: &ModelWeights,
        backend: &Backend,
        params: &[usize],
        owner: usize,
        stream: Option<&Backend>,
    ) -> Result<usize, GgmlError> {
        if params.is_empty() {
            return Ok(0);
        }
        let id = weights.arena().replicate(backend, params, stream)?;
        let bytes = weights.arena().replica_bytes(id);
        for &p in params {
            self.home.insert(p, id);
        }
        self.batches.push(Batch {
            id,
            owner,
            params: params.to_vec(),
            bytes,
            in_flight: stream.is_some(),
        });
        Ok(bytes)
    }

    /// Whether some replica's upload may still be running on the copy stream.
    pub fn in_flight(&self) -> bool {
        self.batches.iter().any(|b| b.in_flight)
    }

    /// Marks every upload as complete (after the copy stream was synchronized).
    pub fn landed(&mut self) {
        for b in &mut self.batches {
            b.in_flight = false;
        }
    }

    /// Frees every replica.
    pub fn clear(&mut self, weights: &ModelWeights) {
        for b in self.batches.drain(..) {
            weights.arena().release(b.id);
        }
        self.home.clear();
    }
}
