//! Host-side inputs of the multimodal (image-conditioned) Qwen3-VL language-model forward,
//! checked once so that the graph build cannot fail.

use crate::runner::RunnerError;
use crate::tensor::HostTensor;

use super::mrope::rope_positions;

const ORIGIN: &str = "the Qwen3-VL vision inputs";

/// One image's vision-tower outputs, as the language model consumes them.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionEmbeds {
    /// Merged vision embeddings, [hidden, grid_h·grid_w] (one row per image-pad token, row-major
    /// over the merged grid).
    pub embeds: HostTensor,
    /// Deepstack features, one [hidden, grid_h·grid_w] per level (added after decoder layer
    /// `level`); may be empty.
    pub deepstack: Vec<HostTensor>,
    /// Merged grid height (patch rows / spatial merge).
    pub grid_h: usize,
    /// Merged grid width.
    pub grid_w: usize,
}

fn bad(key: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: ORIGIN.into(),
        reason,
    }
}

/// Checked inputs of [`super::Qwen3TextModel::forward_multimodal`].
#[derive(Clone, Debug)]
pub struct Qwen3MmInput {
    ids: Vec<i32>,
    positions: [Vec<i32>; 3],
    /// For each token, the position of its image-pad rank among the pads, if it is one.
    pad_rank: Vec<Option<usize>>,
    vision: HostTensor,
    deepstack: Vec<HostTensor>,
}

impl Qwen3MmInput {
    /// `ids` [n]; `positions` (t, h, w) × n (see `rope_positions`); `vision`: one
    /// [hidden, n_pads_i] per image, placed in order at the `image_pad_id` tokens;
    /// `deepstack`: one [hidden, n_pads_total] per level.
    pub fn new(
        ids: Vec<i32>,
        image_pad_id: i32,
        positions: [Vec<i32>; 3],
        vision: &[HostTensor],
        deepstack: Vec<HostTensor>,
        hidden: usize,
    ) -> Result<Self, RunnerError> {
        let n = ids.len();
        if n == 0 {
            return Err(bad("input_ids", "no tokens".into()));
        }
        if positions.iter().any(|p| p.len() != n) {
            return Err(bad(
                "position_ids",
                format!("3-D positions do not cover the {n} tokens"),
            ));
        }
        let mut data = Vec::new();
        for (i, v) in vision.iter().enumerate() {
            if v.ne[0] != hidden || v.ne[2] != 1 || v.ne[3] != 1 {
                return Err(bad(
                    &format!("image {i} embeddings"),
                    format!("shape {:?} is not [{hidden}, tokens]", v.ne),
                ));
            }
            data.extend_from_slice(&v.data);
        }
        let n_vis = data.len() / hidden.max(1);
        let mut pad_rank = Vec::with_capacity(n);
        let mut k = 0;
        for &id in &ids {
            pad_rank.push((id == image_pad_id).then(|| {
                k += 1;
                k - 1
            }));
        }
        if k != n_vis {
            return Err(bad(
                "input_ids",
                format!("{k} image-pad tokens but {n_vis} vision embeddings"),
            ));
        }
        for (i, d) in deepstack.iter().enumerate() {
            if d.ne != [hidden, n_vis, 1, 1] {
                return Err(bad(
                    &format!("deepstack level {i}"),
                    format!("shape {:?} is not [{hidden}, {n_vis}]", d.ne),
                ));
            }
        }
        let vision = HostTensor::new([hidden, n_vis, 1, 1], data)
            .ok_or_else(|| bad("vision embeddings", "inconsistent size".into()))?;
        Ok(Self {
            ids,
            positions,
            pad_rank,
            vision,
            deepstack,
        })
    }

    /// Inputs for `ids` holding one image-pad run per entry of `images` (in order): positions
    /// from `rope_positions`, embeddings and deepstack levels concatenated over the images
    /// (every image must have the same number of levels).
    pub fn from_images(
        ids: Vec<i32>,
        image_pad_id: i32,
        images: &[VisionEmbeds],
        hidden: usize,
    ) -> Result<Self, RunnerError> {
        let grids: Vec<(usize, usize)> = images.iter().map(|v| (v.grid_h, v.grid_w)).collect();
        for (i, v) in images.iter().enumerate() {
            let count = v.grid_h * v.grid_w;
            if v.embeds.ne[1] != count {
                return Err(bad(
                    &format!("image {i} embeddings"),
                    format!(
                        "{} rows for a {}x{} merged grid",
                        v.embeds.ne[1], v.grid_h, v.grid_w
                    ),
                ));
            }
        }
        let levels = images.first().map_or(0, |v| v.deepstack.len());
        if images.iter().any(|v| v.deepstack.len() != levels) {
            return Err(bad(
                "deepstack",
                "images have different numbers of deepstack levels".into(),
            ));
        }
        let n_vis: usize = images.iter().map(|v| v.embeds.ne[1]).sum();
        let mut deepstack = Vec::with_capacity(levels);
        for level in 0..levels {
            let mut data = Vec::with_capacity(hidden * n_vis);
            for (i, v) in images.iter().enumerate() {
                let d = &v.deepstack[level];
                if d.ne != v.embeds.ne {
                    return Err(bad(
                        &format!("image {i} deepstack level {level}"),
                        format!("shape {:?}, embeddings are {:?}", d.ne, v.embeds.ne),
                    ));
                }
                data.extend_from_slice(&d.data);
            }
            deepstack.push(HostTensor::new([hidden, n_vis, 1, 1], data).ok_or_else(|| {
                bad(
                    "deepstack",
                    format!("level {level} is not [{hidden}, {n_vis}]"),
                )
            })?);
        }
        let positions = rope_positions(&ids, image_pad_id, &grids)?;
        let vision: Vec<HostTensor> = images.iter().map(|v| v.embeds.clone()).collect();
        Self::new(ids, image_pad_id, positions, &vision, deepstack, hidden)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn ids(&self) -> &[i32] {
        &self.ids
    }

    pub fn positions(&self) -> &[Vec<i32>; 3] {
        &self.positions
    }

    /// All images' vision embeddings, [hidden, n_pads].
    pub fn vision(&self) -> &HostTensor {
        &self.vision
    }

    /// Which tokens are image pads.
    pub fn image_pad_mask(&self) -> Vec<bool> {
        self.pad_rank.iter().map(Option::is_some).collect()
    }

    /// Row of each token in [token embeddings (n rows); vision embeddings]: itself for text,
    /// n + its pad rank for an image pad.
    pub(crate) fn gather_rows(&self) -> Vec<i32> {
        let n = self.ids.len();
        self.pad_rank
            .iter()
            .enumerate()
            .map(|(i, r)| r.map_or(i, |k| n + k) as i32)
            .collect()
    }

    /// Each deepstack level scattered to all n rows (zero at text rows), [hidden, n] data.
    pub(crate) fn deepstack_full(&self) -> Vec<Vec<f32>> {
        let hidden = self.vision.ne[0];
        self.deepstack
            .iter()
            .map(|d| {
                let mut full = vec![0.0; hidden * self.ids.len()];
                for (i, r) in self.pad_rank.iter().enumerate() {
                    if let Some(k) = r {
                        full[i * hidden..(i + 1) * hidden]
                            .copy_from_slice(&d.data[k * hidden..(k + 1) * hidden]);
                    }
                }
                full
            })
            .collect()
    }
}
