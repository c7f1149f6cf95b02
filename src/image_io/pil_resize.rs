//! Image resizing that reproduces Pillow's `Image.resize` bit for bit.
//!
//! diffusers' `VaeImageProcessor.resize` (resample "lanczos") and transformers' PIL image
//! processors (Qwen2-VL: BICUBIC) resize reference images with Pillow; matching their pixels
//! exactly keeps our conditioning identical to theirs.
//!
//! How Pillow resizes an 8-bit image (and so how this module does):
//! - Same size: a plain copy.
//! - Nearest: a single affine lookup. The source coordinate starts at half a step and is
//!   advanced by repeated addition of `src / dst` in f64, then truncated.
//! - Other filters: separable convolution, normally first horizontal (only over the rows the
//!   vertical pass will read), then vertical; vertical first when the height shrinks much more
//!   than the width (see `vertical_first`); a pass whose size does not change is skipped. On
//!   downscaling the filter support is widened by the scale factor. Each output sample's
//!   weights are computed in f64, divided by their sum, then turned into 22-bit fixed point
//!   (rounded half away from zero). Sums start at one half, are shifted down and clamped to
//!   0..=255 after each pass.
//! - RGBA (non-nearest): the colour is premultiplied by alpha (`c * a / 255`, rounded),
//!   resized, then divided back (`255 * c / a`, truncated, clamped; alpha 0 and 255 kept).

use super::{Channels, Image, ImageIoError};

/// Pillow's resampling filters (`PIL.Image.Resampling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PilFilter {
    Nearest,
    Box,
    Bilinear,
    Hamming,
    Bicubic,
    Lanczos,
}

impl PilFilter {
    /// Half-width of the kernel at scale 1.
    fn support(self) -> f64 {
        match self {
            PilFilter::Nearest | PilFilter::Box => 0.5,
            PilFilter::Bilinear | PilFilter::Hamming => 1.0,
            PilFilter::Bicubic => 2.0,
            PilFilter::Lanczos => 3.0,
        }
    }

    /// Kernel value at distance `x` (in source pixels at scale 1).
    fn weight(self, x: f64) -> f64 {
        match self {
            PilFilter::Nearest | PilFilter::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            PilFilter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            PilFilter::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let px = x * std::f64::consts::PI;
                    // Pillow's window constants are single-precision literals.
                    px.sin() / px * (0.54f32 as f64 + 0.46f32 as f64 * px.cos())
                }
            }
            PilFilter::Bicubic => {
                // Keys cubic with a = -0.5, in Pillow's evaluation order.
                let a = -0.5f64;
                let x = x.abs();
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
            PilFilter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let px = x * std::f64::consts::PI;
        px.sin() / px
    }
}

/// Fractional bits of the fixed-point weights: 8 bits of result, 2 of headroom.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Per-output-sample weights of one axis.
struct Coeffs {
    /// Slots per output sample.
    ksize: usize,
    /// First source index and number of taps per output sample.
    bounds: Vec<(usize, usize)>,
    /// Fixed-point weights, `ksize` per output sample.
    weights: Vec<i32>,
}

/// Weights for resampling `in_size` samples to `out_size` over the whole axis.
fn precompute(in_size: usize, out_size: usize, filter: PilFilter) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let ss = 1.0 / filterscale;
    let mut bounds = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // `as` truncates toward zero like C's (int) cast; negatives clamp to 0 anyway.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let taps = xmax.saturating_sub(xmin).min(ksize);
        let mut total = 0.0f64;
        for (x, w) in k.iter_mut().enumerate().take(taps) {
            *w = filter.weight(((x + xmin) as f64 - center + 0.5) * ss);
            total += *w;
        }
        let row = &mut weights[xx * ksize..xx * ksize + taps];
        for (dst, &w) in row.iter_mut().zip(k.iter()) {
            let w = if total != 0.0 { w / total } else { w };
            let fixed = w * (1u32 << PRECISION_BITS) as f64;
            *dst = if w < 0.0 {
                (fixed - 0.5) as i32
            } else {
                (fixed + 0.5) as i32
            };
        }
        bounds.push((xmin, taps));
    }
    Coeffs {
        ksize,
        bounds,
        weights,
    }
}

