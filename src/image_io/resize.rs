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
