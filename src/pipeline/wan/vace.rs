//! Wan VACE's control input, as upstream's `generate_video` and diffusers' `WanVACEPipeline`
//! build it (mask all ones: neither takes a VACE mask from the command line):
//!
//! - the control video: `--control-video`'s frames (a folder of images in file-name order, at
//!   most `--video-frames` of them), each centre-cropped to the output's aspect ratio and
//!   resized to the output size; frames past the last image are grey;
//! - its "inactive" part (the video outside the mask: all grey) and "reactive" part (inside:
//!   the video itself), each encoded by the VAE to its posterior mean and normalised with the
//!   latent statistics;
//! - the mask, pixel-unshuffled to `f²` channels per latent frame (f: the VAE's scale), all 1;
//! - with `--init-img`, a reference: the image resized to the output size, encoded as one
//!   frame, put in front as an extra latent frame (channels: its latent, zeros, a zero mask);
//!   the noise gets that frame too and the decoded video drops it.
//!
//! The context is `[inactive; reactive; mask]` along the channels: 2·16 + 64 = 96 for the Wan
//! 2.1 VAE, what `vace_patch_embedding` reads.

use super::condition::encode_normalised;
use crate::error::{Error, Result};
use crate::image_io::{crop_to_aspect, Image};
use crate::models::vae::wan_vae::LatentStats;
use crate::pipeline::vae::VaeStage;
use crate::tensor::HostTensor;

/// The control context of a batch, in the transformer's latent layout.
pub struct VaceCondition {
    /// [w, h, T', C_vace] channel-major (torch's (C, T', H, W)); T' counts the reference frame.
    pub context: HostTensor,
    /// Latent frames in front that hold the reference image (0 or 1).
    pub ref_frames: usize,
}

/// `img` centre-cropped to the aspect ratio of `width × height` (upstream's integer crop),
/// then resized to that size: [W, H, 3] in [0, 1].
fn fit_frame(vae: &VaeStage, img: &Image, width: usize, height: usize) -> HostTensor {
    vae.init_pixels(&crop_to_aspect(img, width, height), width, height)
}

/// The control video [W, H, F, 3] in [−1, 1]: the frames in order, grey after them.
fn control_video(
    vae: &VaeStage,
    frames_in: &[Image],
    width: usize,
    height: usize,
    frames: usize,
) -> HostTensor {
    let plane = width * height;
    let mut data = vec![0f32; plane * frames * 3];
    for (f, img) in frames_in.iter().take(frames).enumerate() {
        let px = fit_frame(vae, img, width, height);
        for c in 0..3 {
            let dst = &mut data[(c * frames + f) * plane..(c * frames + f + 1) * plane];
            for (d, s) in dst.iter_mut().zip(&px.data[c * plane..(c + 1) * plane]) {
                *d = s * 2.0 - 1.0;
            }
        }
    }
    HostTensor {
        ne: [width, height, frames, 3],
        data,
    }
}

/// Builds the control context for `frames` output frames (1 + 4k) of `width × height`;
/// `in_channels` is what the transformer's VACE patch embedding reads.
#[allow(clippy::too_many_arguments)]
pub fn vace_condition(
    vae: &VaeStage,
    stats: &LatentStats,
    control: &[Image],
    reference: Option<&Image>,
    width: usize,
    height: usize,
    frames: usize,
    in_channels: usize,
) -> Result<VaceCondition> {
    let f = vae.scale_factor();
    let z = stats.channels();
    let mask_channels = f * f;
    if in_channels != 2 * z + mask_channels {
        return Err(Error::Unsupported(format!(
            "the VACE transformer reads {in_channels} control channels; with this VAE ({z} \
             latent channels, {f}× spatial) the control is 2 × {z} + {mask_channels} = {}",
            2 * z + mask_channels
        )));
    }
    if control.len() > frames {
        log::debug!(
            "wan vace: {} control frames, the first {frames} used",
            control.len()
        );
    }
    let video = control_video(vae, control, width, height, frames);
    let grey = HostTensor {
        ne: video.ne,
        data: vec![0.0; video.data.len()],
    };
    let inactive = encode_normalised(vae, stats, &grey)?;
    let reactive = encode_normalised(vae, stats, &video)?;
    let reference = reference
        .map(|img| {
            let px = vae.init_pixels(img, width, height);
            let one = HostTensor {
                ne: [width, height, 1, 3],
                data: px.data.iter().map(|v| v * 2.0 - 1.0).collect(),
            };
            encode_normalised(vae, stats, &one)
        })
        .transpose()?;

    let [w, h, t, _] = inactive.ne;
    let plane = w * h;
    let r = usize::from(reference.is_some());
    let tt = t + r;
    let mut data = Vec::with_capacity(in_channels * tt * plane);
    // Channels 0..z: the reference latent, then the inactive latents.
    for ch in 0..z {
        if let Some(rz) = &reference {
            data.extend_from_slice(&rz.data[ch * plane..(ch + 1) * plane]);
        }
        data.extend_from_slice(&inactive.data[ch * t * plane..(ch + 1) * t * plane]);
    }
    // Channels z..2z: zeros beside the reference, then the reactive latents.
    for ch in 0..z {
        data.extend(std::iter::repeat_n(0.0, r * plane));
        data.extend_from_slice(&reactive.data[ch * t * plane..(ch + 1) * t * plane]);
    }
    // The mask: 0 on the reference frame, 1 on every video frame.
    for _ in 0..mask_channels {
        data.extend(std::iter::repeat_n(0.0, r * plane));
        data.extend(std::iter::repeat_n(1.0, t * plane));
    }
    Ok(VaceCondition {
        context: HostTensor {
            ne: [w, h, tt, in_channels],
            data,
        },
        ref_frames: r,
    })
}
