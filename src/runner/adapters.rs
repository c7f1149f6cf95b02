//! Weight adapters (LoRA and its relatives): differences to declared weights, either merged
//! into them while they load or computed next to the weight's product in every graph.
//!
//! The runner knows no adapter file format: a [`WeightAdapters`] value (the `lora` module's)
//! is asked, once the model has declared its weights, which of them it patches and by how
//! much. A patch is a difference to the weight seen as PyTorch's [rows, cols] matrix: rows
//! are output features (ggml's outermost axis), cols the rest (a convolution's IC·KH·KW, in
//! that order) — the layout of the weight's bytes in its file.

use super::error::RunnerError;
use crate::tensor::Ne;

/// Where adapter differences are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterMode {
    /// Added into the weights while they load (quantized weights are dequantized, patched
    /// and quantized again).
    Merge,
    /// Kept beside the weights as low-rank factors (or full differences) whose product is
    /// added to the adapted layer's output in every graph; the weights stay as loaded.
    Runtime,
}

/// How a model uses a declared weight (what a run-time adapter can attach to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightRole {
    /// Read by other ops (norms, tables, biases): adapters are always merged into it.
    Plain,
    /// A `Linear` weight, [in, out] in ggml order.
    Linear,
    /// A `Conv2d` kernel; `kernel` is its (KW, KH).
    Conv { kernel: (usize, usize) },
}

/// A declared weight as the adapters see it.
#[derive(Clone, Debug)]
pub struct DeclaredWeight {
    /// The name the model declared it under (its source's name).
    pub name: String,
    /// Shape in the file, ggml order (a matrix-stored convolution's [KW, KH, IC, OC]).
    pub ne: Ne,
    pub role: WeightRole,
}

impl DeclaredWeight {
    /// PyTorch rows (output features) and cols of the weight.
    pub fn rows_cols(&self) -> (usize, usize) {
        let dims = self.ne.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1);
        let rows = self.ne[dims - 1];
        let total: usize = self.ne.iter().product();
        (rows, total / rows.max(1))
    }
}

/// One difference to a weight, covering output rows `row0 .. row0 + rows` (a part of a fused
/// weight such as a q/k/v projection) and every column.
#[derive(Clone, Debug)]
pub struct WeightPatch {
    pub row0: usize,
    pub rows: usize,
    pub delta: PatchDelta,
}

/// The values of a [`WeightPatch`], row-major.
#[derive(Clone, Debug)]
pub enum PatchDelta {
    /// `up @ down`: up [rows, rank] (every scale folded in), down [rank, cols].
    LowRank {
        up: Vec<f32>,
        down: Vec<f32>,
        rank: usize,
    },
    /// A full [rows, cols] difference.
    Full(Vec<f32>),
    /// DoRA: `up @ down` added, then each row rescaled to `magnitude[r]` (PEFT's
    /// `m · (W + ΔW) / ‖W + ΔW‖` per output row); needs the weight, so it is always merged.
    Dora {
        up: Vec<f32>,
        down: Vec<f32>,
        rank: usize,
        magnitude: Vec<f32>,
    },
}

impl PatchDelta {
    /// Whether the patch depends on the weight's values (and so cannot run beside it).
    pub fn needs_weight(&self) -> bool {
        matches!(self, PatchDelta::Dora { .. })
    }
}

/// A source of weight patches for one model component.
pub trait WeightAdapters {
    fn mode(&self) -> AdapterMode;
    /// Which of the declared weights it patches (indices into `weights`), checked against
    /// their shapes: an error for a difference that cannot apply. Reads no values.
    fn targets(&self, weights: &[DeclaredWeight]) -> Result<Vec<usize>, RunnerError>;
    /// The patches of `weights[index]` (one of the targets), read from the adapter files.
    fn patches(
        &self,
        weights: &[DeclaredWeight],
        index: usize,
    ) -> Result<Vec<WeightPatch>, RunnerError>;
}

/// Adds `patches` to a weight's values in its file layout ([rows, cols] row-major).
pub fn merge_patches(values: &mut [f32], cols: usize, patches: &[WeightPatch]) {
    for p in patches {
        let rows = values[p.row0 * cols..(p.row0 + p.rows) * cols].chunks_exact_mut(cols);
        match &p.delta {
            PatchDelta::Full(d) => {
                for (row, drow) in rows.zip(d.chunks_exact(cols)) {
                    row.iter_mut().zip(drow).for_each(|(w, d)| *w += d);
                }
            }
            PatchDelta::LowRank { up, down, rank } => {
                for (r, row) in rows.enumerate() {
                    add_low_rank(row, &up[r * rank..(r + 1) * rank], down, cols);
                }
            }
            PatchDelta::Dora {
                up,
                down,
                rank,
                magnitude,
            } => {
                for (r, row) in rows.enumerate() {
                    add_low_rank(row, &up[r * rank..(r + 1) * rank], down, cols);
                    let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
                    let s = if norm > 0.0 { magnitude[r] / norm } else { 0.0 };
                    row.iter_mut().for_each(|v| *v *= s);
                }
            }
        }
    }
}

