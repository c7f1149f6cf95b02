//! Autoencoders (latent <-> pixels).

pub mod autoencoder_kl;
