//! The weight difference one adapter module makes, from its pieces (upstream `lora.hpp` and
//! LyCORIS define the formulas): LoRA `scale · up @ (mid ∘) down`, LoHa
//! `scale · (w1a @ w1b) ⊙ (w2a @ w2b)`, LoKr `scale · kron(w1, w2)`, and full differences.
//! Everything is PyTorch order: a weight is [rows, cols] with cols = IC·KH·KW for a kernel.

use std::collections::BTreeMap;

use super::keys::Part;
use crate::runner::adapters::PatchDelta;
use crate::runner::{StoreSource, WeightSource};
use crate::weights::TensorStore;

/// One module's pieces: part → tensor name in the LoRA's store.
pub type Pieces = BTreeMap<Part, String>;

/// A tensor of a LoRA file in f32 with its PyTorch shape.
struct Values {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Values {
    /// First PyTorch dimension (rows / rank) and the product of the others.
    fn split(&self) -> (usize, usize) {
        let first = self.shape.first().copied().unwrap_or(1).max(1);
        (first, self.data.len() / first)
    }
}

fn read(store: &TensorStore, name: &str) -> Result<Values, String> {
    let info = store
        .get(name)
        .ok_or_else(|| format!("tensor '{name}' is missing"))?;
    let src = StoreSource::new(store, "");
    let t = src
        .tensor(name)
        .ok_or_else(|| format!("tensor '{name}' cannot be read"))?;
    let data = (t.to_f32)(&t.bytes).map_err(|e| format!("tensor '{name}': {e}"))?;
    let shape = info.shape().iter().rev().copied().collect();
    Ok(Values { shape, data })
}

fn read_opt(store: &TensorStore, pieces: &Pieces, part: Part) -> Result<Option<Values>, String> {
    pieces.get(&part).map(|n| read(store, n)).transpose()
}

fn scalar(store: &TensorStore, pieces: &Pieces, part: Part) -> Result<Option<f32>, String> {
    Ok(read_opt(store, pieces, part)?.and_then(|v| v.data.first().copied()))
}

/// `a [m, k] @ b [k, n]`.
fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let row = &mut out[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            if x != 0.0 {
                row.iter_mut()
                    .zip(&b[p * n..(p + 1) * n])
                    .for_each(|(o, y)| *o += x * y);
            }
        }
    }
    out
}

/// The shape a difference must have: `rows` output rows of `cols` columns; `kernel` is
/// KH·KW of a convolution weight (1 for a matrix).
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub rows: usize,
    pub cols: usize,
    pub kernel: usize,
}

/// What kind of adapter the pieces make.
pub fn kind(pieces: &Pieces) -> &'static str {
    if pieces.contains_key(&Part::Down) || pieces.contains_key(&Part::Up) {
        "LoRA"
    } else if pieces.contains_key(&Part::HadaW1A) {
        "LoHa"
    } else if pieces.keys().any(|p| {
        matches!(
            p,
            Part::LokrW1 | Part::LokrW1A | Part::LokrW2 | Part::LokrW2A
        )
    }) {
        "LoKr"
    } else if pieces.contains_key(&Part::Diff) {
        "full difference"
    } else {
        "bias difference"
    }
}

/// Whether the module changes the weight (anything but a lone bias difference).
pub fn patches_weight(pieces: &Pieces) -> bool {
    pieces
        .keys()
        .any(|p| !matches!(p, Part::DiffBias | Part::Alpha | Part::Scale))
}

