//! Autoencoders (latent <-> pixels).

pub mod autoencoder_kl;
pub mod tiling;
