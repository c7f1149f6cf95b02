//! The joint sequence's prefix: text rows and condition-image blocks in encoder order.
//!
//! The text encoder reserves one `<|image_pad|>` slot per 2×2 group of a condition image's
//! latent tokens. In the transformer every slot becomes four tokens holding that image's
//! latent raster, so the prefix reads: text rows (pads dropped), then image 1's block where
//! its pads were, more text, image 2's block, …; the target image follows the whole prefix.
//!
//! Positions (diffusers `QwenImage21RopeEmbedder`): a running counter advances by one per text
//! token (all three axes equal) and by `max(h, w)` per image block; an image block sits at
//! frame = counter, with height/width centred on zero (`-(n - n/2) .. n/2`). Attention is
//! block-causal: a query sees every earlier key and its own image block.

use std::ops::Range;

use super::prefix::PrefixCacheError;

/// Latent tokens each encoder image slot stands for (a 2×2 group).
pub const TOKENS_PER_SLOT: usize = 4;

/// One run of the prefix.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    /// Text encoder rows `rows` (after the system rows were dropped).
    Text { rows: Range<usize> },
    /// Condition image `index`: an `h × w` latent raster.
    Image { index: usize, h: usize, w: usize },
}

/// The prefix's segments in sequence order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PrefixLayout {
    segments: Vec<Segment>,
    text_rows: usize,
}

impl PrefixLayout {
    /// Text only: rows 0..len.
    pub fn text_only(len: usize) -> Self {
        Self {
            segments: vec![Segment::Text { rows: 0..len }],
            text_rows: len,
        }
    }

    /// The layout of an encoder output whose rows flagged in `pad_mask` are image slots,
    /// for condition images of latent sizes `images` = [(h, w), …] in order. Each image's
    /// run of slots must cover exactly its `h·w / 4` tokens.
    pub fn from_pad_mask(
        pad_mask: &[bool],
        images: &[(usize, usize)],
    ) -> Result<Self, PrefixCacheError> {
        let slots = pad_mask.iter().filter(|&&p| p).count();
        let wanted: usize = images.iter().map(|(h, w)| h * w).sum();
        if slots * TOKENS_PER_SLOT != wanted || images.iter().any(|(h, w)| h * w % 4 != 0) {
            return Err(PrefixCacheError::Inputs(format!(
                "the text encoder reserved {slots} image slots ({} latent tokens) but the \
                 reference latents {images:?} hold {wanted}; the reference images must be \
                 encoded at the size the vision encoder saw",
                slots * TOKENS_PER_SLOT
            )));
        }
        let mut segments = Vec::new();
        let mut row = 0;
        let mut text_start = 0;
        for (index, &(h, w)) in images.iter().enumerate() {
            while row < pad_mask.len() && !pad_mask[row] {
                row += 1;
            }
            let need = h * w / TOKENS_PER_SLOT;
            let run = pad_mask[row..].iter().take_while(|&&p| p).count();
            if run < need {
                return Err(PrefixCacheError::Inputs(format!(
                    "reference image {} needs {need} consecutive image slots in the prompt \
                     encoding but finds {run}",
                    index + 1
                )));
            }
            if row > text_start {
                segments.push(Segment::Text {
                    rows: text_start..row,
                });
            }
            segments.push(Segment::Image { index, h, w });
            row += need;
            text_start = row;
        }
        if pad_mask.len() > text_start {
            segments.push(Segment::Text {
                rows: text_start..pad_mask.len(),
            });
        }
        Ok(Self {
            segments,
            text_rows: pad_mask.len(),
        })
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Rows of the text encoder output this layout reads from (pads included).
    pub fn text_rows(&self) -> usize {
        self.text_rows
    }

    /// Number of condition images.
    pub fn images(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| matches!(s, Segment::Image { .. }))
            .count()
    }

