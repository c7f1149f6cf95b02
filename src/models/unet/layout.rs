//! Tensor names of the two UNet checkpoint layouts, and the block skeleton read from them.
//!
//! diffusers names blocks by level (`down_blocks.1.resnets.0`, `up_blocks.2.attentions.1`);
//! the LDM single-file layout numbers them in execution order (`input_blocks.4.0`,
//! `output_blocks.5.1`), with a resnet at `.0`, its transformer at `.1` and an up-sampler
//! after them. Distilled and tiny UNets drop blocks, and the diffusers→LDM conversion
//! stable-diffusion.cpp applies keeps SD's three slots per level even then, so LDM indices may
//! have gaps: the skeleton is read from the tensors present, not from index arithmetic.

use crate::runner::{RunnerError, WeightBuilder};

/// Highest LDM block index probed (SDXL uses 0..=8, SD 0..=11).
const MAX_LDM_BLOCKS: usize = 128;
/// Most levels / blocks per level probed in the diffusers layout.
const MAX_DIFFUSERS_BLOCKS: usize = 64;

/// Which naming scheme the checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UNetLayout {
    /// diffusers `UNet2DConditionModel` (`conv_in`, `down_blocks.N.resnets.M`, `mid_block`, ...).
    Diffusers,
    /// The CompVis / SGM single-file layout (`input_blocks.N.M`, `middle_block`,
    /// `output_blocks`, `out`), as found after `model.diffusion_model.`.
    Ldm,
}

/// Leaves of a resnet block: norm1, conv1, time projection, norm2, conv2, 1×1 shortcut.
pub(crate) struct ResnetNames {
    pub norm1: &'static str,
    pub conv1: &'static str,
    pub emb: &'static str,
    pub norm2: &'static str,
    pub conv2: &'static str,
    pub shortcut: &'static str,
}

const DIFFUSERS_RESNET: ResnetNames = ResnetNames {
    norm1: "norm1",
    conv1: "conv1",
    emb: "time_emb_proj",
    norm2: "norm2",
    conv2: "conv2",
    shortcut: "conv_shortcut",
};

const LDM_RESNET: ResnetNames = ResnetNames {
    norm1: "in_layers.0",
    conv1: "in_layers.2",
    emb: "emb_layers.1",
    norm2: "out_layers.0",
    conv2: "out_layers.3",
    shortcut: "skip_connection",
};

impl UNetLayout {
    pub(crate) fn resnet(self) -> &'static ResnetNames {
        match self {
            UNetLayout::Diffusers => &DIFFUSERS_RESNET,
            UNetLayout::Ldm => &LDM_RESNET,
        }
    }

    pub(crate) fn conv_in(self) -> &'static str {
        match self {
            UNetLayout::Diffusers => "conv_in",
            UNetLayout::Ldm => "input_blocks.0.0",
        }
    }

    /// The two linears of the timestep MLP.
    pub(crate) fn time_embed(self) -> [&'static str; 2] {
        match self {
            UNetLayout::Diffusers => ["time_embedding.linear_1", "time_embedding.linear_2"],
            UNetLayout::Ldm => ["time_embed.0", "time_embed.2"],
        }
    }

    /// The two linears of SDXL's vector-conditioning MLP.
    pub(crate) fn label_embed(self) -> [&'static str; 2] {
        match self {
            UNetLayout::Diffusers => ["add_embedding.linear_1", "add_embedding.linear_2"],
            UNetLayout::Ldm => ["label_emb.0.0", "label_emb.0.2"],
        }
    }

    pub(crate) fn norm_out(self) -> &'static str {
        match self {
            UNetLayout::Diffusers => "conv_norm_out",
            UNetLayout::Ldm => "out.0",
        }
    }

    pub(crate) fn conv_out(self) -> &'static str {
        match self {
            UNetLayout::Diffusers => "conv_out",
            UNetLayout::Ldm => "out.2",
        }
    }

    /// The leaf name of a down-sampler's conv under its block path.
    pub(crate) fn downsample_conv(self) -> &'static str {
        match self {
            UNetLayout::Diffusers => "conv",
            UNetLayout::Ldm => "op",
        }
    }
}

