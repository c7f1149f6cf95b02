//! Qwen2.5-VL's window attention, as a mask over tokens in the processor's order.
//!
//! transformers groups the merged units (merge×merge patches) into windows of
//! `window_units`×`window_units` units, tiling the unit grid from the top left (the last row and
//! column of windows may be partial), reorders the tokens window by window, attends within each
//! window and restores the order after the merger. Attention is indifferent to token order when
//! the rope angles travel with the tokens, so the same result comes from keeping the order and
//! masking keys outside the query's window: no gathers, and the output order is already right.

/// The window of every token of a `grid_h`×`grid_w` patch grid in merge-window order (the
/// processor's order), windows numbered row-major. Grid sides must be multiples of `merge`.
pub fn window_ids(grid_h: usize, grid_w: usize, merge: usize, window_units: usize) -> Vec<usize> {
    // `Qwen25VlVisionConfig::detect` rejects empty windows; a hand-made config must not divide
    // by zero here either.
    let window_units = window_units.max(1);
    let merge = merge.max(1);
    let (units_h, units_w) = (grid_h / merge, grid_w / merge);
    let windows_w = units_w.div_ceil(window_units);
    let per_unit = merge * merge;
    let mut ids = Vec::with_capacity(units_h * units_w * per_unit);
    for ur in 0..units_h {
        for uc in 0..units_w {
            let w = (ur / window_units) * windows_w + uc / window_units;
            ids.extend(std::iter::repeat_n(w, per_unit));
        }
    }
    ids
}

/// The additive mask [n_kv, n_q] (ggml order: keys fastest) letting each token see only its own
/// window, or `None` when all tokens share one window.
pub fn window_mask(ids: &[usize]) -> Option<Vec<f32>> {
    let first = *ids.first()?;
    if ids.iter().all(|&w| w == first) {
        return None;
    }
    let mut mask = Vec::with_capacity(ids.len() * ids.len());
    for &q in ids {
        mask.extend(
            ids.iter()
                .map(|&k| if k == q { 0.0 } else { f32::NEG_INFINITY }),
        );
    }
    Some(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens per window in window order, as transformers' `cu_window_seqlens` differences.
    fn window_lengths(ids: &[usize]) -> Vec<usize> {
        let n = ids.iter().max().map_or(0, |m| m + 1);
        (0..n)
            .map(|w| ids.iter().filter(|&&i| i == w).count())
            .collect()
    }

    #[test]
    fn partial_windows_at_the_edges() {
        // 10×6 patches → 5×3 units → windows of 2×2 units: 3 rows × 2 columns.
        let ids = window_ids(10, 6, 2, 2);
        assert_eq!(ids.len(), 60);
        assert_eq!(window_lengths(&ids), [16, 8, 16, 8, 8, 4]);
        // The first unit row: units 0, 1 in window 0, unit 2 in window 1.
        assert_eq!(&ids[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn released_window_of_four_units() {
        // 112 px windows at patch 14, merge 2: 4×4 units; a 20×36 grid is 10×18 units.
        let ids = window_ids(20, 36, 2, 4);
        assert_eq!(
            window_lengths(&ids),
            [64, 64, 64, 64, 32, 64, 64, 64, 64, 32, 32, 32, 32, 32, 16]
        );
    }

    #[test]
    fn mask_blocks_other_windows() {
        let ids = [0, 0, 1];
        let m = window_mask(&ids).unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(m, [0.0, 0.0, inf, 0.0, 0.0, inf, inf, inf, 0.0]);
        assert!(window_mask(&[3, 3, 3]).is_none());
        assert!(window_mask(&[]).is_none());
    }
}