/// Shifts a fixed-point sum down to 8 bits, clamping.
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Accumulator start value: one half, so the final shift rounds.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Horizontal pass over rows `row0..row0 + rows` of `src` (`w` pixels of `c` bytes).
fn horizontal(src: &[u8], w: usize, c: usize, row0: usize, rows: usize, co: &Coeffs) -> Vec<u8> {
    let dw = co.bounds.len();
    let mut out = vec![0u8; dw * rows * c];
    for y in 0..rows {
        let line = &src[(row0 + y) * w * c..(row0 + y + 1) * w * c];
        let out_line = &mut out[y * dw * c..(y + 1) * dw * c];
        for (xx, &(xmin, taps)) in co.bounds.iter().enumerate() {
            let k = &co.weights[xx * co.ksize..xx * co.ksize + taps];
            for ch in 0..c {
                let mut sum = HALF;
                for (t, &kw) in k.iter().enumerate() {
                    let v = line[(xmin + t) * c + ch] as i32;
                    sum = sum.wrapping_add(v.wrapping_mul(kw));
                }
                out_line[xx * c + ch] = clip8(sum);
            }
        }
    }
    out
}

/// Vertical pass: `src` has `w` pixels of `c` bytes per row; source rows are offset by `row0`.
fn vertical(src: &[u8], w: usize, c: usize, row0: usize, co: &Coeffs) -> Vec<u8> {
    let dh = co.bounds.len();
    let stride = w * c;
    let mut out = vec![0u8; stride * dh];
    for (yy, &(ymin, taps)) in co.bounds.iter().enumerate() {
        let k = &co.weights[yy * co.ksize..yy * co.ksize + taps];
        let out_line = &mut out[yy * stride..(yy + 1) * stride];
        for (i, dst) in out_line.iter_mut().enumerate() {
            let mut sum = HALF;
            for (t, &kw) in k.iter().enumerate() {
                let v = src[(ymin - row0 + t) * stride + i] as i32;
                sum = sum.wrapping_add(v.wrapping_mul(kw));
            }
            *dst = clip8(sum);
        }
    }
    out
}

/// Two-pass convolution resize of interleaved 8-bit samples (any channel count).
fn convolve(
    src: &[u8],
    (sw, sh): (usize, usize),
    c: usize,
    (dw, dh): (usize, usize),
    filter: PilFilter,
) -> Vec<u8> {
    let need_h = dw != sw;
    let need_v = dh != sh;
    let vert = precompute(sh, dh, filter);
    if need_h && need_v && vertical_first((sw, sh), (dw, dh)) {
        let horiz = precompute(sw, dw, filter);
        let mid = vertical(src, sw, c, 0, &vert);
        return horizontal(&mid, sw, c, 0, dh, &horiz);
    }
    // Rows the vertical pass reads (all of them when it is skipped).
    let (first, last) = if need_v {
        let (lo, _) = vert.bounds[0];
        let (hi0, hn) = vert.bounds[dh - 1];
        (lo, hi0 + hn)
    } else {
        (0, sh)
    };
    let (mid, mid_w, row0) = if need_h {
        let horiz = precompute(sw, dw, filter);
        (
            horizontal(src, sw, c, first, last - first, &horiz),
            dw,
            first,
        )
    } else {
        (src.to_vec(), sw, 0)
    };
    if need_v {
        vertical(&mid, mid_w, c, row0, &vert)
    } else {
        mid
    }
}

/// Pillow 13 runs the vertical pass first when the height shrinks by more than twice as many
/// pixels as the width does (so also whenever the height shrinks and the width grows).
/// The order changes results, since the intermediate image is rounded to 8 bits. The rule was
/// established by probing Pillow 13.0.0 (thousands of random size pairs, no exception).
fn vertical_first((sw, sh): (usize, usize), (dw, dh): (usize, usize)) -> bool {
    dh < sh && (sh - dh) as i64 > 2 * (sw as i64 - dw as i64)
}