/// One resnet with its optional transformer (block paths).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BlockNames {
    pub resnet: String,
    pub attention: Option<String>,
}

/// One level: its blocks and the path of the resampler closing it (the down-sampler's or
/// up-sampler's block; the conv is `<path>.<downsample_conv>` / `<path>.conv`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LevelNames {
    pub blocks: Vec<BlockNames>,
    pub resample: Option<String>,
}

/// The mid block: a resnet, then (transformer, resnet) pairs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MidNames {
    pub resnet: String,
    pub stages: Vec<(String, String)>,
}

/// Every block of the network, as named in the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Skeleton {
    pub down: Vec<LevelNames>,
    pub mid: Option<MidNames>,
    /// In execution order (deepest level first).
    pub up: Vec<LevelNames>,
}

fn bad(wb: &WeightBuilder<'_, '_>, key: &str, reason: String) -> RunnerError {
    wb.bad_data(key, "UNet weights", reason)
}

/// Whether `path` holds a resnet (its first conv).
fn is_resnet(wb: &WeightBuilder<'_, '_>, layout: UNetLayout, path: &str) -> bool {
    wb.contains(&format!("{path}.{}.weight", layout.resnet().conv1))
}

/// Whether `path` holds a transformer (its input projection).
fn is_transformer(wb: &WeightBuilder<'_, '_>, path: &str) -> bool {
    wb.contains(&format!("{path}.proj_in.weight"))
}

/// Reads the skeleton of `layout` from the tensors under `wb`.
pub(crate) fn scan(
    wb: &WeightBuilder<'_, '_>,
    layout: UNetLayout,
) -> Result<Skeleton, RunnerError> {
    let skeleton = match layout {
        UNetLayout::Diffusers => scan_diffusers(wb),
        UNetLayout::Ldm => scan_ldm(wb)?,
    };
    check(wb, layout, &skeleton)?;
    Ok(skeleton)
}

fn scan_diffusers(wb: &WeightBuilder<'_, '_>) -> Skeleton {
    let layout = UNetLayout::Diffusers;
    let level = |kind: &str, i: usize, sampler: &str| -> Option<LevelNames> {
        let base = format!("{kind}.{i}");
        let blocks: Vec<BlockNames> = (0..MAX_DIFFUSERS_BLOCKS)
            .map(|j| format!("{base}.resnets.{j}"))
            .take_while(|r| is_resnet(wb, layout, r))
            .enumerate()
            .map(|(j, resnet)| {
                let attn = format!("{base}.attentions.{j}");
                BlockNames {
                    resnet,
                    attention: is_transformer(wb, &attn).then_some(attn),
                }
            })
            .collect();
        let resample = format!("{base}.{sampler}.0");
        let resample = wb
            .contains(&format!("{resample}.conv.weight"))
            .then_some(resample);
        (!blocks.is_empty()).then_some(LevelNames { blocks, resample })
    };
    let levels = |kind: &str, sampler: &str| -> Vec<LevelNames> {
        (0..MAX_DIFFUSERS_BLOCKS)
            .map_while(|i| level(kind, i, sampler))
            .collect()
    };
    let down = levels("down_blocks", "downsamplers");
    let up = levels("up_blocks", "upsamplers");
    let mid = is_resnet(wb, layout, "mid_block.resnets.0").then(|| MidNames {
        resnet: "mid_block.resnets.0".into(),
        stages: (0..MAX_DIFFUSERS_BLOCKS)
            .map(|k| {
                (
                    format!("mid_block.attentions.{k}"),
                    format!("mid_block.resnets.{}", k + 1),
                )
            })
            .take_while(|(a, r)| is_transformer(wb, a) && is_resnet(wb, layout, r))
            .collect(),
    });
    Skeleton { down, mid, up }
}

