//! Shared building blocks used by every model family.
//!
//! Each block is plain data (weight [`Param`](crate::runner::Param)s and sizes) built from a
//! [`WeightBuilder`](crate::runner::WeightBuilder), with a pure `forward` over a
//! [`GraphCtx`](crate::runner::GraphCtx). Shapes are in ggml order: activations are
//! `[channels, tokens, batch]` for sequences and `[W, H, C, N]` for images.

mod activation;
mod attention;
mod conv;
mod conv1d;
mod embed;
mod linear;
mod norm;
mod rope;

pub use activation::{geglu, gelu_tanh, quick_gelu};
pub use attention::{attention, AttentionMask};
pub use conv::Conv2d;
pub use conv1d::{Conv1d, ConvTranspose1d};
pub use embed::{sincos_2d_pos_embed, timestep_embedding, TimestepEmbedding};
pub use linear::Linear;
pub use norm::{GroupNorm, LayerNorm, RmsNorm};
pub use rope::{apply_rope, rope_table, RopeLayout};
