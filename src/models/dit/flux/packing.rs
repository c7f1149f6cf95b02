//! FLUX's token packing, on the host: a latent [W, H, C] becomes (H/2)(W/2) tokens (row-major)
//! of C·4 features ordered (channel, dy, dx), as diffusers' `_pack_latents`; positions are
//! (index, row, column) per token.

use crate::tensor::HostTensor;

/// Tokens [C·4, (H/2)(W/2)] of a latent [W, H, C] (W and H even).
pub fn pack(latent: &HostTensor) -> Vec<f32> {
    let [w, h, c, _] = latent.ne;
    let (pw, ph) = (w / 2, h / 2);
    let f = c * 4;
    let mut out = vec![0f32; f * pw * ph];
    for ch in 0..c {
        for y in 0..ph * 2 {
            for x in 0..pw * 2 {
                let token = (y / 2) * pw + x / 2;
                let feat = ch * 4 + (y % 2) * 2 + x % 2;
                out[token * f + feat] = latent.data[x + w * (y + h * ch)];
            }
        }
    }
    out
}

/// The latent [W, H, C] of tokens [C·4, (H/2)(W/2)] (the inverse of [`pack`]).
pub fn unpack(tokens: &[f32], w: usize, h: usize, c: usize) -> HostTensor {
    let (pw, f) = (w / 2, c * 4);
    let mut data = vec![0f32; w * h * c];
    for ch in 0..c {
        for y in 0..h {
            for x in 0..w {
                let token = (y / 2) * pw + x / 2;
                data[x + w * (y + h * ch)] = tokens[token * f + ch * 4 + (y % 2) * 2 + x % 2];
            }
        }
    }
    HostTensor {
        ne: [w, h, c, 1],
        data,
    }
}

/// Positions of a `w × h` latent's tokens with first coordinate `index` (0: the target,
/// 1: Kontext references), plus offsets of the rows and columns.
pub fn positions(w: usize, h: usize, index: f32, offset: (f32, f32)) -> Vec<[f32; 3]> {
    let mut out = Vec::with_capacity((w / 2) * (h / 2));
    for r in 0..h / 2 {
        for col in 0..w / 2 {
            out.push([index, r as f32 + offset.0, col as f32 + offset.1]);
        }
    }
    out
}

/// How reference images are numbered in the first rope axis (upstream's `RefIndexMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefIndex {
    /// Index 1 for all, each placed beside the previous (row or column offset, in latent
    /// pixels as upstream counts them).
    Fixed,
    /// 1, 2, ...
    Increase,
    /// 0, −1, ...
    Decrease,
}

/// Positions of Kontext reference latents of sizes `sizes` (w, h), in order.
pub fn ref_positions(sizes: &[(usize, usize)], mode: RefIndex) -> Vec<[f32; 3]> {
    let (mut curr_h, mut curr_w) = (0usize, 0usize);
    let mut index = 1i64;
    let mut out = Vec::new();
    for &(w, h) in sizes {
        let (mut h_off, mut w_off) = (0, 0);
        match mode {
            RefIndex::Fixed if h + curr_h > w + curr_w => w_off = curr_w,
            RefIndex::Fixed => h_off = curr_h,
            RefIndex::Decrease => index -= 1,
            RefIndex::Increase => {}
        }
        out.extend(positions(w, h, index as f32, (h_off as f32, w_off as f32)));
        if mode == RefIndex::Increase {
            index += 1;
        }
        curr_h = curr_h.max(h + h_off);
        curr_w = curr_w.max(w + w_off);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_then_unpack_is_identity_and_orders_features_channel_major() {
        let (w, h, c) = (4, 2, 3);
        let data: Vec<f32> = (0..w * h * c).map(|i| i as f32).collect();
        let latent = HostTensor::image(w, h, c, data).unwrap();
        let tokens = pack(&latent);
        // Token 1 (second patch of row 0), channel 2, (dy, dx) = (1, 0): pixel (2, 1).
        assert_eq!(tokens[12 + 2 * 4 + 2], latent.at(2, 1, 2));
        assert_eq!(unpack(&tokens, w, h, c), latent);
        assert_eq!(positions(4, 4, 1.0, (0.0, 0.0))[3], [1.0, 1.0, 1.0]);
    }

    #[test]
    fn fixed_references_sit_beside_each_other() {
        // Two 4x4 latents (2x2 tokens): the second goes below (h + 0 > w + 0 is false → row
        // offset 4, in latent pixels as upstream counts).
        let p = ref_positions(&[(4, 4), (4, 4)], RefIndex::Fixed);
        assert_eq!(p[0], [1.0, 0.0, 0.0]);
        assert_eq!(p[4], [1.0, 4.0, 0.0]);
        let inc = ref_positions(&[(2, 2), (2, 2)], RefIndex::Increase);
        assert_eq!((inc[0][0], inc[1][0]), (1.0, 2.0));
        let dec = ref_positions(&[(2, 2), (2, 2)], RefIndex::Decrease);
        assert_eq!((dec[0][0], dec[1][0]), (0.0, -1.0));
    }
}