fn scan_ldm(wb: &WeightBuilder<'_, '_>) -> Result<Skeleton, RunnerError> {
    let layout = UNetLayout::Ldm;
    let mut down = vec![LevelNames::default()];
    for k in 1..MAX_LDM_BLOCKS {
        let block = format!("input_blocks.{k}.0");
        let level = down.last_mut().expect("at least one level");
        if is_resnet(wb, layout, &block) {
            let attn = format!("input_blocks.{k}.1");
            level.blocks.push(BlockNames {
                resnet: block,
                attention: is_transformer(wb, &attn).then_some(attn),
            });
        } else if wb.contains(&format!("{block}.op.weight")) {
            level.resample = Some(block);
            down.push(LevelNames::default());
        }
    }
    if down.last().is_some_and(|l| l.blocks.is_empty()) {
        down.pop();
    }

    let mut up = vec![LevelNames::default()];
    for k in 0..MAX_LDM_BLOCKS {
        let block = format!("output_blocks.{k}.0");
        if is_resnet(wb, layout, &block) {
            let level = up.last_mut().expect("at least one level");
            let attn = format!("output_blocks.{k}.1");
            level.blocks.push(BlockNames {
                resnet: block,
                attention: is_transformer(wb, &attn).then_some(attn),
            });
        }
        // The up-sampler follows the block's resnet (and transformer): `.1` or `.2`. Tiny
        // UNets converted from diffusers put it in the next, otherwise empty, index.
        let sampler = (1..=2)
            .map(|m| format!("output_blocks.{k}.{m}"))
            .find(|p| wb.contains(&format!("{p}.conv.weight")) && !is_transformer(wb, p));
        if let Some(sampler) = sampler {
            let level = up.last_mut().expect("at least one level");
            if level.blocks.is_empty() {
                return Err(bad(
                    wb,
                    &format!("{sampler}.conv.weight"),
                    "an up-sampler with no resnet before it".into(),
                ));
            }
            level.resample = Some(sampler);
            up.push(LevelNames::default());
        }
    }
    if up.last().is_some_and(|l| l.blocks.is_empty()) {
        up.pop();
    }

    let mut mid: Option<MidNames> = None;
    let mut pending_attention: Option<String> = None;
    for m in 0..MAX_LDM_BLOCKS {
        let path = format!("middle_block.{m}");
        if is_resnet(wb, layout, &path) {
            match (&mut mid, pending_attention.take()) {
                (None, None) => {
                    mid = Some(MidNames {
                        resnet: path,
                        stages: Vec::new(),
                    })
                }
                (Some(mid), Some(attn)) => mid.stages.push((attn, path)),
                _ => {
                    return Err(bad(
                        wb,
                        &path,
                        "middle block resnets and transformers do not alternate".into(),
                    ))
                }
            }
        } else if is_transformer(wb, &path) {
            if mid.is_none() || pending_attention.is_some() {
                return Err(bad(
                    wb,
                    &path,
                    "middle block resnets and transformers do not alternate".into(),
                ));
            }
            pending_attention = Some(path);
        } else {
            break;
        }
    }
    if let Some(attn) = pending_attention {
        return Err(bad(
            wb,
            &attn,
            "the middle block's last transformer has no resnet after it".into(),
        ));
    }
    Ok(Skeleton { down, mid, up })
}