    /// Tokens in the prefix.
    pub fn len(&self) -> usize {
        self.segments.iter().map(segment_len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rope positions (frame, height, width) of every prefix token, and the frame position
    /// of the target image that follows.
    pub fn positions(&self) -> (Vec<Vec<f32>>, usize) {
        let mut pos = Vec::with_capacity(self.len());
        let mut counter = 0usize;
        for s in &self.segments {
            match *s {
                Segment::Text { ref rows } => {
                    for _ in rows.clone() {
                        pos.push(vec![counter as f32; 3]);
                        counter += 1;
                    }
                }
                Segment::Image { h, w, .. } => {
                    pos.extend(image_positions(counter, h, w));
                    counter += h.max(w);
                }
            }
        }
        (pos, counter)
    }

    /// Additive block-causal mask over the prefix, [keys, queries] (ggml order: key index
    /// fastest): a query sees earlier keys and its whole image block.
    pub fn mask(&self) -> Vec<f32> {
        let n = self.len();
        // Block id per token (None for text); a key is visible when key ≤ query or when both
        // are in the same image block.
        let mut block = Vec::with_capacity(n);
        for (i, s) in self.segments.iter().enumerate() {
            let id = matches!(s, Segment::Image { .. }).then_some(i);
            block.extend(std::iter::repeat_n(id, segment_len(s)));
        }
        let mut mask = Vec::with_capacity(n * n);
        for q in 0..n {
            for k in 0..n {
                let visible = k <= q || (block[q].is_some() && block[q] == block[k]);
                mask.push(if visible { 0.0 } else { f32::NEG_INFINITY });
            }
        }
        mask
    }
}

fn segment_len(s: &Segment) -> usize {
    match s {
        Segment::Text { rows } => rows.len(),
        Segment::Image { h, w, .. } => h * w,
    }
}

/// Positions of an h×w latent raster at frame `frame`: height/width centred, negative first.
pub fn image_positions(frame: usize, h: usize, w: usize) -> Vec<Vec<f32>> {
    let (h0, w0) = ((h - h / 2) as f32, (w - w / 2) as f32);
    let mut pos = Vec::with_capacity(h * w);
    for y in 0..h {
        for x in 0..w {
            pos.push(vec![frame as f32, y as f32 - h0, x as f32 - w0]);
        }
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_only_is_causal_and_sequential() {
        let l = PrefixLayout::text_only(3);
        let (pos, next) = l.positions();
        assert_eq!(pos, vec![vec![0.0; 3], vec![1.0; 3], vec![2.0; 3]]);
        assert_eq!(next, 3);
        let m = l.mask();
        assert_eq!(m[1], f32::NEG_INFINITY); // query 0 cannot see key 1
        assert_eq!(m[3], 0.0); // query 1 sees key 0
    }

    #[test]
    fn image_block_is_bidirectional_and_advances_by_max_side() {
        // text, 2 slots (2x4 latent), text
        let pads = [false, false, true, true, false];
        let l = PrefixLayout::from_pad_mask(&pads, &[(2, 4)]).unwrap();
        assert_eq!(
            l.segments(),
            &[
                Segment::Text { rows: 0..2 },
                Segment::Image {
                    index: 0,
                    h: 2,
                    w: 4
                },
                Segment::Text { rows: 4..5 },
            ]
        );
        assert_eq!(l.len(), 2 + 8 + 1);
        let (pos, next) = l.positions();
        assert_eq!(pos[2], vec![2.0, -1.0, -2.0]);
        assert_eq!(pos[10], vec![6.0; 3]);
        assert_eq!(next, 7);
        let m = l.mask();
        let n = l.len();
        assert_eq!(m[2 * n + 9], 0.0); // first image token sees the last image token
        assert_eq!(m[2 * n + 10], f32::NEG_INFINITY); // but not the text after it
    }

    #[test]
    fn slot_count_mismatch_is_an_error() {
        let pads = [false, true, true, false];
        assert!(PrefixLayout::from_pad_mask(&pads, &[(4, 4)]).is_err());
        // Adjacent images may share one run of slots…
        assert!(PrefixLayout::from_pad_mask(&pads, &[(2, 2), (2, 2)]).is_ok());
        // …but an image's tokens must not straddle text.
        let split = [false, true, false, true, true, false];
        assert!(PrefixLayout::from_pad_mask(&split, &[(2, 4), (2, 2)]).is_err());
    }
}
