//! The weight lines a thread packs next, brought into L2 a share at a time while it
//! multiplies the current block. Packing reads 64 (or more) weight rows `k` elements apart,
//! a gather the hardware prefetcher does not follow; every step reads the whole model from
//! memory, and PixArt XL's f32 step spent ~2 % of its time waiting in the packing loads
//! (`perf`) while the cores had the multiplication of the block before to overlap it with.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
use std::ops::Range;

/// Bytes per cache line.
const LINE: usize = 64;

/// `rows` weight rows of `span` bytes each, `row_bytes` apart, from `first`.
pub(super) struct WeightLines {
    first: *const u8,
    row_bytes: usize,
    rows: usize,
    /// Lines from each row's first: enough for its span wherever it starts in a line.
    lines_per_row: usize,
}

impl WeightLines {
    /// Nothing to fetch (the thread's next block is not known).
    pub(super) fn none() -> Self {
        Self {
            first: std::ptr::null(),
            row_bytes: 0,
            rows: 0,
            lines_per_row: 0,
        }
    }

    /// The lines holding `span` bytes from `start` in each of `rows` rows `row_bytes` apart.
    pub(super) fn new(start: *const u8, row_bytes: usize, rows: Range<usize>, span: usize) -> Self {
        Self {
            first: start.wrapping_add(rows.start * row_bytes),
            row_bytes,
            rows: rows.len(),
            lines_per_row: (LINE - 1 + span).div_ceil(LINE),
        }
    }

    /// Prefetches share `i` of `parts` equal shares of the lines (row by row).
    pub(super) fn part(&self, i: usize, parts: usize) {
        for at in self.share(i, parts) {
            // SAFETY: a prefetch is a hint: it never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.cast()) };
        }
    }

    /// The line starts of share `i` of `parts`.
    fn share(&self, i: usize, parts: usize) -> impl Iterator<Item = *const u8> + '_ {
        let total = self.rows * self.lines_per_row;
        let per = total.div_ceil(parts.max(1));
        ((i * per).min(total)..((i + 1) * per).min(total)).map(move |line| {
            let (row, col) = (line / self.lines_per_row, line % self.lines_per_row);
            let row_start = self.first.wrapping_add(row * self.row_bytes);
            let skew = row_start as usize % LINE;
            row_start.wrapping_add(col * LINE).wrapping_sub(skew)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_each_row_span() {
        let data = vec![0u8; 10_000];
        let base = data.as_ptr() as usize;
        // Rows start at different offsets within a line; spans cross lines.
        let (start, row_bytes, rows, span) = (5, 300, 2..9, 130);
        let at = data.as_ptr().wrapping_add(start);
        let lines = WeightLines::new(at, row_bytes, rows.clone(), span);
        let parts = 4;
        let seen: Vec<usize> = (0..parts + 1)
            .flat_map(|i| lines.share(i, parts).collect::<Vec<_>>())
            .map(|p| p as usize)
            .collect();
        assert!(seen.iter().all(|p| p % LINE == 0));
        for r in rows.clone() {
            let a = base + start + r * row_bytes;
            for byte in a..a + span {
                assert!(
                    seen.contains(&(byte / LINE * LINE)),
                    "row {r}: {byte} not fetched"
                );
            }
        }
        // At most one line per row beyond what its span touches.
        let touched: usize = rows
            .map(|r| {
                let a = base + start + r * row_bytes;
                (a + span).div_ceil(LINE) - a / LINE
            })
            .sum();
        assert!(
            seen.len() <= touched + 7,
            "{} lines for {touched}",
            seen.len()
        );
        assert_eq!(WeightLines::none().share(0, 3).count(), 0);
    }
}
