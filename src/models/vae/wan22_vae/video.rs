//! Video encode and decode with the Wan 2.2 VAE, chunk by chunk as diffusers'
//! `AutoencoderKLWan` runs them (the schedule is in the module docs of `super`).
//!
//! Each chunk is one graph on the runner: the image path's stacks with every 3×3×3 conv causal
//! over frames (history in the runner's named cache under `wan22_vae.video.`, one key per
//! conv), the temporal resamplers switched on and the shortcuts folding or duplicating frames.
//! The causal convs, resnets and host-side frame moves are the Wan 2.1 VAE's
//! (`wan_vae::video`); every chunk keeps the image path's cut marks.

use crate::ggml::{ScaleMode, Tensor};
use crate::models::vae::qwen_image_2_1_vae::blocks::ResidualBlock;
use crate::models::vae::qwen_image_2_1_vae::layout::{Names, Part};
use crate::models::vae::wan_vae::posterior_mean;
use crate::models::vae::wan_vae::video::causal::{causal, double_frames, halve_frames};
use crate::models::vae::wan_vae::video::check::whole_kernel;
use crate::models::vae::wan_vae::video::chunk::{mid, resnet};
use crate::models::vae::wan_vae::video::clip::ChunkLoop;
use crate::models::vae::wan_vae::video::shape::{check_frames, check_latent};
use crate::runner::{GraphCtx, Runner, RunnerError, WeightBuilder};
use crate::tensor::HostTensor;

use super::coder::{shortcut_ids, Decoder, Encoder};
use super::patch::{patchify, unpatchify};
use super::{Wan22Vae, ENCODE_CHUNK_FRAMES};

/// Prefix of every cache entry the video paths make (cleared around each video).
const CACHE_PREFIX: &str = "wan22_vae.video.";

const ORIGIN: &str = "Wan 2.2 VAE weights (video)";

fn key(part: &str, name: &str) -> String {
    format!("{CACHE_PREFIX}{part}.{name}")
}

/// Names the VAE in errors about the caller's clips.
const INPUT: &str = "Wan 2.2 VAE video";

fn bad_input(key: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: INPUT.into(),
        reason,
    }
}

/// Patchified frames [W, H, C_in, T] → moments [W/f, H/f, 2·z, T / temporal factor] (the
/// first chunk: one frame in, one out).
fn encode_chunk<'g>(g: &'g GraphCtx<'g>, enc: &Encoder, x: Tensor<'g>) -> Tensor<'g> {
    let k = |name: &str| key("encoder", name);
    let mut x = causal(g, &enc.conv_in, x, &k("conv_in"));
    for (i, level) in enc.levels.iter().enumerate() {
        let mut h = x;
        for (j, r) in level.resnets.iter().enumerate() {
            h = resnet(g, r, h, &k(&format!("down.{i}.{j}")));
        }
        if let Some(conv) = &level.resample {
            // ZeroPad2d((0, 1, 0, 1)), the stride-2 conv per frame, then time.
            h = conv.forward(g, g.pad(h, [(0, 1), (0, 1), (0, 0), (0, 0)]));
            if let Some(time) = &level.time_conv {
                h = halve_frames(g, time, h, &k(&format!("down.{i}.time_conv")));
            }
        }
        x = g.add(h, level.shortcut.down_frames(g, x));
        x = g.cut(&format!("wan22_vae.encoder.down.{i}"), "x", x);
    }
    x = mid(g, &enc.mid, x, &k("mid"));
    x = g.cut("wan22_vae.encoder.mid", "x", x);
    let x = g.silu(enc.norm_out.forward(g, x));
    causal(g, &enc.conv_out, x, &k("conv_out"))
}

/// One latent frame [w, h, z, 1] (after `post_quant_conv`) → patchified frames
/// [f·w, f·h, C_out, F]: F = 1 on the `first` chunk, else the temporal factor.
fn decode_chunk<'g>(g: &'g GraphCtx<'g>, dec: &Decoder, z: Tensor<'g>, first: bool) -> Tensor<'g> {
    let k = |name: &str| key("decoder", name);
    let mut x = causal(g, &dec.conv_in, z, &k("conv_in"));
    x = mid(g, &dec.mid, x, &k("mid"));
    x = g.cut("wan22_vae.decoder.mid", "x", x);
    for (i, level) in dec.levels.iter().enumerate() {
        let mut h = x;
        for (j, r) in level.resnets.iter().enumerate() {
            h = resnet(g, r, h, &k(&format!("up.{i}.{j}")));
        }
        if let Some((conv, shortcut)) = &level.upsample {
            // diffusers' `upsample3d`: the first chunk only starts the time conv's history.
            if let (Some(time), false) = (&level.time_conv, first) {
                h = double_frames(g, time, h, &k(&format!("up.{i}.time_conv")));
            }
            let [w, hh, c, n] = h.ne();
            h = conv.forward(
                g,
                g.interpolate(h, [2 * w, 2 * hh, c, n], ScaleMode::Nearest),
            );
            h = g.add(h, shortcut.up_frames(g, x, &shortcut_ids(i), first));
        }
        x = g.cut(&format!("wan22_vae.decoder.up.{i}"), "x", h);
    }
    let x = g.silu(dec.norm_out.forward(g, x));
    causal(g, &dec.conv_out, x, &k("conv_out"))
}

