//! VAE tiling: tile-grid arithmetic against upstream's rules (fixtures from
//! tests/reference/vae_tiling_fixtures.py, itself checked against upstream's C++), blending
//! and the decode OOM retry.

use std::cell::RefCell;
use std::sync::Once;

use sd_cli::models::vae::tiling::{
    decode_with_retry, next_retry_tiles, plan_tiles, plan_tiles_latent, retry_warning,
    tiled_decode, tiled_encode, TileGrid, TileSettings, TilingError,
};
use sd_cli::tensor::HostTensor;
use serde::Deserialize;

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/vae_tiling/grids.json"
);

fn px(w: u32, h: u32, overlap: f32) -> TileSettings {
    TileSettings::new(w, h, None, overlap)
}

fn rel(w: f32, h: f32, overlap: f32) -> TileSettings {
    TileSettings::new(0, 0, Some((w, h)), overlap)
}

// ---------------------------------------------------------------- reference grids

#[derive(Deserialize)]
struct Fixtures {
    cases: Vec<GridCase>,
    retries: Vec<RetryCase>,
}

#[derive(Deserialize)]
struct GridCase {
    image: [usize; 2],
    scale: usize,
    tile_px: [u32; 2],
    relative: Option<[f32; 2]>,
    overlap: f32,
    expect: Option<GridExpect>,
}

#[derive(Deserialize)]
struct GridExpect {
    tile_w: usize,
    tile_h: usize,
    overlap: f32,
    factor_x: f32,
    factor_y: f32,
    origins_x: Vec<usize>,
    origins_y: Vec<usize>,
}

#[derive(Deserialize)]
struct RetryCase {
    image: [usize; 2],
    scale: usize,
    tiled_px: Option<[u32; 2]>,
    sequence: Vec<[usize; 2]>,
}

fn fixtures() -> Fixtures {
    let text = std::fs::read_to_string(FIXTURES).expect("read grids.json");
    serde_json::from_str(&text).expect("parse grids.json")
}

#[test]
fn grids_match_reference() {
    let fx = fixtures();
    assert!(fx.cases.len() > 2000);
    let (mut ok, mut errors) = (0, 0);
    for c in &fx.cases {
        let s = TileSettings::new(
            c.tile_px[0],
            c.tile_px[1],
            c.relative.map(|r| (r[0], r[1])),
            c.overlap,
        );
        let got = plan_tiles(c.image[0], c.image[1], c.scale, &s);
        let what = format!("image {:?} scale {} settings {s:?}", c.image, c.scale);
        match (&c.expect, got) {
            (None, Err(_)) => errors += 1,
            (None, Ok(g)) => panic!("{what}: expected an error, got {g:?}"),
            (Some(_), Err(err)) => panic!("{what}: unexpected error {err}"),
            (Some(e), Ok(g)) => {
                assert_eq!(
                    (g.x.tile, g.y.tile),
                    (e.tile_w, e.tile_h),
                    "{what}: tile size"
                );
                assert_eq!(g.target_overlap, e.overlap, "{what}: clamped overlap");
                // Adapted overlaps are f32 in both; they decide the origins, so exact.
                assert_eq!(g.x.overlap_factor, e.factor_x, "{what}: x overlap");
                assert_eq!(g.y.overlap_factor, e.factor_y, "{what}: y overlap");
                assert_eq!(g.x.origins, e.origins_x, "{what}: x origins");
                assert_eq!(g.y.origins, e.origins_y, "{what}: y origins");
                assert_eq!(g.len(), e.origins_x.len() * e.origins_y.len());
                ok += 1;
            }
        }
    }
    assert!(ok > 1000 && errors > 100, "ok {ok} errors {errors}");
}

