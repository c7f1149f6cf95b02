//! AutoencoderKL decode/encode on host tensors, with spatial tiling and the decode
//! out-of-memory retry (smaller tiles) of `models::vae::tiling`.

use crate::error::{Error, Result};
use crate::models::vae::autoencoder_kl::AutoencoderKl;
use crate::models::vae::tiling::{
    decode_with_retry, plan_tiles, tiled_decode, tiled_encode, Planar, TileSettings,
};
use crate::progress::Progress;
use crate::runner::{HostTensor, Runner};

fn decode_one(runner: &Runner, vae: &AutoencoderKl, z: &Planar) -> Result<Planar> {
    let ne = [z.w, z.h, z.c, 1];
    let mut out =
        runner.compute(|g| vec![vae.decode(g, g.input_f32("vae.z", ne, z.data.clone()))])?;
    let t = out
        .pop()
        .ok_or_else(|| Error::Unsupported("VAE decode returned no output".into()))?;
    Ok(Planar::new(t.ne[0], t.ne[1], t.ne[2], t.data)?)
}

/// Decodes one latent [w, h, C] already divided by the scaling factor; returns the raw decoder
/// output [W, H, 3] in about [-1, 1]. Tiles when `tiling` is set; on an allocation failure,
/// retries with smaller tiles (also when tiling was off).
pub fn decode_latents_kl(
    runner: &Runner,
    vae: &AutoencoderKl,
    z: &Planar,
    tiling: Option<&TileSettings>,
) -> Result<Planar> {
    let scale = vae.scale_factor();
    let (img_w, img_h) = (z.w * scale, z.h * scale);
    decode_with_retry(
        img_w,
        img_h,
        scale,
        tiling,
        |grid| match grid {
            None => decode_one(runner, vae, z),
            Some(grid) if grid.is_single() => decode_one(runner, vae, z),
            Some(grid) => {
                log::debug!(
                    "VAE decode: {} tiles of {}x{} image pixels",
                    grid.len(),
                    grid.tile_w_px(),
                    grid.tile_h_px()
                );
                let mut bar = Progress::new("decoding", grid.len());
                tiled_decode(
                    z,
                    scale,
                    grid,
                    |tile| decode_one(runner, vae, tile),
                    |i, _| bar.set(i),
                )
            }
        },
        |e: &Error| matches!(e, Error::Runner(r) if r.is_alloc_failure()),
    )
}

fn encode_one(runner: &Runner, vae: &AutoencoderKl, x: &Planar) -> Result<Planar> {
    let ne = [x.w, x.h, x.c, 1];
    let mut out = runner.compute(|g| {
        let (mean, _logvar) = vae.encode(g, g.input_f32("vae.x", ne, x.data.clone()));
        vec![mean]
    })?;
    let t: HostTensor = out
        .pop()
        .ok_or_else(|| Error::Unsupported("VAE encode returned no output".into()))?;
    Ok(Planar::new(t.ne[0], t.ne[1], t.ne[2], t.data)?)
}

/// Encodes an image [W, H, 3] in [-1, 1] to the posterior mean (not yet scaled). Encode does
/// not retry on allocation failure (upstream contract); it tiles only when asked.
pub fn encode_image_kl(
    runner: &Runner,
    vae: &AutoencoderKl,
    x: &Planar,
    tiling: Option<&TileSettings>,
) -> Result<Planar> {
    encode_maybe_tiled(x, vae.scale_factor(), tiling, |t| {
        encode_one(runner, vae, t)
    })
}

/// Runs `encode_one` on the whole image, or tile by tile (with a progress bar) when `tiling`
/// plans more than one tile; any VAE whose output is `scale` times smaller works.
pub fn encode_maybe_tiled<F>(
    x: &Planar,
    scale: usize,
    tiling: Option<&TileSettings>,
    mut encode_one: F,
) -> Result<Planar>
where
    F: FnMut(&Planar) -> Result<Planar>,
{
    let grid = match tiling {
        Some(settings) => plan_tiles(x.w, x.h, scale, settings)?,
        None => return encode_one(x),
    };
    if grid.is_single() {
        return encode_one(x);
    }
    let mut bar = Progress::new("encoding", grid.len());
    tiled_encode(x, scale, &grid, encode_one, |i, _| bar.set(i))
}