fn check_resnet(
    wb: &WeightBuilder<'_, '_>,
    names: &Names,
    r: &ResidualBlock,
    path: &str,
) -> Result<(), RunnerError> {
    let leaves = names.resnet_leaves();
    whole_kernel(wb, &r.conv1, &format!("{path}.{}", leaves.conv1), ORIGIN)?;
    whole_kernel(wb, &r.conv2, &format!("{path}.{}", leaves.conv2), ORIGIN)
}

fn check_mid(
    wb: &WeightBuilder<'_, '_>,
    names: &Names,
    part: Part,
    m: &crate::models::vae::qwen_image_2_1_vae::blocks::MidBlock,
) -> Result<(), RunnerError> {
    check_resnet(wb, names, &m.resnet_1, &names.mid_resnet(part, 0))?;
    check_resnet(wb, names, &m.resnet_2, &names.mid_resnet(part, 1))
}

/// Load-time check that the encoder can run on video: whole causal kernels everywhere (the
/// temporal convs of the temporal levels are loaded by `Encoder::new` when video is asked
/// for, or it fails naming them), and chunks of four frames halved at most twice.
pub(super) fn check_encoder(
    wb: &WeightBuilder<'_, '_>,
    names: &Names,
    enc: &Encoder,
) -> Result<(), RunnerError> {
    whole_kernel(wb, &enc.conv_in, &names.conv_in(Part::Encoder), ORIGIN)?;
    for (i, level) in enc.levels.iter().enumerate() {
        for (j, r) in level.resnets.iter().enumerate() {
            check_resnet(wb, names, r, &names.down_resnet(i, j))?;
        }
        if let Some(time) = &level.time_conv {
            let path = format!("{}.time_conv", names.downsampler(i));
            whole_kernel(wb, time, &path, ORIGIN)?;
        }
    }
    let temporal = enc.levels.iter().filter(|l| l.time_conv.is_some()).count();
    if 1 << temporal > ENCODE_CHUNK_FRAMES {
        return Err(wb.bad_data(
            "encoder",
            ORIGIN,
            format!(
                "{temporal} temporal downsamplers; chunks of {ENCODE_CHUNK_FRAMES} frames allow \
                 at most two"
            ),
        ));
    }
    check_mid(wb, names, Part::Encoder, &enc.mid)?;
    whole_kernel(wb, &enc.conv_out, &names.conv_out(Part::Encoder), ORIGIN)
}

/// Load-time check that the decoder can run on video: whole causal kernels everywhere.
pub(super) fn check_decoder(
    wb: &WeightBuilder<'_, '_>,
    names: &Names,
    dec: &Decoder,
) -> Result<(), RunnerError> {
    whole_kernel(wb, &dec.conv_in, &names.conv_in(Part::Decoder), ORIGIN)?;
    check_mid(wb, names, Part::Decoder, &dec.mid)?;
    for (i, level) in dec.levels.iter().enumerate() {
        for (j, r) in level.resnets.iter().enumerate() {
            check_resnet(wb, names, r, &names.up_resnet(i, j))?;
        }
        if let Some(time) = &level.time_conv {
            let path = format!("{}.time_conv", names.upsampler(i));
            whole_kernel(wb, time, &path, ORIGIN)?;
        }
    }
    whole_kernel(wb, &dec.conv_out, &names.conv_out(Part::Decoder), ORIGIN)
}

impl Wan22Vae {
    /// Whether the temporal weights were loaded ([`Wan22VaeConfig::video`](super::Wan22VaeConfig::video)),
    /// which [`decode_video`](Self::decode_video) and [`encode_video`](Self::encode_video) need.
    pub fn has_video(&self) -> bool {
        self.config.video
    }

