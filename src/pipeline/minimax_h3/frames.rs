//! MiniMax-H3's request rules (upstream's request resolution; diffusers agrees): 24 fps,
//! frame counts on the video VAE's 17k + 5 grid (its latent count is the VAE's geometry),
//! 40 audio latents per second.

/// The model's frame rate; another `--fps` is overridden.
pub const FPS: u32 = 24;
/// Audio latents per second of video (32 kHz / 800 samples per latent).
pub const AUDIO_LATENTS_PER_SECOND: f64 = 40.0;

/// `frames` rounded up to the next 17k + 5 (at least 5).
pub fn align_frames(frames: usize) -> usize {
    let mut f = frames.max(5);
    while f % 17 != 5 {
        f += 1;
    }
    f
}

/// Audio latents per channel for `frames` frames at [`FPS`].
pub fn audio_latents(frames: usize) -> usize {
    ((frames as f64 * AUDIO_LATENTS_PER_SECOND / f64::from(FPS)).round() as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_rules() {
        assert_eq!(align_frames(1), 5);
        assert_eq!(align_frames(22), 22);
        assert_eq!(align_frames(23), 39);
        assert_eq!(align_frames(56), 56);
        assert_eq!(audio_latents(56), 93);
        assert_eq!(audio_latents(5), 8);
        assert_eq!(audio_latents(22), 37);
    }
}
