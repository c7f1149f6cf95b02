//! Diffusion transformers.

mod adaln;
pub mod flux;
pub mod minimax_h3;
pub mod pixart;
pub mod qwen_image;
pub mod qwen_image_2_1;
pub mod sd3;
pub mod wan;
pub mod z_image;

/// Rope axes (index/frame, height, width) for a head size: FLUX's and Qwen Image's released
/// [16, 56, 56] split of 128 scaled to other heads — height and width each the largest even
/// ≤ 7/16 of the head, the first axis the rest.
pub fn default_axes_dims(head_dim: usize) -> [usize; 3] {
    let hw = (7 * head_dim / 16) & !1;
    [head_dim - 2 * hw, hw, hw]
}
