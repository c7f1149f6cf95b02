//! Autoencoders (latent <-> pixels).

pub mod autoencoder_kl;
pub mod qwen_image_2_1_vae;
pub mod tiling;
