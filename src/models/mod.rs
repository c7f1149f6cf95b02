//! Model families, one module per architecture: config detected from weights, weights
//! declared through a `WeightBuilder`, and a pure `forward` over a `GraphCtx`.

pub mod dit;
pub mod te;
pub mod unet;
pub mod upscaler;
pub mod vae;