/// The module's difference to a weight of shape `t`, times `multiplier`.
pub fn weight_delta(
    store: &TensorStore,
    pieces: &Pieces,
    t: Target,
    multiplier: f32,
) -> Result<PatchDelta, String> {
    let size = |what: &str, got: usize, want: usize| {
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "{what} has {got} values where the model weight needs {want} ({}×{})",
                t.rows, t.cols
            ))
        }
    };
    if let (Some(down), Some(up)) = (pieces.get(&Part::Down), pieces.get(&Part::Up)) {
        let (down, up) = (read(store, down)?, read(store, up)?);
        let (rank, down_cols) = down.split();
        let (up_rows, up_rank) = up.split();
        size("lora_up rows", up_rows, t.rows)?;
        size("lora_up columns", up_rank, rank)?;
        let down = match read_opt(store, pieces, Part::Mid)? {
            // LoCon's Tucker form: down [R, IC] then the core [R, R, KH, KW] → down'[R, IC·KH·KW].
            Some(mid) => {
                let khw = mid.data.len() / (rank * rank).max(1);
                size("lora_mid", mid.data.len(), rank * rank * khw)?;
                size("lora_down columns × kernel", down_cols * khw, t.cols)?;
                let mut out = vec![0.0; rank * t.cols];
                for a in 0..rank {
                    for b in 0..rank {
                        let m = &mid.data[(a * rank + b) * khw..(a * rank + b + 1) * khw];
                        for i in 0..down_cols {
                            let d = down.data[b * down_cols + i];
                            let o =
                                &mut out[(a * down_cols + i) * khw..(a * down_cols + i + 1) * khw];
                            o.iter_mut().zip(m).for_each(|(o, m)| *o += d * m);
                        }
                    }
                }
                out
            }
            None => {
                size("lora_down columns", down_cols, t.cols)?;
                down.data
            }
        };
        let scale = match scalar(store, pieces, Part::Scale)? {
            Some(s) => s,
            None => scalar(store, pieces, Part::Alpha)?.map_or(1.0, |a| a / rank as f32),
        } * multiplier;
        let up = up.data.iter().map(|v| v * scale).collect();
        return match read_opt(store, pieces, Part::Magnitude)? {
            Some(m) => {
                // One magnitude per output row (PEFT; LyCORIS with wd_on_output).
                size("DoRA magnitude", m.data.len(), t.rows)?;
                Ok(PatchDelta::Dora {
                    up,
                    down,
                    rank,
                    magnitude: m.data,
                })
            }
            None => Ok(PatchDelta::LowRank { up, down, rank }),
        };
    }
    if let Some(diff) = read_opt(store, pieces, Part::Diff)? {
        size(".diff", diff.data.len(), t.rows * t.cols)?;
        return Ok(PatchDelta::Full(
            diff.data.iter().map(|v| v * multiplier).collect(),
        ));
    }
    if pieces.contains_key(&Part::HadaW1A) {
        return loha(store, pieces, t, multiplier);
    }
    lokr(store, pieces, t, multiplier)
}

/// The product of `a` [m, k] and `b` [k, …] as [m, numel(b)/k].
fn product(a: &Values, b: &Values) -> Result<(usize, Vec<f32>), String> {
    let (m, k) = a.split();
    let (k2, n) = b.split();
    if k != k2 {
        return Err(format!(
            "factors of shapes {:?} and {:?} do not multiply",
            a.shape, b.shape
        ));
    }
    Ok((m, matmul(&a.data, &b.data, m, k, n)))
}

fn loha(
    store: &TensorStore,
    pieces: &Pieces,
    t: Target,
    multiplier: f32,
) -> Result<PatchDelta, String> {
    if pieces.contains_key(&Part::HadaT1) || pieces.contains_key(&Part::HadaT2) {
        return Err("LoHa with Tucker cores (hada_t1/hada_t2) is not supported".into());
    }
    let get = |p: Part| -> Result<Values, String> {
        read_opt(store, pieces, p)?.ok_or_else(|| format!("LoHa piece {p:?} is missing"))
    };
    let (w1a, w1b, w2a, w2b) = (
        get(Part::HadaW1A)?,
        get(Part::HadaW1B)?,
        get(Part::HadaW2A)?,
        get(Part::HadaW2B)?,
    );
    let rank = w1b.split().0;
    let (_, d1) = product(&w1a, &w1b)?;
    let (_, d2) = product(&w2a, &w2b)?;
    if d1.len() != t.rows * t.cols || d2.len() != d1.len() {
        return Err(format!(
            "LoHa difference has {} values where the model weight needs {} ({}×{})",
            d1.len(),
            t.rows * t.cols,
            t.rows,
            t.cols
        ));
    }
    let scale = scalar(store, pieces, Part::Alpha)?.map_or(1.0, |a| a / rank as f32) * multiplier;
    Ok(PatchDelta::Full(
        d1.iter().zip(&d2).map(|(a, b)| a * b * scale).collect(),
    ))
}

