//! Load-time checks that a Wan 2.1 VAE can run on video: every 3×3 conv must keep its whole
//! causal kernel (three temporal taps; image-only conversions may keep just the last one), and
//! the temporal resamplers must be there.

use crate::models::vae::qwen_image_2_1_vae::blocks::{Conv, MidBlock, ResidualBlock};
use crate::models::vae::qwen_image_2_1_vae::layout::Part;
use crate::runner::{RunnerError, WeightBuilder};

use super::super::coder::{Decoder, Encoder, Level};
use super::super::layout::WanNames;
use super::causal::DEPTH;
use super::ENCODE_CHUNK_FRAMES;

const ORIGIN: &str = "Wan 2.1 VAE weights (video)";

fn taps(wb: &WeightBuilder<'_, '_>, conv: &Conv, path: &str) -> Result<(), RunnerError> {
    whole_kernel(wb, conv, path, ORIGIN)
}

/// Checks that the conv at `path` keeps its whole causal kernel (three temporal taps), which
/// video needs; `origin` names the weights in the error.
pub(crate) fn whole_kernel(
    wb: &WeightBuilder<'_, '_>,
    conv: &Conv,
    path: &str,
    origin: &str,
) -> Result<(), RunnerError> {
    if conv.frames == DEPTH {
        return Ok(());
    }
    Err(wb.bad_data(
        &format!("{path}.weight"),
        origin,
        format!(
            "the kernel has {} temporal taps; video needs the causal 3-D kernels ({DEPTH} taps), \
             so this checkpoint decodes single images only",
            conv.frames.max(1)
        ),
    ))
}

fn resnet(
    wb: &WeightBuilder<'_, '_>,
    names: &WanNames,
    r: &ResidualBlock,
    path: &str,
) -> Result<(), RunnerError> {
    let leaves = names.shared().resnet_leaves();
    taps(wb, &r.conv1, &format!("{path}.{}", leaves.conv1))?;
    taps(wb, &r.conv2, &format!("{path}.{}", leaves.conv2))
}

fn levels(
    wb: &WeightBuilder<'_, '_>,
    names: &WanNames,
    levels: &[Level],
    resnet_path: impl Fn(usize, usize) -> String,
    resampler_path: impl Fn(usize) -> String,
) -> Result<(), RunnerError> {
    for (i, level) in levels.iter().enumerate() {
        for (j, r) in level.resnets.iter().enumerate() {
            resnet(wb, names, r, &resnet_path(i, j))?;
        }
        if let Some(time) = &level.time_conv {
            taps(wb, time, &format!("{}.time_conv", resampler_path(i)))?;
        }
    }
    if levels.iter().all(|l| l.time_conv.is_none()) {
        return Err(RunnerError::MissingTensor {
            key: wb.key(&format!("{}.time_conv.weight", resampler_path(0))),
            origin: format!(
                "{ORIGIN}: no temporal resampler has its time_conv, so this checkpoint decodes \
                 single images only"
            ),
        });
    }
    Ok(())
}

fn mid(
    wb: &WeightBuilder<'_, '_>,
    names: &WanNames,
    part: Part,
    m: &MidBlock,
) -> Result<(), RunnerError> {
    let shared = names.shared();
    resnet(wb, names, &m.resnet_1, &shared.mid_resnet(part, 0))?;
    resnet(wb, names, &m.resnet_2, &shared.mid_resnet(part, 1))
}

pub(in super::super) fn encoder(
    wb: &WeightBuilder<'_, '_>,
    names: &WanNames,
    enc: &Encoder,
) -> Result<(), RunnerError> {
    let shared = names.shared();
    taps(wb, &enc.conv_in, &shared.conv_in(Part::Encoder))?;
    levels(
        wb,
        names,
        &enc.levels,
        |i, j| names.down_resnet(i, j),
        |i| names.downsampler(i),
    )?;
    // Each temporal downsampler halves a chunk's frames: four frames allow two.
    let temporal = enc.levels.iter().filter(|l| l.time_conv.is_some()).count();
    if 1 << temporal > ENCODE_CHUNK_FRAMES {
        return Err(wb.bad_data(
            "encoder",
            ORIGIN,
            format!(
                "{temporal} temporal downsamplers; chunks of {ENCODE_CHUNK_FRAMES} frames allow                  at most two"
            ),
        ));
    }
    mid(wb, names, Part::Encoder, &enc.mid)?;
    taps(wb, &enc.conv_out, &shared.conv_out(Part::Encoder))
}

pub(in super::super) fn decoder(
    wb: &WeightBuilder<'_, '_>,
    names: &WanNames,
    dec: &Decoder,
) -> Result<(), RunnerError> {
    let shared = names.shared();
    taps(wb, &dec.conv_in, &shared.conv_in(Part::Decoder))?;
    mid(wb, names, Part::Decoder, &dec.mid)?;
    levels(
        wb,
        names,
        &dec.levels,
        |i, j| names.up_resnet(i, j),
        |i| names.upsampler(i),
    )?;
    taps(wb, &dec.conv_out, &shared.conv_out(Part::Decoder))
}
