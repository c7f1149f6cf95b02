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
}
