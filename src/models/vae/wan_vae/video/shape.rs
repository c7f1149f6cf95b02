//! Host-side shape checks of a whole clip before its chunk loop, shared by the Wan 2.1 and 2.2
//! VAEs: a wrong shape would otherwise surface as an out-of-bounds frame copy mid-clip.

use crate::runner::RunnerError;
use crate::tensor::HostTensor;

fn bad(key: &str, origin: &str, clip: &HostTensor, expected: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: origin.into(),
        reason: format!(
            "shape {:?} with {} values; expected {expected} (ggml order)",
            clip.ne,
            clip.data.len()
        ),
    }
}

/// Checks a latent clip z [w, h, T, z_dim] (no empty axis); `origin` names the VAE in the error.
pub(crate) fn check_latent(z: &HostTensor, z_dim: usize, origin: &str) -> Result<(), RunnerError> {
    let [w, h, t, c] = z.ne;
    if c != z_dim || w == 0 || h == 0 || t == 0 || z.data.len() != w * h * t * c {
        return Err(bad("latent", origin, z, format!("[w, h, T, {z_dim}]")));
    }
    Ok(())
}

/// Checks a pixel clip x [W, H, F, channels]; sizes and frame counts are the caller's to check.
pub(crate) fn check_frames(
    x: &HostTensor,
    channels: usize,
    origin: &str,
) -> Result<(), RunnerError> {
    let [w, h, frames, c] = x.ne;
    if c != channels || x.data.len() != w * h * frames * c {
        return Err(bad("frames", origin, x, format!("[W, H, F, {channels}]")));
    }
    Ok(())
}
