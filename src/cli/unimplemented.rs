//! Flags and modes that parse but are not implemented yet: one editable list each, and
//! functions that report which of them a run used (so `main` can warn or refuse).

use crate::app::{Mode, RunConfig};

/// Flags that parse but whose feature is not implemented yet. The lead edits this list;
/// [`unimplemented_flags`] reports the ones a run actually used.
pub const UNIMPLEMENTED_FLAGS: &[&str] = &[
    "--img-cfg-scale",
    "--timestep-shift",
    "--diffusion-conv-direct",
    "--vae-conv-direct",
    "--uncond-diffusion-model",
    "--embeddings-connectors",
    "--control-net",
    "--control-image",
    "--control-strength",
    "--canny",
    "--ip-adapter",
    "--ip-adapter-image",
    "--ip-adapter-strength",
    "--motion-module",
    "--photo-maker",
    "--pm-id-images-dir",
    "--pm-id-embed-path",
    "--pm-style-strength",
    "--pulid-weights",
    "--pulid-id-embedding",
    "--pulid-id-weight",
    "--ad-model",
    "--ad-prompt",
    "--ad-negative-prompt",
    "--extra-ad-args",
    "--tensor-type-rules",
    "--high-noise-img-cfg-scale",
    "--high-noise-guidance",
    "--high-noise-slg-scale",
    "--high-noise-skip-layers",
    "--high-noise-skip-layer-start",
    "--high-noise-skip-layer-end",
    "--high-noise-eta",
    "--cache-mode",
    "--cache-option",
    "--scm-mask",
    "--scm-policy",
    "--circular",
    "--circularx",
    "--circulary",
    "--qwen-image-layers",
    "--force-sdxl-vae-conv-scale",
    "--params-backend",
    "--split-mode",
    "--stream-layers",
    "--eager-load",
    "--auto-fit",
    "--imat-out",
    "--imat-in",
    "--convert-name",
    "--metadata-raw",
];

/// Modes that parse but are not implemented yet (edited by the lead).
pub const UNIMPLEMENTED_MODES: &[Mode] = &[Mode::Adetailer];

/// The flags from [`UNIMPLEMENTED_FLAGS`] that this run gave on the command line.
pub fn unimplemented_flags(cfg: &RunConfig) -> Vec<&'static str> {
    UNIMPLEMENTED_FLAGS
        .iter()
        .copied()
        .filter(|f| cfg.given_flags.contains(*f))
        .collect()
}

/// `Some(mode)` when the run's mode is listed in [`UNIMPLEMENTED_MODES`].
pub fn unimplemented_mode(cfg: &RunConfig) -> Option<Mode> {
    UNIMPLEMENTED_MODES.contains(&cfg.mode).then_some(cfg.mode)
}