fn lokr(
    store: &TensorStore,
    pieces: &Pieces,
    t: Target,
    multiplier: f32,
) -> Result<PatchDelta, String> {
    if pieces.contains_key(&Part::LokrT2) {
        return Err("LoKr with a Tucker core (lokr_t2) is not supported".into());
    }
    // Each factor whole, or as a product a @ b (whose rank sets the scale).
    let mut rank = 1;
    let mut factor = |whole: Part, a: Part, b: Part| -> Result<Values, String> {
        if let Some(w) = read_opt(store, pieces, whole)? {
            return Ok(w);
        }
        let (Some(a), Some(b)) = (read_opt(store, pieces, a)?, read_opt(store, pieces, b)?) else {
            return Err(format!(
                "LoKr piece {whole:?} (or its two factors) is missing"
            ));
        };
        rank = b.split().0;
        let (m, data) = product(&a, &b)?;
        let mut shape = vec![m];
        shape.extend(b.shape.iter().skip(1));
        Ok(Values { shape, data })
    };
    let w1 = factor(Part::LokrW1, Part::LokrW1A, Part::LokrW1B)?;
    let w2 = factor(Part::LokrW2, Part::LokrW2A, Part::LokrW2B)?;
    let (a0, a1) = w1.split();
    let b0 = w2.shape.first().copied().unwrap_or(1).max(1);
    let khw = t.kernel.max(1);
    let b1 = w2.data.len() / (b0 * khw).max(1);
    if a0 * b0 != t.rows || a1 * b1 * khw != t.cols || b0 * b1 * khw != w2.data.len() {
        return Err(format!(
            "LoKr factors {:?} ⊗ {:?} do not make the model weight's {}×{}",
            w1.shape, w2.shape, t.rows, t.cols
        ));
    }
    let scale = if rank == 1 {
        1.0
    } else {
        scalar(store, pieces, Part::Alpha)?.map_or(1.0, |a| a / rank as f32)
    } * multiplier;
    let mut out = vec![0.0; t.rows * t.cols];
    for i in 0..a0 {
        for j in 0..a1 {
            let s = w1.data[i * a1 + j] * scale;
            for k in 0..b0 {
                let row = i * b0 + k;
                for l in 0..b1 {
                    let src = &w2.data[(k * b1 + l) * khw..(k * b1 + l + 1) * khw];
                    let at = row * t.cols + (j * b1 + l) * khw;
                    out[at..at + khw]
                        .iter_mut()
                        .zip(src)
                        .for_each(|(o, v)| *o = s * v);
                }
            }
        }
    }
    Ok(PatchDelta::Full(out))
}

/// The module's bias difference (`.diff_b`) for a bias of `rows` values, if it has one.
pub fn bias_delta(
    store: &TensorStore,
    pieces: &Pieces,
    rows: usize,
    multiplier: f32,
) -> Result<Option<PatchDelta>, String> {
    let Some(diff) = read_opt(store, pieces, Part::DiffBias)? else {
        return Ok(None);
    };
    if diff.data.len() != rows {
        return Err(format!(
            ".diff_b has {} values for a bias of {rows}",
            diff.data.len()
        ));
    }
    Ok(Some(PatchDelta::Full(
        diff.data.iter().map(|v| v * multiplier).collect(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_small() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [1.0, 0.0, 0.0, 1.0];
        assert_eq!(matmul(&a, &b, 2, 2, 2), a.to_vec());
        assert_eq!(matmul(&[1.0, 1.0], &[2.0, 3.0], 1, 2, 1), vec![5.0]);
    }
}
