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
use crate::runner::{Runner, RunnerError, StoreSource, WeightBuilder};

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

/// The switches loading sets on a Wan VAE's configuration, and its model: one loader for both
/// kinds.
struct VideoVaeSwitches<'c> {
    encoder: &'c mut bool,
    video: &'c mut bool,
    decoder: bool,
    stats: Option<&'c LatentStats>,
    z_dim: usize,
}

trait WanVaeKind: crate::models::vae::Vae + Sized + 'static {
    type Config: std::fmt::Debug;
    fn detect(wb: &WeightBuilder<'_, '_>) -> Result<Self::Config, RunnerError>;
    fn switches(c: &mut Self::Config) -> VideoVaeSwitches<'_>;
    fn build(wb: &WeightBuilder<'_, '_>, c: Self::Config) -> Result<Self, RunnerError>;
}

/// Both configurations name their switches alike.
macro_rules! wan_vae_kind {
    ($model:ty, $config:ty) => {
        impl WanVaeKind for $model {
            type Config = $config;
            fn detect(wb: &WeightBuilder<'_, '_>) -> Result<$config, RunnerError> {
                <$config>::detect(wb)
            }
            fn switches(c: &mut $config) -> VideoVaeSwitches<'_> {
                VideoVaeSwitches {
                    encoder: &mut c.encoder,
                    video: &mut c.video,
                    decoder: c.decoder,
                    stats: c.latent_stats.as_ref(),
                    z_dim: c.z_dim,
                }
            }
            fn build(wb: &WeightBuilder<'_, '_>, c: $config) -> Result<Self, RunnerError> {
                <$model>::new(wb, c)
            }
        }
    };
}

wan_vae_kind!(WanVae, WanVaeConfig);
wan_vae_kind!(Wan22Vae, Wan22VaeConfig);

/// Loads a VAE of kind `V` for video (time convolutions; the encoder only when the run needs
/// it) with its statistics.
fn load_kind<V: WanVaeKind>(
    files: &ComponentStore,
    ctx: &LoadContext<'_>,
    channels: usize,
    encoder: bool,
) -> Result<(VaeStage, LatentStats)> {
    let json = files.config().and_then(LatentStats::from_diffusers_config);
    let src = StoreSource::new(&files.store, ComponentId::Vae.prefix());
    let opts = ctx.load_options(ComponentId::Vae, false)?;
    let no_decoder = || Error::Unsupported("the VAE file has no decoder weights".into());
    let mut stats = None;
    let vae = Runner::load("vae", &src, opts, |wb| -> Result<V> {
        let mut config = V::detect(wb)?;
        let sw = V::switches(&mut config);
        if !sw.decoder {
            return Err(no_decoder());
        }
        *sw.encoder = (ctx.needs.encoder || encoder) && *sw.encoder;
        *sw.video = true;
        stats = Some(pick_stats(json.as_ref(), sw.stats, sw.z_dim, channels)?);
        log::debug!("wan vae: {config:?}");
        Ok(V::build(wb, config)?)
    })?;
    let stats = stats.ok_or_else(no_decoder)?;
    Ok((VaeStage::new(vae, LatentNorm::Stats(stats.clone())), stats))
}

/// Loads the VAE for video (time convolutions included; the encoder when the run needs it) and
/// its statistics; `channels` is the transformer's latent width; `encoder` loads the encoder
/// whatever the run's inputs (VACE encodes its control video). The flag says whether it is
/// the Wan 2.2 VAE (TI2V-5B, whose image-to-video fixes the first latent frame).
pub fn load_vae(
    files: &ComponentStore,
    ctx: &LoadContext<'_>,
    channels: usize,
    encoder: bool,
) -> Result<(VaeStage, LatentStats, bool)> {
    let wan22 = is_wan22(files);
    let (stage, stats) = if wan22 {
        load_kind::<Wan22Vae>(files, ctx, channels, encoder)?
    } else {
        load_kind::<WanVae>(files, ctx, channels, encoder)?
    };
    Ok((stage, stats, wan22))
}
