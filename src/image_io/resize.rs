//! Bilinear resizing of 8-bit images (init images whose size differs from `-W`/`-H`).

use super::Image;

/// Resizes with bilinear filtering, sampling at pixel centres (half-pixel convention).
pub fn resize_bilinear(img: &Image, width: u32, height: u32) -> Image {
    if img.width == width && img.height == height {
        return img.clone();
    }
    let c = img.channels.count();
    let (sw, sh) = (img.width as usize, img.height as usize);
    let (dw, dh) = (width as usize, height as usize);
    let sx = sw as f32 / dw as f32;
    let sy = sh as f32 / dh as f32;
    let mut data = vec![0u8; dw * dh * c];
    for y in 0..dh {
        let fy = ((y as f32 + 0.5) * sy - 0.5).clamp(0.0, (sh - 1) as f32);
        let (y0, wy) = (fy.floor() as usize, fy - fy.floor());
        let y1 = (y0 + 1).min(sh - 1);
        for x in 0..dw {
            let fx = ((x as f32 + 0.5) * sx - 0.5).clamp(0.0, (sw - 1) as f32);
            let (x0, wx) = (fx.floor() as usize, fx - fx.floor());
            let x1 = (x0 + 1).min(sw - 1);
            for ch in 0..c {
                let p = |xx: usize, yy: usize| img.data[(yy * sw + xx) * c + ch] as f32;
                let top = p(x0, y0) * (1.0 - wx) + p(x1, y0) * wx;
                let bottom = p(x0, y1) * (1.0 - wx) + p(x1, y1) * wx;
                data[(y * dw + x) * c + ch] =
                    (top * (1.0 - wy) + bottom * wy).round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    Image {
        width,
        height,
        channels: img.channels,
        data,
    }
}

/// Nearest-neighbour resize with upstream's integer rule: output pixel `o` reads input
/// `o · in / out` (rounded down) on each axis.
pub fn resize_nearest(img: &Image, width: u32, height: u32) -> Image {
    if img.width == width && img.height == height {
        return img.clone();
    }
    let c = img.channels.count();
    let (sw, sh) = (img.width as usize, img.height as usize);
    let (dw, dh) = (width as usize, height as usize);
    let mut data = Vec::with_capacity(dw * dh * c);
    for y in 0..dh {
        let sy = y * sh / dh;
        for x in 0..dw {
            let sx = x * sw / dw;
            let at = (sy * sw + sx) * c;
            data.extend_from_slice(&img.data[at..at + c]);
        }
    }
    Image {
        width,
        height,
        channels: img.channels,
        data,
    }
}

/// `img` centre-cropped to the aspect ratio of `width × height` with upstream's integer
/// arithmetic (the wider side is cut to `(int)(other · aspect)`); unchanged when it already
/// has that ratio.
pub fn crop_to_aspect(img: &Image, width: usize, height: usize) -> Image {
    let (sw, sh) = (img.width as usize, img.height as usize);
    let dst = width as f32 / height as f32;
    let src = sw as f32 / sh as f32;
    let (cw, ch) = if src > dst {
        ((sh as f32 * dst) as usize, sh)
    } else if src < dst {
        (sw, (sw as f32 / dst) as usize)
    } else {
        (sw, sh)
    };
    let (cw, ch) = (cw.clamp(1, sw), ch.clamp(1, sh));
    if (cw, ch) == (sw, sh) {
        return img.clone();
    }
    let c = img.channels.count();
    let (x0, y0) = ((sw - cw) / 2, (sh - ch) / 2);
    let mut data = Vec::with_capacity(cw * ch * c);
    for y in y0..y0 + ch {
        let row = (y * sw + x0) * c;
        data.extend_from_slice(&img.data[row..row + cw * c]);
    }
    Image {
        width: cw as u32,
        height: ch as u32,
        channels: img.channels,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image_io::Channels;

    fn ramp(w: u32, h: u32) -> Image {
        Image {
            width: w,
            height: h,
            channels: Channels::Rgb,
            data: (0..w * h).flat_map(|i| [i as u8; 3]).collect(),
        }
    }

    fn reds(img: &Image) -> Vec<u8> {
        img.data.iter().step_by(3).copied().collect()
    }

    #[test]
    fn nearest_reads_the_floor_of_the_scaled_index() {
        let out = resize_nearest(&ramp(4, 2), 2, 1);
        assert_eq!(reds(&out), vec![0, 2]);
        let up = resize_nearest(&ramp(2, 1), 4, 1);
        assert_eq!(reds(&up), vec![0, 0, 1, 1]);
    }

    #[test]
    fn crop_keeps_the_centre_at_the_target_aspect() {
        let out = crop_to_aspect(&ramp(6, 2), 2, 2);
        assert_eq!((out.width, out.height), (2, 2));
        assert_eq!(reds(&out), vec![2, 3, 8, 9]);
        let same = crop_to_aspect(&ramp(4, 2), 8, 4);
        assert_eq!(same.data, ramp(4, 2).data);
    }
}
