//! One chunk of a video through the encoder or decoder stack: the image path's blocks with
//! every 3×3×3 conv causal over frames and the temporal resamplers switched on.
//!
//! Each causal conv keeps its history under its own cache key, named after the block it sits in
//! (`wan_vae.video.decoder.up.1.2.conv1`, …), so a chunk's graph reads the previous chunk's
//! frames and leaves its own for the next. Cut marks sit where the image path puts them.

use crate::ggml::{ScaleMode, Tensor};
use crate::models::vae::qwen_image_2_1_vae::blocks::{MidBlock, ResidualBlock};
use crate::runner::GraphCtx;

use super::super::coder::{Decoder, Encoder};
use super::causal::{causal, double_frames, halve_frames};

/// Prefix of every cache entry the video paths make (cleared around each video).
pub(super) const CACHE_PREFIX: &str = "wan_vae.video.";

fn key(part: &str, name: &str) -> String {
    format!("{CACHE_PREFIX}{part}.{name}")
}

/// A resnet with causal convs: the image path's [`ResidualBlock::forward`] over frames.
pub(crate) fn resnet<'g>(
    g: &'g GraphCtx<'g>,
    r: &ResidualBlock,
    x: Tensor<'g>,
    key: &str,
) -> Tensor<'g> {
    let h = causal(
        g,
        &r.conv1,
        g.silu(r.norm1.forward(g, x)),
        &format!("{key}.conv1"),
    );
    let h = causal(
        g,
        &r.conv2,
        g.silu(r.norm2.forward(g, h)),
        &format!("{key}.conv2"),
    );
    let skip = match &r.shortcut {
        // 1×1×1 kernels: per frame.
        Some(conv) => conv.forward(g, x),
        None => x,
    };
    g.add(h, skip)
}

/// resnet → attention (per frame) → resnet.
pub(crate) fn mid<'g>(g: &'g GraphCtx<'g>, m: &MidBlock, x: Tensor<'g>, key: &str) -> Tensor<'g> {
    let x = resnet(g, &m.resnet_1, x, &format!("{key}.0"));
    let x = m.attention.forward(g, x);
    resnet(g, &m.resnet_2, x, &format!("{key}.1"))
}

/// Frames [W, H, C_in, T] → moments [W/f, H/f, 2·z, T / temporal factor] (the first chunk:
/// one frame in, one out).
pub(super) fn encode<'g>(g: &'g GraphCtx<'g>, enc: &Encoder, x: Tensor<'g>) -> Tensor<'g> {
    let k = |name: &str| key("encoder", name);
    let mut x = causal(g, &enc.conv_in, x, &k("conv_in"));
    for (i, level) in enc.levels.iter().enumerate() {
        for (j, r) in level.resnets.iter().enumerate() {
            x = resnet(g, r, x, &k(&format!("down.{i}.{j}")));
        }
        if let Some(conv) = &level.resample {
            // ZeroPad2d((0, 1, 0, 1)), the stride-2 conv per frame, then time.
            x = conv.forward(g, g.pad(x, [(0, 1), (0, 1), (0, 0), (0, 0)]));
            if let Some(time) = &level.time_conv {
                x = halve_frames(g, time, x, &k(&format!("down.{i}.time_conv")));
            }
        }
        x = g.cut(&format!("wan_vae.encoder.down.{i}"), "x", x);
    }
    x = mid(g, &enc.mid, x, &k("mid"));
    x = g.cut("wan_vae.encoder.mid", "x", x);
    let x = g.silu(enc.norm_out.forward(g, x));
    causal(g, &enc.conv_out, x, &k("conv_out"))
}

/// One latent frame [w, h, z, 1] (after `post_quant_conv`) → frames [f·w, f·h, C_out, F]:
/// F = 1 on the `first` chunk (the temporal upsamplers only start their history), else the
/// temporal factor.
pub(super) fn decode<'g>(
    g: &'g GraphCtx<'g>,
    dec: &Decoder,
    z: Tensor<'g>,
    first: bool,
) -> Tensor<'g> {
    let k = |name: &str| key("decoder", name);
    let mut x = causal(g, &dec.conv_in, z, &k("conv_in"));
    x = mid(g, &dec.mid, x, &k("mid"));
    x = g.cut("wan_vae.decoder.mid", "x", x);
    for (i, level) in dec.levels.iter().enumerate() {
        for (j, r) in level.resnets.iter().enumerate() {
            x = resnet(g, r, x, &k(&format!("up.{i}.{j}")));
        }
        if let Some(conv) = &level.resample {
            if let (Some(time), false) = (&level.time_conv, first) {
                x = double_frames(g, time, x, &k(&format!("up.{i}.time_conv")));
            }
            let [w, h, c, n] = x.ne();
            let up = g.interpolate(x, [2 * w, 2 * h, c, n], ScaleMode::Nearest);
            x = conv.forward(g, up);
        }
        x = g.cut(&format!("wan_vae.decoder.up.{i}"), "x", x);
    }
    let x = g.silu(dec.norm_out.forward(g, x));
    causal(g, &dec.conv_out, x, &k("conv_out"))
}
