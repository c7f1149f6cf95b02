//! Qwen3-VL's 3-D rope positions (transformers `Qwen3VLModel.get_rope_index`) and the section
//! layout of its interleaved mRoPE.
//!
//! Text tokens advance one position on all three axes (t, h, w). An image's `h × w` merged
//! vision tokens (row-major) all start at the current position `p`: token (r, c) sits at
//! (p, p + r, p + c); the text after the image resumes at `p + max(h, w)`.
//!
//! Interleaved mRoPE: frequency `j` of a head (0 ≤ j < head_dim/2) takes the h position when
//! `j % 3 == 1 && j < 3·sec[1]`, the w position when `j % 3 == 2 && j < 3·sec[2]`, else the t
//! position; rotation pairs are NeoX halves. ggml's `GGML_ROPE_TYPE_IMROPE` computes the same
//! given [`ggml_imrope_sections`] and a 4th position axis equal to t.

use crate::runner::RunnerError;

/// transformers' default `mrope_section` for Qwen3-VL (head_dim 128).
pub const DEFAULT_MROPE_SECTION: [usize; 3] = [24, 20, 20];

fn bad(reason: String) -> RunnerError {
    RunnerError::BadData {
        key: "input_ids".into(),
        origin: "the Qwen3-VL multimodal token sequence".into(),
        reason,
    }
}

/// 3-D positions (t, h, w) of `ids`, where each run of `image_pad_id` tokens is the next image
/// of `grids` (merged (h, w) per image, in order) and must hold exactly h·w tokens.
pub fn rope_positions(
    ids: &[i32],
    image_pad_id: i32,
    grids: &[(usize, usize)],
) -> Result<[Vec<i32>; 3], RunnerError> {
    let n = ids.len();
    let mut pos: [Vec<i32>; 3] = std::array::from_fn(|_| Vec::with_capacity(n));
    let mut next_grid = grids.iter();
    let mut p: i64 = 0;
    let mut i = 0;
    let to_i32 = |v: i64| i32::try_from(v).map_err(|_| bad(format!("position {v} overflows")));
    while i < n {
        if ids[i] != image_pad_id {
            for axis in &mut pos {
                axis.push(to_i32(p)?);
            }
            p += 1;
            i += 1;
            continue;
        }
        let &(h, w) = next_grid
            .next()
            .ok_or_else(|| bad(format!("more image runs than the {} images", grids.len())))?;
        let count = h * w;
        let run = ids[i..].iter().take_while(|&&t| t == image_pad_id).count();
        if count == 0 || run != count {
            return Err(bad(format!(
                "image run at token {i} has {run} image tokens, its {h}x{w} grid needs {count}"
            )));
        }
        for r in 0..h as i64 {
            for c in 0..w as i64 {
                pos[0].push(to_i32(p)?);
                pos[1].push(to_i32(p + r)?);
                pos[2].push(to_i32(p + c)?);
            }
        }
        p += h.max(w) as i64;
        i += count;
    }
    if next_grid.next().is_some() {
        return Err(bad(format!(
            "{} images given but fewer image runs in the tokens",
            grids.len()
        )));
    }
    Ok(pos)
}

/// The 4 section sizes to hand ggml's interleaved mRoPE so that it reproduces transformers'
/// frequency-to-axis map for `mrope_section` at `head_dim`: the sections must cover exactly
/// head_dim/2 frequencies (ggml takes them modulo the sum) and every frequency not on h or w
/// reads the t position (ggml's leftover "e" axis is fed the t positions too).
pub fn ggml_imrope_sections(mrope_section: [usize; 3], head_dim: usize) -> [usize; 4] {
    let half = head_dim / 2;
    let h = mrope_section[1].min(half);
    let w = mrope_section[2].min(half);
    [half.saturating_sub(h + w), h, w, 0]
}

/// The 4-axis position buffer ggml's multi-rope reads (axis-major: t, h, w, then t again).
pub fn ggml_imrope_positions(pos: &[Vec<i32>; 3]) -> Vec<i32> {
    pos.iter()
        .chain(std::iter::once(&pos[0]))
        .flatten()
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_image_text() {
        let ids = [1, 2, 9, 9, 9, 9, 9, 9, 3, 9, 9, 4];
        let p = rope_positions(&ids, 9, &[(2, 3), (2, 1)]).unwrap();
        assert_eq!(p[0], [0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 6, 8]);
        assert_eq!(p[1], [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8]);
        assert_eq!(p[2], [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 6, 8]);
        assert!(rope_positions(&ids, 9, &[(2, 3)]).is_err());
        assert!(rope_positions(&ids, 9, &[(2, 2), (2, 1)]).is_err());
        assert!(rope_positions(&ids, 9, &[(2, 3), (2, 1), (1, 1)]).is_err());
    }

    #[test]
    fn sections_cover_half_head() {
        assert_eq!(ggml_imrope_sections([24, 20, 20], 128), [24, 20, 20, 0]);
        assert_eq!(ggml_imrope_sections([4, 2, 2], 16), [4, 2, 2, 0]);
        assert_eq!(ggml_imrope_sections([16, 24, 24], 64), [0, 24, 24, 0]);
        assert_eq!(ggml_imrope_sections([1, 1, 1], 16), [6, 1, 1, 0]);
    }
}
