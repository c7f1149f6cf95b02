//! Resizing planar host tensors (`[W, H, C]` latents, masks and float images) the way upstream
//! sd-cli's tensor `interpolate` does: the hires fix's latent and image upscalers and the
//! inpainting mask's reduction to latent size.
//!
//! Conventions (upstream `core/tensor.hpp`, which follows PyTorch's `align_corners=False`):
//! output pixel `o` samples the input at `(o + 0.5)·in/out − 0.5`; filters read clamped edge
//! pixels; bicubic uses a = −0.75 (PyTorch); Lanczos has radius 3 and normalised weights;
//! antialiasing widens a filter by the downscale ratio and normalises its weights.

use crate::tensor::HostTensor;

/// How a tensor is resized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resample {
    /// Input pixel `floor(o·in/out)` (PyTorch `nearest`).
    Nearest,
    /// Input pixel nearest to the sampling centre (PyTorch `nearest-exact`).
    NearestExact,
    /// The maximum over the input pixels an output pixel covers when shrinking; `Nearest`
    /// when growing.
    NearestMax,
    Bilinear {
        antialias: bool,
    },
    Bicubic {
        antialias: bool,
    },
    Lanczos,
}

/// One input pixel's weight in an output pixel.
struct Tap {
    index: usize,
    weight: f64,
}