    fn require_video(&self) -> Result<(), RunnerError> {
        if self.has_video() {
            return Ok(());
        }
        Err(bad_input(
            "time_conv",
            "the VAE was loaded for images only; set Wan22VaeConfig::video before Wan22Vae::new"
                .into(),
        ))
    }

    /// Frames each latent frame after the first decodes to: 2 per temporal upsampler (4).
    pub fn decode_time_factor(&self) -> usize {
        let temporal = self.config.temporal_up.iter().filter(|&&t| t).count();
        1 << temporal
    }

    /// Input frames per latent frame after the first, encoding: 2 per temporal downsampler (4).
    pub fn encode_time_factor(&self) -> usize {
        let temporal = self.config.temporal_down.iter().filter(|&&t| t).count();
        1 << temporal
    }

    /// Frames [`decode_video`](Self::decode_video) makes of `latent_frames` (≥ 1) latent
    /// frames: 1 + 4(T − 1).
    pub fn video_frames(&self, latent_frames: usize) -> usize {
        1 + latent_frames.saturating_sub(1) * self.decode_time_factor()
    }

    /// Latent frames [`encode_video`](Self::encode_video) makes of `frames` frames, which must
    /// be 1 + 4k (diffusers and upstream would drop the rest): 1 + k.
    pub fn latent_frames(&self, frames: usize) -> Result<usize, RunnerError> {
        let chunk = ENCODE_CHUNK_FRAMES;
        if frames == 0 || !(frames - 1).is_multiple_of(chunk) {
            return Err(bad_input(
                "frames",
                format!(
                    "{frames} frames; the Wan 2.2 VAE encodes 1 + {chunk}k frames (1, 5, 9, …)"
                ),
            ));
        }
        let per = (chunk / self.encode_time_factor()).max(1);
        Ok(1 + (frames - 1) / chunk * per)
    }

    /// Decodes one clip's raw latent z [w, h, T, z_dim] (ggml order, PyTorch `[z, T, h, w]`;
    /// `x · std + mean`, as for [`decode`](Self::decode)) to frames [f·w, f·h, F, 3] clamped to
    /// [-1, 1], F = [`video_frames`](Self::video_frames)(T). One graph per latent frame on
    /// `runner` (which holds this VAE's weights); per-chunk progress on stderr.
    pub fn decode_video(&self, runner: &Runner, z: &HostTensor) -> Result<HostTensor, RunnerError> {
        let (post_quant, decoder) = self
            .decoder
            .as_ref()
            .ok_or_else(|| bad_input("decoder", "the VAE was loaded without its decoder".into()))?;
        self.require_video()?;
        check_latent(z, self.config.z_dim, INPUT)?;
        let p = self.config.patch_size;
        let clip = ChunkLoop {
            runner,
            cache: CACHE_PREFIX,
            scale: self.scale_factor(),
        };
        let out_ch = self.config.out_channels / (p * p);
        clip.decode(z, self.decode_time_factor(), out_ch, |g, z, first| {
            let z = post_quant.forward(g, z);
            let y = unpatchify(g, decode_chunk(g, decoder, z, first), p);
            g.clamp(y, -1.0, 1.0)
        })
    }

    /// Encodes one clip x [W, H, F, 3] (ggml order, PyTorch `[C, F, H, W]`) with values in
    /// [-1, 1], F = 1 + 4k and W, H multiples of the scale factor (16), to the raw posterior
    /// mean [W/f, H/f, 1 + k, z_dim] (normalise it with
    /// [`LatentStats::normalize`](super::LatentStats::normalize)). The first frame alone, then
    /// one graph per four frames on `runner`.
    pub fn encode_video(&self, runner: &Runner, x: &HostTensor) -> Result<HostTensor, RunnerError> {
        let (encoder, quant) = self
            .encoder
            .as_ref()
            .ok_or_else(|| bad_input("encoder", "the VAE was loaded without its encoder".into()))?;
        self.require_video()?;
        check_frames(x, self.config.image_channels(), INPUT)?;
        let [w, h, frames, _] = x.ne;
        self.check_encode_size(w, h)?;
        let latent = self.latent_frames(frames)?;
        let (z, p) = (self.config.z_dim, self.config.patch_size);
        let per = (ENCODE_CHUNK_FRAMES / self.encode_time_factor()).max(1);
        let clip = ChunkLoop {
            runner,
            cache: CACHE_PREFIX,
            scale: self.scale_factor(),
        };
        clip.encode(x, per, [latent, z], |g, x| {
            let moments = quant.forward(g, encode_chunk(g, encoder, patchify(g, x, p)));
            posterior_mean(g, moments, z)
        })
    }
}