/// Nearest neighbour as Pillow's affine scale does it: positions accumulate in f64.
fn nearest(src: &[u8], (sw, sh): (usize, usize), c: usize, (dw, dh): (usize, usize)) -> Vec<u8> {
    let table = |src_n: usize, dst_n: usize| -> Vec<Option<usize>> {
        let step = src_n as f64 / dst_n as f64;
        let mut pos = step * 0.5;
        (0..dst_n)
            .map(|_| {
                let i = if pos < 0.0 { None } else { Some(pos as usize) };
                pos += step;
                i.filter(|&i| i < src_n)
            })
            .collect()
    };
    let xs = table(sw, dw);
    let ys = table(sh, dh);
    // Samples that fall outside the source stay 0, as Pillow's fill does.
    let mut out = vec![0u8; dw * dh * c];
    for (y, sy) in ys.iter().enumerate() {
        let Some(sy) = *sy else { continue };
        for (x, sx) in xs.iter().enumerate() {
            let Some(sx) = *sx else { continue };
            let s = (sy * sw + sx) * c;
            let d = (y * dw + x) * c;
            out[d..d + c].copy_from_slice(&src[s..s + c]);
        }
    }
    out
}

/// `c * a / 255` rounded, Pillow's RGBA -> RGBa conversion.
fn premultiply(data: &mut [u8]) {
    for px in data.chunks_exact_mut(4) {
        let a = px[3] as u32;
        for v in &mut px[..3] {
            let t = *v as u32 * a + 128;
            *v = ((t + (t >> 8)) >> 8) as u8;
        }
    }
}

/// `255 * c / a` truncated and clamped, Pillow's RGBa -> RGBA conversion.
fn unpremultiply(data: &mut [u8]) {
    for px in data.chunks_exact_mut(4) {
        let a = px[3] as u32;
        if a == 0 || a == 255 {
            continue;
        }
        for v in &mut px[..3] {
            *v = (255 * *v as u32 / a).min(255) as u8;
        }
    }
}

fn resize_samples(
    src: &[u8],
    src_size: (usize, usize),
    c: usize,
    dst_size: (usize, usize),
    filter: PilFilter,
) -> Vec<u8> {
    match filter {
        PilFilter::Nearest => nearest(src, src_size, c, dst_size),
        _ => convolve(src, src_size, c, dst_size, filter),
    }
}

fn check_target(width: u32, height: u32) -> Result<(), ImageIoError> {
    if width == 0 || height == 0 {
        return Err(ImageIoError::BadSize { width, height });
    }
    Ok(())
}

/// Resizes `img` to `width` x `height` exactly as Pillow's `Image.resize(size, filter)` does
/// (no `box`, no `reducing_gap`). RGBA images are resized premultiplied, as Pillow does for
/// every filter but nearest. Errors only on a zero target size.
pub fn resize_pil(
    img: &Image,
    width: u32,
    height: u32,
    filter: PilFilter,
) -> Result<Image, ImageIoError> {
    check_target(width, height)?;
    if img.width == width && img.height == height {
        return Ok(img.clone());
    }
    let src_size = (img.width as usize, img.height as usize);
    let dst_size = (width as usize, height as usize);
    let c = img.channels.count();
    let premul = img.channels == Channels::Rgba && filter != PilFilter::Nearest;
    let data = if premul {
        let mut src = img.data.clone();
        premultiply(&mut src);
        let mut out = resize_samples(&src, src_size, c, dst_size, filter);
        unpremultiply(&mut out);
        out
    } else {
        resize_samples(&img.data, src_size, c, dst_size, filter)
    };
    Image::new(width, height, img.channels, data)
}

/// Resizes a single-channel 8-bit plane (Pillow mode "L", e.g. a mask) of `src_width` x
/// `src_height`, row-major, exactly as Pillow does.
pub fn resize_pil_luma(
    data: &[u8],
    src_width: u32,
    src_height: u32,
    width: u32,
    height: u32,
    filter: PilFilter,
) -> Result<Vec<u8>, ImageIoError> {
    let expected = (src_width as usize).checked_mul(src_height as usize);
    if src_width == 0 || src_height == 0 || expected != Some(data.len()) {
        return Err(ImageIoError::BadBuffer {
            width: src_width,
            height: src_height,
            channels: 1,
            len: data.len(),
        });
    }
    check_target(width, height)?;
    if (src_width, src_height) == (width, height) {
        return Ok(data.to_vec());
    }
    Ok(resize_samples(
        data,
        (src_width as usize, src_height as usize),
        1,
        (width as usize, height as usize),
        filter,
    ))
}
