//! Spatially tiled video decode (`--vae-tiling` with `-M vid_gen`) on the tiny Wan 2.1 VAE of
//! tests/fixtures/wan_vae_video (model B: z 4, 4× spatial, 4× temporal): each tile is the
//! tile's own whole-clip decode, blended as image tiles are; the blend stays close to the
//! untiled clip; an allocation failure makes the video decode retry with smaller tiles.
//!
//! As in tests/vae_tiled_decode.rs, a random-weight VAE is far from translation-invariant, so
//! tiled vs untiled agreement is bounded loosely (mean |diff| ≤ 0.2 of the output scale; the
//! decoder's output is mostly clamped at ±1, which makes that worse than for images) and
//! the exact check is against the per-tile decodes themselves.

mod common;

use common::*;
use sd_cli::error::Error;
use sd_cli::models::vae::tiling::TileSettings;
use sd_cli::models::vae::wan_vae::{WanVae, WanVaeConfig};
use sd_cli::pipeline::vae::{LatentNorm, VaeStage};
use sd_cli::runner::{LoadOptions, RunOptions, Runner, RunnerError, StoreSource};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

fn vae_stage(budget: Option<usize>) -> VaeStage {
    let store = TensorStore::open(&fixture_path(
        "wan_vae_video/b/diffusion_pytorch_model.safetensors",
    ))
    .unwrap();
    let src = StoreSource::new(&store, "");
    let opts = LoadOptions {
        backend: cpu(),
        wtype: None,
        run: RunOptions {
            memory_budget: budget,
            ..RunOptions::default()
        },
        adapters: None,
    };
    let vae = Runner::load("vae", &src, opts, |wb| -> Result<_, RunnerError> {
        let mut config = WanVaeConfig::detect(wb)?;
        config.video = true;
        WanVae::new(wb, config)
    })
    .unwrap();
    // The stage's normalisation is not used: decode_video takes VAE-space latents.
    VaeStage::new(
        vae,
        LatentNorm::Scale {
            scale: 1.0,
            shift: 0.0,
        },
    )
}

/// A smooth latent [w, h, T, z] that changes a little from frame to frame.
fn smooth_clip(w: usize, h: usize, t: usize, z: usize) -> HostTensor {
    let mut data = Vec::with_capacity(w * h * t * z);
    for ch in 0..z {
        for f in 0..t {
            for y in 0..h {
                for x in 0..w {
                    let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
                    let level = [0.6, -0.4, 0.2, -0.8][ch % 4] + 0.1 * f as f32;
                    data.push(
                        level
                            + 0.03
                                * (fx * 3.1 + ch as f32 + f as f32).sin()
                                * (fy * 2.3 - ch as f32 * 0.5).cos(),
                    );
                }
            }
        }
    }
    HostTensor {
        ne: [w, h, t, z],
        data,
    }
}

fn mean_diff(a: &HostTensor, b: &HostTensor) -> f32 {
    assert_eq!(a.ne, b.ne);
    a.data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| (x - y).abs())
        .sum::<f32>()
        / a.data.len() as f32
}

/// Value of a clip [W, H, F, C] at (x, y, frame, channel).
fn at(v: &HostTensor, x: usize, y: usize, f: usize, c: usize) -> f32 {
    let [w, h, frames, _] = v.ne;
    v.data[x + w * (y + h * (f + frames * c))]
}

#[test]
fn tiled_video_decode_blends_whole_clip_tiles() {
    let vae = vae_stage(None);
    let z = smooth_clip(16, 12, 3, 4); // 64x48, 9 frames at scale 4
    let full = vae.decode_video(&z, None).unwrap();
    assert_eq!(full.ne, [64, 48, 9, 3]);
    let untiled_bytes = vae.runner().last_compute_bytes();
    let tiles = TileSettings::new(32, 24, None, 0.5);
    let tiled = vae.decode_video(&z, Some(&tiles)).unwrap();
    assert_eq!(tiled.ne, full.ne);
    assert!(vae.runner().last_compute_bytes() < untiled_bytes);
    let mean = mean_diff(&full, &tiled);
    let scale = full.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    eprintln!("tiled vs untiled video decode: mean abs diff {mean:.3e} (output scale {scale:.2})");
    assert!(mean < 0.2 * scale.max(1.0), "{mean}");

    // Tiles of 8x6 latent pixels start at x 0, 4, 8 and y 0, 3, 6. Where only the first tile
    // covers the frame (the top-left 16x12 pixels), and only the last (the bottom-right
    // 16x12), every frame is exactly that tile's own clip decode.
    for (x0, y0) in [(0, 0), (8, 6)] {
        let own = vae
            .decode_video(&crop_clip(&z, x0, y0, 8, 6), None)
            .unwrap();
        assert_eq!(own.ne, [32, 24, 9, 3]);
        let (ox, oy) = (if x0 == 0 { 0 } else { 16 }, if y0 == 0 { 0 } else { 12 });
        for f in 0..9 {
            for c in 0..3 {
                for y in oy..oy + 12 {
                    for x in ox..ox + 16 {
                        assert_eq!(
                            at(&own, x, y, f, c),
                            at(&tiled, x + 4 * x0, y + 4 * y0, f, c),
                            "tile at ({x0},{y0}): ({x},{y},{f},{c})"
                        );
                    }
                }
            }
        }
    }

    // A tile as big as the frame is the untiled decode itself.
    let one = TileSettings::new(64, 48, None, 0.5);
    assert_eq!(vae.decode_video(&z, Some(&one)).unwrap().data, full.data);
}

/// The `w × h` window at (x0, y0) of every frame and channel of a clip.
fn crop_clip(z: &HostTensor, x0: usize, y0: usize, w: usize, h: usize) -> HostTensor {
    let [zw, zh, t, c] = z.ne;
    let mut data = Vec::with_capacity(w * h * t * c);
    for plane in 0..t * c {
        for y in y0..y0 + h {
            let row = (plane * zh + y) * zw + x0;
            data.extend_from_slice(&z.data[row..row + w]);
        }
    }
    HostTensor {
        ne: [w, h, t, c],
        data,
    }
}

#[test]
fn video_decode_retries_with_smaller_tiles_on_allocation_failure() {
    let vae = vae_stage(None);
    let z = smooth_clip(16, 12, 3, 4);
    let full = vae.decode_video(&z, None).unwrap();
    let runner = vae.runner();
    let need = runner.last_compute_bytes() + runner.weights().unwrap().bytes();

    let tight = vae_stage(Some(need * 2 / 3));
    let retried = tight
        .decode_video(&z, None)
        .expect("the retry with tiles succeeds");
    assert_eq!(retried.ne, full.ne);
    let mean = mean_diff(&full, &retried);
    eprintln!("OOM retry video decode vs untiled: mean abs diff {mean:.3e}");
    assert!(mean < 0.2, "{mean}");

    // A budget below every tile gives the allocation error after the retries, no panic.
    let tiny = vae_stage(Some(runner.weights().unwrap().bytes() + 1024));
    let e = tiny.decode_video(&z, None);
    assert!(
        matches!(e, Err(Error::Runner(ref r)) if r.is_alloc_failure()),
        "{:?}",
        e.err()
    );
}
