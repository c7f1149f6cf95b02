//! Reading a Wan 2.1 VAE's block lists from its weight names: which layout, how many levels
//! and resnets per level.

use crate::models::vae::qwen_image_2_1_vae::blocks::conv_shape;
use crate::runner::{RunnerError, WeightBuilder};

use super::bad_config;
use super::layout::{WanNames, WanVaeLayout};

/// Most entries probed in one block list while detecting (the released encoder has 11).
const MAX_ENTRIES: usize = 256;

/// What one entry of a block list holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Entry {
    Resnet,
    Resample,
}

/// Splits a block list into levels of `n` resnets, each but the last closed by a resampler:
/// (levels, n), or `None` when the list has another shape.
fn split_levels(entries: &[Entry]) -> Option<(usize, usize)> {
    let n = entries.iter().take_while(|&&e| e == Entry::Resnet).count();
    if n == 0 {
        return None;
    }
    let mut levels = 0;
    let mut rest = entries;
    loop {
        if rest.len() < n || rest[..n].iter().any(|&e| e != Entry::Resnet) {
            return None;
        }
        levels += 1;
        match rest[n..].split_first() {
            None => return Some((levels, n)),
            Some((Entry::Resample, more)) if !more.is_empty() => rest = more,
            _ => return None,
        }
    }
}

/// Reads the block lists under `wb` for one layout.
pub(super) struct Detector<'a, 'l, 's> {
    pub wb: &'a WeightBuilder<'l, 's>,
    pub names: WanNames,
}

impl Detector<'_, '_, '_> {
    fn entry(&self, path: &str) -> Option<Entry> {
        let conv1 = self.names.shared().resnet_leaves().conv1;
        if self.wb.contains(&format!("{path}.{conv1}.weight")) {
            Some(Entry::Resnet)
        } else if self.wb.contains(&format!("{path}.resample.1.weight")) {
            Some(Entry::Resample)
        } else {
            None
        }
    }

    /// The flat list `path(0), path(1), …` up to the first gap; attention inside a level
    /// (diffusers' `attn_scales`, unused by released models) is refused.
    pub(super) fn flat(&self, path: impl Fn(usize) -> String) -> Result<Vec<Entry>, RunnerError> {
        let mut entries = Vec::new();
        for k in 0..MAX_ENTRIES {
            match self.entry(&path(k)) {
                Some(e) => entries.push(e),
                None => {
                    if self.wb.contains(&format!("{}.to_qkv.weight", path(k))) {
                        return Err(bad_config(
                            self.wb.key(&path(k)),
                            "attention inside a block (attn_scales) is not supported".into(),
                        ));
                    }
                    break;
                }
            }
        }
        Ok(entries)
    }

    /// diffusers' nested decoder blocks, as the same flat list.
    pub(super) fn nested_decoder(&self) -> Vec<Entry> {
        let mut entries = Vec::new();
        for i in 0..MAX_ENTRIES {
            let before = entries.len();
            for j in 0..MAX_ENTRIES {
                match self.entry(&format!("decoder.up_blocks.{i}.resnets.{j}")) {
                    Some(Entry::Resnet) => entries.push(Entry::Resnet),
                    _ => break,
                }
            }
            if entries.len() == before {
                break;
            }
            let up = format!("decoder.up_blocks.{i}.upsamplers.0");
            if self.entry(&up) == Some(Entry::Resample) {
                entries.push(Entry::Resample);
            }
        }
        entries
    }

    /// (levels, resnets per level) of one part.
    pub(super) fn levels(
        &self,
        entries: &[Entry],
        part: &str,
    ) -> Result<(usize, usize), RunnerError> {
        split_levels(entries).ok_or_else(|| {
            bad_config(
                self.wb.key(part),
                format!(
                    "unexpected block list ({} entries: levels of resnets, each but the last \
                     closed by a resampler)",
                    entries.len()
                ),
            )
        })
    }

    /// (in, out) channels of the conv at `path`, from its weight and bias.
    pub(super) fn conv(&self, path: &str) -> Result<(usize, usize), RunnerError> {
        conv_shape(&self.wb.pp(path))
            .map(|(i, o, _)| (i, o))
            .ok_or_else(|| RunnerError::MissingTensor {
                key: self.wb.key(&format!("{path}.weight")),
                origin: "Wan 2.1 VAE weights (a convolution with its bias)".into(),
            })
    }
}

/// The layout whose names are present, if either.
pub(super) fn detect_layout(wb: &WeightBuilder<'_, '_>) -> Option<WanVaeLayout> {
    let has = |k: &str| wb.contains(k);
    let diffusers = (has("encoder.conv_in.weight") && has("encoder.down_blocks.0.norm1.gamma"))
        || (has("decoder.conv_in.weight")
            && has("decoder.up_blocks.0.upsamplers.0.resample.1.weight"));
    let original = has("encoder.downsamples.0.residual.0.gamma")
        || has("decoder.upsamples.0.residual.0.gamma");
    if diffusers {
        Some(WanVaeLayout::Diffusers)
    } else if original {
        Some(WanVaeLayout::Original)
    } else {
        None
    }
}