fn linear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn cubic(x: f64) -> f64 {
    const A: f64 = -0.75;
    let x = x.abs();
    if x <= 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

fn sinc(x: f64) -> f64 {
    if x.abs() < 1e-12 {
        1.0
    } else {
        let px = std::f64::consts::PI * x;
        px.sin() / px
    }
}

fn lanczos3(x: f64) -> f64 {
    let x = x.abs();
    if x >= 3.0 {
        0.0
    } else {
        sinc(x) * sinc(x / 3.0)
    }
}

/// The taps of every output pixel along one axis for a filter of `support` input pixels.
fn filter_taps(
    input: usize,
    output: usize,
    support: f64,
    kernel: fn(f64) -> f64,
    antialias: bool,
    normalise: bool,
) -> Vec<Vec<Tap>> {
    let scale = input as f64 / output as f64;
    let widen = if antialias { scale.max(1.0) } else { 1.0 };
    let reach = support * widen;
    (0..output)
        .map(|o| {
            let centre = (o as f64 + 0.5) * scale - 0.5;
            let (start, end) = (
                (centre - reach).ceil() as i64,
                (centre + reach).floor() as i64,
            );
            let mut taps: Vec<Tap> = (start..=end)
                .filter_map(|i| {
                    let weight = kernel((centre - i as f64) / widen);
                    (weight != 0.0).then(|| Tap {
                        index: i.clamp(0, input as i64 - 1) as usize,
                        weight,
                    })
                })
                .collect();
            let sum: f64 = taps.iter().map(|t| t.weight).sum();
            if normalise && sum.abs() > 1e-12 {
                taps.iter_mut().for_each(|t| t.weight /= sum);
            }
            if taps.is_empty() {
                let nearest = ((centre + 0.5).floor() as i64).clamp(0, input as i64 - 1);
                taps.push(Tap {
                    index: nearest as usize,
                    weight: 1.0,
                });
            }
            taps
        })
        .collect()
}

/// The source index of output pixel `o` for the nearest-type modes.
fn nearest_index(mode: Resample, o: usize, input: usize, output: usize) -> usize {
    match mode {
        Resample::NearestExact => {
            let centre = (o as f64 + 0.5) * (input as f64 / output as f64) - 0.5;
            ((centre + 0.5).floor() as i64).clamp(0, input as i64 - 1) as usize
        }
        _ => o * input / output,
    }
}

/// Resizes every plane of `x` ([W, H, C, N]) to `width × height`.
pub fn resize(x: &HostTensor, width: usize, height: usize, mode: Resample) -> HostTensor {
    let [iw, ih, c, n] = x.ne;
    if (iw, ih) == (width, height) {
        return x.clone();
    }
    let planes = c * n.max(1);
    let mut out = vec![0f32; width * height * planes];
    let filter = match mode {
        Resample::Bilinear { antialias } => Some((1.0, linear as fn(f64) -> f64, antialias, false)),
        Resample::Bicubic { antialias } => Some((2.0, cubic as fn(f64) -> f64, antialias, false)),
        Resample::Lanczos => Some((3.0, lanczos3 as fn(f64) -> f64, false, true)),
        _ => None,
    };
    let shrinks = iw > width || ih > height;
    for p in 0..planes {
        let src = &x.data[p * iw * ih..(p + 1) * iw * ih];
        let dst = &mut out[p * width * height..(p + 1) * width * height];
        match filter {
            Some((support, kernel, antialias, normalise)) => {
                let norm = normalise || antialias;
                let tx = filter_taps(iw, width, support, kernel, antialias, norm);
                let ty = filter_taps(ih, height, support, kernel, antialias, norm);
                for (y, ys) in ty.iter().enumerate() {
                    for (xo, xs) in tx.iter().enumerate() {
                        let mut v = 0f64;
                        for a in ys {
                            let row = &src[a.index * iw..(a.index + 1) * iw];
                            for b in xs {
                                v += f64::from(row[b.index]) * a.weight * b.weight;
                            }
                        }
                        dst[y * width + xo] = v as f32;
                    }
                }
            }
            None if mode == Resample::NearestMax && shrinks => {
                for y in 0..height {
                    let (y0, y1) = (y * ih / height, ((y + 1) * ih).div_ceil(height).min(ih));
                    for xo in 0..width {
                        let (x0, x1) = (xo * iw / width, ((xo + 1) * iw).div_ceil(width).min(iw));
                        let mut m = f32::NEG_INFINITY;
                        for yy in y0..y1.max(y0 + 1) {
                            for xx in x0..x1.max(x0 + 1) {
                                m = m.max(src[yy * iw + xx]);
                            }
                        }
                        dst[y * width + xo] = m;
                    }
                }
            }
            None => {
                for y in 0..height {
                    let sy = nearest_index(mode, y, ih, height);
                    for xo in 0..width {
                        dst[y * width + xo] = src[sy * iw + nearest_index(mode, xo, iw, width)];
                    }
                }
            }
        }
    }
    HostTensor {
        ne: [width, height, c, n],
        data: out,
    }
}

/// A 3×3 maximum filter with stride 1 (edges padded so they never win): grows a 0/1 mask by
/// one pixel, as upstream does to an inpainting model's denoise mask.
pub fn dilate3(x: &HostTensor) -> HostTensor {
    let [w, h, c, n] = x.ne;
    let mut out = x.clone();
    for p in 0..c * n.max(1) {
        let src = &x.data[p * w * h..(p + 1) * w * h];
        let dst = &mut out.data[p * w * h..(p + 1) * w * h];
        for y in 0..h {
            for xo in 0..w {
                let mut m = f32::NEG_INFINITY;
                for yy in y.saturating_sub(1)..(y + 2).min(h) {
                    for xx in xo.saturating_sub(1)..(xo + 2).min(w) {
                        m = m.max(src[yy * w + xx]);
                    }
                }
                dst[y * w + xo] = m;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(w: usize, h: usize, data: Vec<f32>) -> HostTensor {
        HostTensor::new([w, h, 1, 1], data).unwrap()
    }

    #[test]
    fn bilinear_doubling_matches_pytorch_half_pixel_rule() {
        // torch.nn.functional.interpolate([[0, 1]], size=4, mode="linear") = 0, .25, .75, 1
        let out = resize(
            &t(2, 1, vec![0.0, 1.0]),
            4,
            1,
            Resample::Bilinear { antialias: false },
        );
        assert_eq!(out.data, vec![0.0, 0.25, 0.75, 1.0]);
    }

    #[test]
    fn bicubic_keeps_constants_and_nearest_repeats() {
        let c = resize(
            &t(3, 2, vec![2.0; 6]),
            7,
            5,
            Resample::Bicubic { antialias: false },
        );
        assert!(c.data.iter().all(|v| (v - 2.0).abs() < 1e-6));
        let n = resize(&t(2, 1, vec![1.0, 2.0]), 4, 1, Resample::Nearest);
        assert_eq!(n.data, vec![1.0, 1.0, 2.0, 2.0]);
        let l = resize(&t(4, 1, vec![1.0; 4]), 9, 1, Resample::Lanczos);
        assert!(l.data.iter().all(|v| (v - 1.0).abs() < 1e-6));
    }

    #[test]
    fn antialiasing_widens_and_renormalises_only_when_shrinking() {
        // Upstream's rule, worked by hand: 4 → 2 with a 2-pixel-wide triangle whose edge taps
        // clamp to the border pixel (PyTorch would drop them: 0.714 and 2.286 instead).
        let x = t(4, 1, vec![0.0, 1.0, 2.0, 3.0]);
        let out = resize(&x, 2, 1, Resample::Bilinear { antialias: true });
        assert!((out.data[0] - 0.625).abs() < 1e-6 && (out.data[1] - 2.375).abs() < 1e-6);
        let up = |aa| resize(&x, 9, 1, Resample::Bicubic { antialias: aa }).data;
        let (a, b) = (up(true), up(false));
        assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-6));
    }

    #[test]
    fn nearest_max_keeps_any_set_pixel_of_a_block() {
        let mut m = vec![0.0; 16];
        m[5] = 1.0; // (1, 1): inside the top-left 2x2 block
        let out = resize(&t(4, 4, m), 2, 2, Resample::NearestMax);
        assert_eq!(out.data, vec![1.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn dilation_grows_a_pixel_to_its_neighbours() {
        let mut m = vec![0.0; 16];
        m[0] = 1.0;
        let out = dilate3(&t(4, 4, m));
        let set: Vec<usize> = (0..16).filter(|&i| out.data[i] == 1.0).collect();
        assert_eq!(set, vec![0, 1, 4, 5]);
    }
}