#[test]
fn every_grid_covers_its_axis() {
    // Brute force over axis lengths and tile sizes: origins start at 0, end at the axis end,
    // increase strictly and leave no gap.
    for scale in [8usize, 16, 32] {
        for len in 1..=96usize {
            for tile_px in (4..=70u32).step_by(3) {
                for ov in [0.0f32, 0.1, 0.25, 0.4, 0.5] {
                    let Ok(g) =
                        plan_tiles_latent(len, len, scale, &px(tile_px * scale as u32 / 4, 0, ov))
                    else {
                        continue;
                    };
                    let a = &g.x;
                    assert_eq!(a.origins[0], 0);
                    assert_eq!(*a.origins.last().unwrap() + a.tile, len);
                    for w in a.origins.windows(2) {
                        assert!(w[0] < w[1] && w[1] <= w[0] + a.tile, "gap in {a:?}");
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------- named grid cases

#[test]
fn default_512_is_3x3_at_256px() {
    for scale in [8usize, 16, 32] {
        let g = plan_tiles(512, 512, scale, &TileSettings::default()).unwrap();
        assert_eq!((g.x.count(), g.y.count()), (3, 3), "scale {scale}");
        assert_eq!((g.tile_w_px(), g.tile_h_px()), (256, 256));
        assert_eq!(g.x.overlap_factor, 0.5);
        let l = 512 / scale;
        assert_eq!(g.x.origins, vec![0, l / 4, l / 2]);
        // Same grid for the CLI's explicit 256 and for encode (same sizes).
        assert_eq!(plan_tiles(512, 512, scale, &px(256, 256, 0.5)).unwrap(), g);
    }
}

#[test]
fn tile_size_in_latent_pixels_per_scale() {
    for (scale, latent) in [(8usize, 32usize), (16, 16), (32, 8)] {
        let g = plan_tiles(2048, 2048, scale, &TileSettings::default()).unwrap();
        assert_eq!((g.x.tile, g.y.tile), (latent, latent));
    }
    // Rounded down to a multiple of the scale factor.
    let g = plan_tiles(1024, 1024, 16, &px(200, 100, 0.5)).unwrap();
    assert_eq!((g.x.tile, g.y.tile), (12, 6));
    assert_eq!((g.tile_w_px(), g.tile_h_px()), (192, 96));
}

#[test]
fn zero_means_default_and_size_is_capped() {
    let g = plan_tiles(1024, 1024, 8, &px(0, 128, 0.5)).unwrap();
    assert_eq!((g.x.tile, g.y.tile), (32, 16));
    // Capped at the input: a 4096 px tile on a 640x384 image is one tile.
    let g = plan_tiles(640, 384, 8, &px(4096, 4096, 0.5)).unwrap();
    assert!(g.is_single());
    assert_eq!(g.tiles().collect::<Vec<_>>(), vec![(0, 0, 80, 48)]);
}

#[test]
fn non_square_image_and_tiles() {
    let g = plan_tiles(1024, 576, 8, &px(512, 256, 0.5)).unwrap();
    assert_eq!((g.x.tile, g.y.tile), (64, 32));
    assert_eq!(g.x.origins, vec![0, 32, 64]);
    // 72 latent rows with 32-px tiles: 50% doesn't fit evenly, the overlap adapts to
    // (3*32-72)/(2*32) = 0.375, i.e. 12 px, step 20.
    assert_eq!(g.y.overlap_factor, 0.375);
    assert_eq!(g.y.origins, vec![0, 20, 40]);
    let tiles: Vec<_> = g.tiles().collect();
    assert_eq!(tiles.len(), 9);
    // Row-major, like upstream.
    assert_eq!(
        &tiles[..4],
        &[
            (0, 0, 64, 32),
            (32, 0, 64, 32),
            (64, 0, 64, 32),
            (0, 20, 64, 32)
        ]
    );
}

#[test]
fn tiny_images() {
    // Smaller than a tile: one tile of the whole latent.
    let g = plan_tiles(100, 60, 8, &TileSettings::default()).unwrap();
    assert_eq!(g.tiles().collect::<Vec<_>>(), vec![(0, 0, 12, 7)]);
    // Axis shorter than 4 latent pixels: the whole axis is the minimum.
    let g = plan_tiles(24, 512, 8, &TileSettings::default()).unwrap();
    assert_eq!((g.x.tile, g.x.count(), g.y.count()), (3, 1, 3));
    let g = plan_tiles(24, 24, 8, &px(24, 24, 0.5)).unwrap();
    assert!(g.is_single());
    // Below one latent pixel.
    assert!(matches!(
        plan_tiles(7, 64, 8, &TileSettings::default()),
        Err(TilingError::EmptyInput { .. })
    ));
    assert!(matches!(
        plan_tiles(64, 64, 0, &TileSettings::default()),
        Err(TilingError::InvalidScale)
    ));
}

#[test]
fn relative_sizes() {
    // Fraction of the input.
    let g = plan_tiles(1024, 512, 8, &rel(0.5, 0.25, 0.5)).unwrap();
    assert_eq!((g.x.tile, g.y.tile), (64, 16));
    // A target count n at overlap o: tile = len / (n(1-o)+o). 3 tiles at 50% = half.
    let g = plan_tiles(1024, 1024, 8, &rel(3.0, 3.0, 0.5)).unwrap();
    assert_eq!((g.x.tile, g.x.count()), (64, 3));
    // 4 tiles with no overlap.
    let g = plan_tiles(1024, 768, 16, &rel(4.0, 2.0, 0.0)).unwrap();
    assert_eq!(
        (g.x.tile, g.x.count(), g.y.tile, g.y.count()),
        (16, 4, 24, 2)
    );
    // Relative overrides the pixel size, per axis (0 keeps the pixel size on that axis).
    let s = TileSettings::new(128, 128, Some((0.5, 0.0)), 0.5);
    let g = plan_tiles(1024, 1024, 8, &s).unwrap();
    assert_eq!((g.x.tile, g.y.tile), (64, 16));
    // Relative sizes do not depend on the scale factor in fraction terms.
    let g = plan_tiles(1024, 1024, 32, &rel(0.5, 1.0, 0.5)).unwrap();
    assert_eq!((g.x.tile, g.y.tile, g.y.count()), (16, 32, 1));
}

#[test]
fn overlap_zero_and_clamping() {
    let g = plan_tiles(1024, 1024, 8, &px(256, 256, 0.0)).unwrap();
    assert_eq!(g.x.origins, vec![0, 32, 64, 96]);
    assert_eq!(g.x.overlap, 0);
    // 0.7 is clamped to 0.5 and gives the same grid as 0.5.
    let hi = plan_tiles(512, 768, 8, &px(256, 256, 0.7)).unwrap();
    assert_eq!(hi.target_overlap, 0.5);
    assert_eq!(hi, plan_tiles(512, 768, 8, &px(256, 256, 0.5)).unwrap());
    // Negative clamps to 0.
    let lo = plan_tiles(512, 768, 8, &px(256, 256, -0.2)).unwrap();
    assert_eq!(lo, plan_tiles(512, 768, 8, &px(256, 256, 0.0)).unwrap());
    // Overlap adapts: 80 latent px, 32 px tiles, 0 target: 3 tiles overlapping 25%.
    let g = plan_tiles(640, 640, 8, &px(256, 256, 0.0)).unwrap();
    assert_eq!(
        (g.x.origins.clone(), g.x.overlap_factor),
        (vec![0, 24, 48], 0.25)
    );
    assert!(matches!(
        plan_tiles(512, 512, 8, &px(256, 256, f32::NAN)),
        Err(TilingError::InvalidOverlap(_))
    ));
}

#[test]
fn too_small_tiles_are_errors() {
    // 8x: minimum 32 px; 16x: 64 px; 32x: 128 px.
    for (scale, min_px) in [(8usize, 32u32), (16, 64), (32, 128)] {
        assert!(plan_tiles(1024, 1024, scale, &px(min_px, min_px, 0.5)).is_ok());
        let err = plan_tiles(1024, 1024, scale, &px(min_px - 1, min_px, 0.5)).unwrap_err();
        assert_eq!(
            err,
            TilingError::TileTooSmall {
                axis: "width",
                requested_px: min_px - 1,
                min_px: min_px as usize
            }
        );
        assert!(err.to_string().contains("--vae-tile-size"));
        assert!(err.to_string().contains(&format!("{min_px} image pixels")));
        assert!(matches!(
            plan_tiles(1024, 1024, scale, &px(min_px, 1, 0.5)),
            Err(TilingError::TileTooSmall { axis: "height", .. })
        ));
    }
    // The minimum is the whole axis when that is shorter: 3 latent px at 8x.
    assert!(plan_tiles(24, 512, 8, &px(24, 256, 0.5)).is_ok());
    assert!(matches!(
        plan_tiles(24, 512, 8, &px(16, 256, 0.5)),
        Err(TilingError::TileTooSmall { min_px: 24, .. })
    ));
    // Relative sizes too.
    let err = plan_tiles(512, 512, 8, &rel(0.05, 0.5, 0.5)).unwrap_err();
    assert!(
        matches!(
            err,
            TilingError::RelativeTooSmall {
                axis: "width",
                latent: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("--vae-relative-tile-size"));
    assert!(plan_tiles(512, 512, 8, &rel(40.0, 1.0, 0.0)).is_err());
    assert!(matches!(
        plan_tiles(512, 512, 8, &rel(-1.0, 0.5, 0.5)),
        Err(TilingError::InvalidRelative { .. })
    ));
    assert!(plan_tiles(512, 512, 8, &rel(f32::INFINITY, 0.5, 0.5)).is_err());
}

// ---------------------------------------------------------------- blending

/// A smooth test latent with `c` channels.
fn smooth_latent(w: usize, h: usize, c: usize) -> HostTensor {
    let mut data = Vec::with_capacity(w * h * c);
    for ch in 0..c {
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
                data.push((fx * 3.1 + ch as f32).sin() * (fy * 2.3).cos() + 0.1 * ch as f32);
            }
        }
    }
    HostTensor::image(w, h, c, data).unwrap()
}

fn upsample(p: &HostTensor, s: usize) -> HostTensor {
    let mut out = HostTensor::zeros([p.width() * s, p.height() * s, p.channels(), 1]);
    for ch in 0..p.channels() {
        for y in 0..p.height() * s {
            for x in 0..p.width() * s {
                out.data[x + out.ne[0] * (y + out.ne[1] * ch)] = p.at(x / s, y / s, ch);
            }
        }
    }
    out
}

fn downsample(p: &HostTensor, s: usize) -> HostTensor {
    let mut out = HostTensor::zeros([p.width() / s, p.height() / s, p.channels(), 1]);
    for ch in 0..p.channels() {
        for y in 0..out.height() {
            for x in 0..out.width() {
                let mut sum = 0.0f32;
                for dy in 0..s {
                    for dx in 0..s {
                        sum += p.at(x * s + dx, y * s + dy, ch);
                    }
                }
                out.data[x + out.ne[0] * (y + out.ne[1] * ch)] = sum / (s * s) as f32;
            }
        }
    }
    out
}

fn blend_grids() -> Vec<(usize, usize, usize, TileSettings)> {
    vec![
        (64, 64, 8, TileSettings::default()),
        (80, 48, 8, px(256, 128, 0.5)),
        (37, 23, 8, px(96, 64, 0.3)),
        (40, 40, 8, px(256, 256, 0.0)),
        (50, 30, 16, px(160, 128, 0.5)),
        (21, 19, 32, px(128, 128, 0.25)),
        (64, 40, 8, rel(3.0, 0.5, 0.5)),
        (45, 45, 8, px(40, 48, 0.5)),
    ]
}

#[test]
fn identity_decoder_tiled_equals_untiled() {
    for (lw, lh, scale, s) in blend_grids() {
        let grid = plan_tiles_latent(lw, lh, scale, &s).unwrap();
        assert!(grid.len() > 1, "{lw}x{lh} {s:?} should tile");
        let latent = smooth_latent(lw, lh, 3);
        let mut calls = Vec::new();
        let out: HostTensor = tiled_decode::<TilingError, _, _>(
            &latent,
            scale,
            &grid,
            |t| Ok(upsample(t, scale)),
            |i, n| calls.push((i, n)),
        )
        .unwrap();
        assert_eq!(
            out,
            upsample(&latent, scale),
            "{lw}x{lh} scale {scale} {s:?}"
        );
        let n = grid.len();
        assert_eq!(calls, (1..=n).map(|i| (i, n)).collect::<Vec<_>>());
    }
}

#[test]
fn identity_encoder_tiled_equals_untiled() {
    for (lw, lh, scale, s) in blend_grids() {
        let grid = plan_tiles_latent(lw, lh, scale, &s).unwrap();
        let image = upsample(&smooth_latent(lw, lh, 3), scale);
        let mut image = smooth_image_like(&image);
        let expect = downsample(&image, scale);
        let out = tiled_encode::<TilingError, _, _>(
            &image,
            scale,
            &grid,
            |t| Ok(downsample(t, scale)),
            |_, _| {},
        )
        .unwrap();
        assert_eq!(out, expect, "{lw}x{lh} scale {scale} {s:?}");
        // Ragged right/bottom edges (image not a multiple of the scale) are ignored.
        image = pad(&image, scale - 1, 1);
        let out = tiled_encode::<TilingError, _, _>(
            &image,
            scale,
            &grid,
            |t| Ok(downsample(t, scale)),
            |_, _| {},
        )
        .unwrap();
        assert_eq!(out, expect);
    }
}

fn smooth_image_like(p: &HostTensor) -> HostTensor {
    let mut q = p.clone();
    for (i, v) in q.data.iter_mut().enumerate() {
        *v += ((i % 97) as f32 * 0.01).sin() * 0.05;
    }
    q
}

fn pad(p: &HostTensor, ex: usize, ey: usize) -> HostTensor {
    let mut out = HostTensor::zeros([p.width() + ex, p.height() + ey, p.channels(), 1]);
    for ch in 0..p.channels() {
        for y in 0..p.height() {
            for x in 0..p.width() {
                out.data[x + out.ne[0] * (y + out.ne[1] * ch)] = p.at(x, y, ch);
            }
        }
    }
    out
}

#[test]
fn per_tile_offsets_blend_without_seams() {
    const OFFSET: f32 = 1.0;
    for (lw, lh, scale, s) in blend_grids() {
        let grid = plan_tiles_latent(lw, lh, scale, &s).unwrap();
        let latent = smooth_latent(lw, lh, 2);
        let base = upsample(&latent, scale);
        // Tile k adds a pseudo-random constant in [0, OFFSET].
        let mut k = 0u32;
        let out = tiled_decode::<TilingError, _, _>(
            &latent,
            scale,
            &grid,
            |t| {
                k += 1;
                let off = OFFSET * ((k * 7919 % 13) as f32 / 12.0);
                let mut o = upsample(t, scale);
                o.data.iter_mut().for_each(|v| *v += off);
                Ok(o)
            },
            |_, _| {},
        )
        .unwrap();
        // Smallest overlap actually shared by two neighbouring tiles, in image pixels.
        let min_ov = |o: &[usize], tile: usize| {
            o.windows(2)
                .map(|w| (w[0] + tile - w[1]) * scale)
                .min()
                .unwrap_or(usize::MAX)
        };
        let ov_px = min_ov(&grid.x.origins, grid.x.tile).min(min_ov(&grid.y.origins, grid.y.tile));
        assert!(ov_px > 0, "{s:?}: no overlap");
        let bound = OFFSET / ov_px as f32 + 1e-5;
        let d = |x: usize, y: usize, ch: usize| out.at(x, y, ch) - base.at(x, y, ch);
        let mut worst = 0.0f32;
        for ch in 0..out.channels() {
            for y in 0..out.height() {
                for x in 0..out.width() {
                    let v = d(x, y, ch);
                    assert!(
                        (-1e-5..=OFFSET + 1e-5).contains(&v),
                        "blend is not a convex mix: {v}"
                    );
                    if x + 1 < out.width() {
                        worst = worst.max((d(x + 1, y, ch) - v).abs());
                    }
                    if y + 1 < out.height() {
                        worst = worst.max((d(x, y + 1, ch) - v).abs());
                    }
                }
            }
        }
        assert!(
            worst <= bound,
            "{lw}x{lh} scale {scale} {s:?}: seam step {worst} > {bound}"
        );
        // The offsets really differ, so the test would see a hard seam.
        assert!(worst > 0.0);
    }
}

#[test]
fn shape_errors() {
    let grid = plan_tiles_latent(64, 64, 8, &TileSettings::default()).unwrap();
    let latent = smooth_latent(64, 64, 1);
    // Wrong tile output size.
    let r = tiled_decode::<TilingError, _, _>(&latent, 8, &grid, |t| Ok(upsample(t, 4)), |_, _| {});
    assert!(matches!(r, Err(TilingError::Shape(_))));
    // Channel count changing between tiles.
    let mut n = 0;
    let r = tiled_decode::<TilingError, _, _>(
        &latent,
        8,
        &grid,
        |t| {
            n += 1;
            let mut o = upsample(t, 8);
            if n == 2 {
                o = HostTensor::zeros([o.width(), o.height(), 2, 1]);
            }
            Ok(o)
        },
        |_, _| {},
    );
    assert!(matches!(r, Err(TilingError::Shape(_))));
    // Grid planned for another latent or scale.
    let other = smooth_latent(48, 64, 1);
    assert!(
        tiled_decode::<TilingError, _, _>(&other, 8, &grid, |t| Ok(upsample(t, 8)), |_, _| {})
            .is_err()
    );
    assert!(tiled_decode::<TilingError, _, _>(
        &latent,
        16,
        &grid,
        |t| Ok(upsample(t, 16)),
        |_, _| {}
    )
    .is_err());
    // Tile errors propagate and stop the loop.
    let mut calls = 0;
    let r = tiled_decode::<TilingError, _, _>(
        &latent,
        8,
        &grid,
        |_| {
            calls += 1;
            Err(TilingError::Shape("boom".into()))
        },
        |_, _| {},
    );
    assert_eq!(r, Err(TilingError::Shape("boom".into())));
    assert_eq!(calls, 1);
}

#[test]
fn single_tile_passes_input_through() {
    let grid = TileGrid::single(12, 7, 8);
    let latent = smooth_latent(12, 7, 4);
    let out =
        tiled_decode::<TilingError, _, _>(&latent, 8, &grid, |t| Ok(upsample(t, 8)), |_, _| {})
            .unwrap();
    assert_eq!(out, upsample(&latent, 8));
}

// ---------------------------------------------------------------- OOM retry

#[derive(Debug, PartialEq)]
enum FakeErr {
    Alloc,
    Exec,
    Tiling(TilingError),
}

impl From<TilingError> for FakeErr {
    fn from(e: TilingError) -> Self {
        FakeErr::Tiling(e)
    }
}

thread_local! {
    static WARNINGS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Records warnings per test thread, so parallel tests don't see each other's.
struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            WARNINGS.with(|w| w.borrow_mut().push(r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

fn take_warnings() -> Vec<String> {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        log::set_logger(&Capture).expect("logger");
        log::set_max_level(log::LevelFilter::Warn);
    });
    WARNINGS.with(|w| std::mem::take(&mut *w.borrow_mut()))
}

type Tiles = (usize, usize);

/// Runs the retry loop with a runner that fails with an allocation error whenever the tile
/// (image pixels) exceeds `limit`; returns the tile sizes tried (latent) and the result.
fn run_retry(
    image: (usize, usize),
    scale: usize,
    settings: Option<&TileSettings>,
    limit: Option<(usize, usize)>,
) -> (Vec<Tiles>, Result<Tiles, FakeErr>) {
    let latent = (image.0 / scale, image.1 / scale);
    let mut tried = Vec::new();
    let r = decode_with_retry(
        image.0,
        image.1,
        scale,
        settings,
        |g: Option<&TileGrid>| {
            let t = g.map_or(latent, |g| (g.x.tile, g.y.tile));
            tried.push(t);
            match limit {
                Some((lw, lh)) if t.0 * scale <= lw && t.1 * scale <= lh => Ok(t),
                _ => Err(FakeErr::Alloc),
            }
        },
        |e| *e == FakeErr::Alloc,
    );
    (tried, r)
}

#[test]
fn retry_sequences_match_reference() {
    let fx = fixtures();
    assert!(fx.retries.len() > 100);
    take_warnings();
    for c in &fx.retries {
        let s = c.tiled_px.map(|t| px(t[0], t[1], 0.5));
        let (tried, r) = run_retry((c.image[0], c.image[1]), c.scale, s.as_ref(), None);
        let expect: Vec<(usize, usize)> = c.sequence.iter().map(|t| (t[0], t[1])).collect();
        let what = format!(
            "image {:?} scale {} tiled {:?}",
            c.image, c.scale, c.tiled_px
        );
        assert_eq!(tried, expect, "{what}");
        assert_eq!(
            r,
            Err(FakeErr::Alloc),
            "{what}: gives up with the last error"
        );
        for w in tried.windows(2) {
            assert!(
                w[1].0 <= w[0].0 && w[1].1 <= w[0].1 && w[1] != w[0],
                "{what}: grew or stalled"
            );
        }
        let warnings = take_warnings();
        let reducing: Vec<&String> = warnings
            .iter()
            .filter(|w| w.starts_with("reducing"))
            .collect();
        assert_eq!(reducing.len(), tried.len() - 1, "{what}");
        for (w, pair) in reducing.iter().zip(tried.windows(2)) {
            assert_eq!(**w, retry_warning(pair[0], pair[1], c.scale));
        }
    }
}

#[test]
fn retry_from_untiled_1024() {
    take_warnings();
    let (tried, r) = run_retry((1024, 1024), 8, None, Some((128, 128)));
    // Untiled, then at most 256 px, then halving.
    assert_eq!(tried, vec![(128, 128), (32, 32), (16, 16)]);
    assert_eq!(r, Ok((16, 16)));
    let w = take_warnings();
    assert_eq!(
        w,
        vec![
            "reducing VAE decode tiles from 1024x1024 to 256x256 image pixels".to_string(),
            "VAE decode ran out of memory; retrying with spatial tiling".to_string(),
            "reducing VAE decode tiles from 256x256 to 128x128 image pixels".to_string(),
            "VAE decode ran out of memory; retrying with spatial tiling".to_string(),
        ]
    );
}

#[test]
fn retry_non_square_and_small() {
    take_warnings();
    // 16x VAE, 1536x640: latent 96x40 -> (16, 16) [256 px cap] -> (8, 8) -> (4, 4) -> give up.
    let (tried, r) = run_retry((1536, 640), 16, None, None);
    assert_eq!(tried, vec![(96, 40), (16, 16), (8, 8), (4, 4)]);
    assert_eq!(r, Err(FakeErr::Alloc));
    // First retry halves when half is below 256 px: 256x128 at 8x.
    let (tried, _) = run_retry((256, 128), 8, None, None);
    assert_eq!(tried, vec![(32, 16), (16, 8), (8, 4), (4, 4)]);
    // An axis already at the minimum stays; 3-px axes never change.
    assert_eq!(next_retry_tiles((3, 40), false, 8), Some((3, 20)));
    assert_eq!(next_retry_tiles((3, 4), true, 8), None);
    assert_eq!(next_retry_tiles((4, 4), true, 32), None);
    take_warnings();
}

#[test]
fn retry_keeps_user_overlap_and_settings() {
    take_warnings();
    let s = px(512, 512, 0.25);
    let before = s;
    let mut overlaps = Vec::new();
    let r: Result<(), FakeErr> = decode_with_retry(
        1024,
        1024,
        8,
        Some(&s),
        |g| {
            let g = g.expect("tiled");
            overlaps.push((g.x.tile, g.target_overlap));
            if g.x.tile > 16 {
                Err(FakeErr::Alloc)
            } else {
                Ok(())
            }
        },
        |e| *e == FakeErr::Alloc,
    );
    assert_eq!(r, Ok(()));
    // A tiled run halves without the 256 px cap: 512 -> 256 -> 128 px.
    assert_eq!(overlaps, vec![(64, 0.25), (32, 0.25), (16, 0.25)]);
    assert_eq!(s, before);
    take_warnings();
}

#[test]
fn execution_failures_are_not_retried() {
    take_warnings();
    let mut calls = 0;
    let r: Result<(), FakeErr> = decode_with_retry(
        1024,
        1024,
        8,
        None,
        |_| {
            calls += 1;
            Err(FakeErr::Exec)
        },
        |e| *e == FakeErr::Alloc,
    );
    assert_eq!((r, calls), (Err(FakeErr::Exec), 1));
    assert!(take_warnings().is_empty());
    // Bad settings surface as a tiling error before anything runs.
    let bad = px(8, 8, 0.5);
    let r: Result<(), FakeErr> = decode_with_retry(1024, 1024, 8, Some(&bad), |_| Ok(()), |_| true);
    assert!(matches!(
        r,
        Err(FakeErr::Tiling(TilingError::TileTooSmall { .. }))
    ));
}