/// `row += Σ_k up_row[k] · down[k]`: one axpy per rank, the weight row staying in cache.
fn add_low_rank(row: &mut [f32], up_row: &[f32], down: &[f32], cols: usize) {
    for (k, &a) in up_row.iter().enumerate() {
        if a != 0.0 {
            let drow = &down[k * cols..(k + 1) * cols];
            row.iter_mut().zip(drow).for_each(|(w, d)| *w += a * d);
        }
    }
}

/// What a run-time adapter adds beside a weight, as f32 tensors to allocate with the weights.
pub(crate) enum RuntimeFactors {
    /// Linear: down [cols, R], up [R, rows] (ggml order). Conv: down [KW, KH, IC, R],
    /// up [1, 1, R, OC].
    LowRank {
        down: (Ne, Vec<f32>),
        up: (Ne, Vec<f32>),
    },
    /// The summed difference with the weight's own shape ([in, out] or [KW, KH, IC, OC]).
    Full(Ne, Vec<f32>),
}

/// The patches of one weight as the tensors a run-time adapter needs: all low-rank parts
/// side by side in one pair of factors (zero rows outside each part), or, when any part is
/// a full difference, one summed full difference.
pub(crate) fn runtime_factors(w: &DeclaredWeight, patches: &[WeightPatch]) -> RuntimeFactors {
    let (rows, cols) = w.rows_cols();
    let full_ne = match w.role {
        WeightRole::Conv { kernel: (kw, kh) } => [kw, kh, cols / (kw * kh).max(1), rows],
        _ => [cols, rows, 1, 1],
    };
    if patches
        .iter()
        .any(|p| matches!(p.delta, PatchDelta::Full(_)))
    {
        let mut delta = vec![0.0; rows * cols];
        merge_patches(&mut delta, cols, patches);
        return RuntimeFactors::Full(full_ne, delta);
    }
    let total: usize = patches
        .iter()
        .map(|p| match &p.delta {
            PatchDelta::LowRank { rank, .. } => *rank,
            _ => 0,
        })
        .sum();
    let mut down = Vec::with_capacity(total * cols);
    let mut up = vec![0.0; rows * total];
    let mut at = 0;
    for p in patches {
        if let PatchDelta::LowRank {
            up: u,
            down: d,
            rank,
        } = &p.delta
        {
            down.extend_from_slice(d);
            for r in 0..p.rows {
                let dst = (p.row0 + r) * total + at;
                up[dst..dst + rank].copy_from_slice(&u[r * rank..(r + 1) * rank]);
            }
            at += rank;
        }
    }
    match w.role {
        WeightRole::Conv { kernel: (kw, kh) } => RuntimeFactors::LowRank {
            down: ([kw, kh, cols / (kw * kh).max(1), total], down),
            up: ([1, 1, total, rows], up),
        },
        _ => RuntimeFactors::LowRank {
            down: ([cols, total, 1, 1], down),
            up: ([total, rows, 1, 1], up),
        },
    }
}

/// A run-time adapter of one weight: indices of its factor tensors among the model's weights.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RuntimeAdapter {
    LowRank { down: usize, up: usize },
    Full { delta: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(rows: usize, cols: usize) -> DeclaredWeight {
        DeclaredWeight {
            name: "w".into(),
            ne: [cols, rows, 1, 1],
            role: WeightRole::Linear,
        }
    }

    #[test]
    fn merge_adds_the_product_on_its_rows() {
        // A 3×2 weight; a rank-1 patch on row 1 and a full patch on row 2.
        let mut w = vec![0.0; 6];
        let patches = [
            WeightPatch {
                row0: 1,
                rows: 1,
                delta: PatchDelta::LowRank {
                    up: vec![2.0],
                    down: vec![1.0, -1.0],
                    rank: 1,
                },
            },
            WeightPatch {
                row0: 2,
                rows: 1,
                delta: PatchDelta::Full(vec![0.5, 0.25]),
            },
        ];
        merge_patches(&mut w, 2, &patches);
        assert_eq!(w, vec![0.0, 0.0, 2.0, -2.0, 0.5, 0.25]);
    }

    #[test]
    fn runtime_factors_stack_parts_side_by_side() {
        let patches = [
            WeightPatch {
                row0: 0,
                rows: 2,
                delta: PatchDelta::LowRank {
                    up: vec![1.0, 2.0],
                    down: vec![1.0, 0.0, 0.0],
                    rank: 1,
                },
            },
            WeightPatch {
                row0: 2,
                rows: 2,
                delta: PatchDelta::LowRank {
                    up: vec![3.0, 4.0],
                    down: vec![0.0, 1.0, 0.0],
                    rank: 1,
                },
            },
        ];
        let w = linear(4, 3);
        let RuntimeFactors::LowRank { down, up } = runtime_factors(&w, &patches) else {
            panic!("low-rank parts stay low-rank");
        };
        assert_eq!(down.0, [3, 2, 1, 1]);
        assert_eq!(up.0, [2, 4, 1, 1]);
        // up @ down equals the merged difference.
        let mut merged = vec![0.0; 12];
        merge_patches(&mut merged, 3, &patches);
        for r in 0..4 {
            for c in 0..3 {
                let v: f32 = (0..2).map(|k| up.1[r * 2 + k] * down.1[k * 3 + c]).sum();
                assert_eq!(v, merged[r * 3 + c]);
            }
        }
    }
}
