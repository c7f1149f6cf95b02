//! The Wan VAEs: the Wan 2.1 VAE (16 channels, 8× spatial) and the Wan 2.2 VAE of TI2V-5B (48
//! channels, 16×: RGB patchified 2×2 to 12 channels), told apart by the decoder's output
//! channels (3 vs 12), each with its latent statistics (its `config.json`, else the released
//! values).

use crate::error::{Error, Result};
use crate::models::vae::wan22_vae::{Wan22Vae, Wan22VaeConfig};
use crate::models::vae::wan_vae::{LatentStats, WanVae, WanVaeConfig};
use crate::pipeline::components::{ComponentId, ComponentStore};
use crate::pipeline::family::LoadContext;
use crate::pipeline::vae::{LatentNorm, VaeStage};
use crate::runner::{Runner, StoreSource};

/// Whether the VAE file is a Wan 2.2 VAE: its decoder ends in 12 (patchified) channels.
fn is_wan22(files: &ComponentStore) -> bool {
    let prefix = ComponentId::Vae.prefix();
    ["decoder.head.2.bias", "decoder.conv_out.bias"]
        .iter()
        .filter_map(|n| files.store.get(&format!("{prefix}{n}")))
        .any(|t| t.ne[0] == 12)
}

/// The statistics to use: `config.json`'s, else the detected release's; checked against the
/// VAE's and the transformer's channels.
fn pick_stats(
    from_json: Option<&Result<LatentStats, crate::runner::RunnerError>>,
    detected: Option<&LatentStats>,
    z_dim: usize,
    channels: usize,
) -> Result<LatentStats> {
    let s = match from_json {
        Some(Ok(s)) => s.clone(),
        Some(Err(e)) => return Err(Error::Unsupported(e.to_string())),
        None => detected.cloned().ok_or_else(|| {
            Error::Unsupported(format!(
                "the VAE has a {z_dim}-channel latent but no latents_mean/latents_std"
            ))
        })?,
    };
    if s.channels() != z_dim || z_dim != channels {
        return Err(Error::Unsupported(format!(
            "latent channels disagree: VAE {z_dim}, statistics {}, transformer {channels}",
            s.channels()
        )));
    }
    Ok(s)
}

/// Loads the VAE for video (time convolutions included; the encoder when the run needs it) and
/// its statistics; `channels` is the transformer's latent width. The flag says whether it is
/// the Wan 2.2 VAE (TI2V-5B, whose image-to-video fixes the first latent frame).
pub fn load_vae(
    files: &ComponentStore,
    ctx: &LoadContext<'_>,
    channels: usize,
) -> Result<(VaeStage, LatentStats, bool)> {
    let json = files.config().and_then(LatentStats::from_diffusers_config);
    let src = StoreSource::new(&files.store, ComponentId::Vae.prefix());
    let opts = ctx.load_options(ComponentId::Vae, false)?;
    let need_encoder = ctx.needs.encoder;
    let no_decoder = || Error::Unsupported("the VAE file has no decoder weights".into());
    let mut stats = None;
    let wan22 = is_wan22(files);
    let stage = if wan22 {
        let vae = Runner::load("vae", &src, opts, |wb| -> Result<Wan22Vae> {
            let mut config = Wan22VaeConfig::detect(wb)?;
            if !config.decoder {
                return Err(no_decoder());
            }
            config.encoder = need_encoder && config.encoder;
            config.video = true;
            let s = pick_stats(
                json.as_ref(),
                config.latent_stats.as_ref(),
                config.z_dim,
                channels,
            )?;
            stats = Some(s);
            log::debug!("wan 2.2 vae: {config:?}");
            Ok(Wan22Vae::new(wb, config)?)
        })?;
        let s = stats.clone().ok_or_else(no_decoder)?;
        VaeStage::new(vae, LatentNorm::Stats(s))
    } else {
        let vae = Runner::load("vae", &src, opts, |wb| -> Result<WanVae> {
            let mut config = WanVaeConfig::detect(wb)?;
            if !config.decoder {
                return Err(no_decoder());
            }
            config.encoder = need_encoder && config.encoder;
            config.video = true;
            let s = pick_stats(
                json.as_ref(),
                config.latent_stats.as_ref(),
                config.z_dim,
                channels,
            )?;
            stats = Some(s);
            Ok(WanVae::new(wb, config)?)
        })?;
        let s = stats.clone().ok_or_else(no_decoder)?;
        VaeStage::new(vae, LatentNorm::Stats(s))
    };
    let stats = stats.ok_or_else(no_decoder)?;
    Ok((stage, stats, wan22))
}
