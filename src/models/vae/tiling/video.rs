//! Spatially tiled decode of a whole video clip: each tile is decoded over all its frames by
//! the caller's video decode, and the tiles are blended as image tiles are, frames × channels
//! standing in for an image's channels (the blend works plane by plane). Allocation failures
//! retry with smaller tiles ([`decode_with_retry`]).

use super::{decode_with_retry, tiled_decode, TileSettings, TilingError};
use crate::progress::Progress;
use crate::tensor::HostTensor;

/// Decodes latent `z` [w, h, T, C] to frames [w·scale, h·scale, F, C_out] with `whole` (one
/// clip, untiled), tiled per `settings` (`None` = untiled unless memory runs out). `is_alloc`
/// says whether an error is an allocation failure worth retrying with smaller tiles.
pub fn tiled_video_decode<E, W, A>(
    z: &HostTensor,
    scale: usize,
    settings: Option<&TileSettings>,
    whole: W,
    is_alloc: A,
) -> Result<HostTensor, E>
where
    E: From<TilingError>,
    W: Fn(&HostTensor) -> Result<HostTensor, E>,
    A: Fn(&E) -> bool,
{
    let [w, h, t, c] = z.ne;
    decode_with_retry(
        w * scale,
        h * scale,
        scale,
        settings,
        |grid| match grid {
            Some(grid) if !grid.is_single() => {
                log::debug!(
                    "VAE video decode: {} tiles of {}x{} image pixels",
                    grid.len(),
                    grid.tile_w_px(),
                    grid.tile_h_px()
                );
                let planes = |ne: [usize; 4], data| HostTensor {
                    ne: [ne[0], ne[1], ne[2] * ne[3], 1],
                    data,
                };
                let mut frames_out = (0, 0);
                let mut bar = Progress::new("video tiles", grid.len());
                let out = tiled_decode(
                    &planes(z.ne, z.data.clone()),
                    scale,
                    grid,
                    |tile| -> Result<HostTensor, E> {
                        let clip = HostTensor {
                            ne: [tile.ne[0], tile.ne[1], t, c],
                            data: tile.data.clone(),
                        };
                        let v = whole(&clip)?;
                        frames_out = (v.ne[2], v.ne[3]);
                        Ok(planes(v.ne, v.data))
                    },
                    |i, _| bar.set(i),
                )?;
                Ok(HostTensor {
                    ne: [out.ne[0], out.ne[1], frames_out.0, frames_out.1],
                    data: out.data,
                })
            }
            _ => whole(z),
        },
        is_alloc,
    )
}