/// The structural rules both layouts share: as many up levels as down levels, resamplers
/// between levels only, and every skip tensor consumed by exactly one up block.
fn check(wb: &WeightBuilder<'_, '_>, layout: UNetLayout, s: &Skeleton) -> Result<(), RunnerError> {
    let first = match layout {
        UNetLayout::Diffusers => "down_blocks.0.resnets.0",
        UNetLayout::Ldm => "input_blocks.1.0",
    };
    if s.down.is_empty() {
        return Err(RunnerError::MissingTensor {
            key: wb.key(&format!("{first}.{}.weight", layout.resnet().conv1)),
            origin: "UNet weights (no down blocks)".into(),
        });
    }
    if s.up.len() != s.down.len() {
        return Err(bad(
            wb,
            first,
            format!("{} down levels but {} up levels", s.down.len(), s.up.len()),
        ));
    }
    let last = s.down.len() - 1;
    for (kind, levels) in [("down", &s.down), ("up", &s.up)] {
        for (i, level) in levels.iter().enumerate() {
            if (i < last) != level.resample.is_some() {
                let at = level.blocks.last().map_or(first, |b| b.resnet.as_str());
                return Err(bad(
                    wb,
                    at,
                    format!(
                        "{kind} level {i} of {} {} a resampler",
                        last + 1,
                        if i < last { "lacks" } else { "has" }
                    ),
                ));
            }
        }
    }
    let skips = 1 + s.down.iter().map(|l| l.blocks.len()).sum::<usize>() + last;
    let consumers: usize = s.up.iter().map(|l| l.blocks.len()).sum();
    if skips != consumers {
        return Err(bad(
            wb,
            first,
            format!("the down path leaves {skips} skip tensors but the up path takes {consumers}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{MemorySource, WeightLoader};

    fn with(names: &[&str]) -> MemorySource {
        let mut src = MemorySource::new();
        for n in names {
            src.insert(*n, [1, 1, 1, 1], vec![0.0]);
        }
        src
    }

    #[test]
    fn ldm_indices_with_gaps_group_by_resampler() {
        // A tiny UNet converted from diffusers with SD's three slots per level: one resnet per
        // down level (input index 2 left empty), no mid block, and the first up-sampler in the
        // otherwise empty output slot 2.
        let src = with(&[
            "input_blocks.1.0.in_layers.2.weight",
            "input_blocks.1.1.proj_in.weight",
            "input_blocks.3.0.op.weight",
            "input_blocks.4.0.in_layers.2.weight",
            "output_blocks.0.0.in_layers.2.weight",
            "output_blocks.1.0.in_layers.2.weight",
            "output_blocks.2.1.conv.weight",
            "output_blocks.3.0.in_layers.2.weight",
            "output_blocks.3.1.proj_in.weight",
            "output_blocks.4.0.in_layers.2.weight",
            "output_blocks.4.1.proj_in.weight",
        ]);
        let loader = WeightLoader::new(&src, None);
        let s = scan(&loader.root(""), UNetLayout::Ldm).unwrap();
        assert_eq!(s.down.len(), 2);
        assert_eq!(s.down[0].blocks.len(), 1);
        assert_eq!(
            s.down[0].blocks[0].attention.as_deref(),
            Some("input_blocks.1.1")
        );
        assert_eq!(s.down[0].resample.as_deref(), Some("input_blocks.3.0"));
        assert_eq!(s.down[1].blocks[0].resnet, "input_blocks.4.0");
        assert!(s.mid.is_none());
        assert_eq!(s.up[0].blocks.len(), 2);
        assert_eq!(s.up[0].resample.as_deref(), Some("output_blocks.2.1"));
        assert_eq!(s.up[1].blocks.len(), 2);
        assert!(s.up[1].blocks.iter().all(|b| b.attention.is_some()));
    }

    #[test]
    fn unbalanced_skeletons_are_refused() {
        // Two down levels but one up level.
        let src = with(&[
            "input_blocks.1.0.in_layers.2.weight",
            "input_blocks.2.0.op.weight",
            "input_blocks.3.0.in_layers.2.weight",
            "output_blocks.0.0.in_layers.2.weight",
            "output_blocks.1.0.in_layers.2.weight",
        ]);
        let loader = WeightLoader::new(&src, None);
        let e = scan(&loader.root(""), UNetLayout::Ldm).unwrap_err();
        assert!(e.to_string().contains("up levels"), "{e}");
        // Mid-block transformer without the resnet after it.
        let src = with(&[
            "down_blocks.0.resnets.0.conv1.weight",
            "up_blocks.0.resnets.0.conv1.weight",
            "up_blocks.0.resnets.1.conv1.weight",
        ]);
        let loader = WeightLoader::new(&src, None);
        assert!(scan(&loader.root(""), UNetLayout::Diffusers).is_ok());
        let src = with(&[
            "input_blocks.1.0.in_layers.2.weight",
            "output_blocks.0.0.in_layers.2.weight",
            "output_blocks.1.0.in_layers.2.weight",
            "middle_block.0.in_layers.2.weight",
            "middle_block.1.proj_in.weight",
        ]);
        let loader = WeightLoader::new(&src, None);
        let e = scan(&loader.root(""), UNetLayout::Ldm).unwrap_err();
        assert!(e.to_string().contains("middle_block.1"), "{e}");
    }
}
