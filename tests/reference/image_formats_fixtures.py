#!/usr/bin/env python3
"""Small JPEG / WebP / BMP fixtures for tests/image_formats.rs, written with Pillow.

Run from the repository root:  python3 tests/reference/image_formats_fixtures.py

  upright.png        a 12x8 RGB picture (the pixels every other file shows)
  photo.bmp          the same pixels as BMP
  rot6.webp          lossless WebP stored rotated 90 degrees counter-clockwise with EXIF
                     orientation 6: shown upright it is upright.png, exactly
  rot6.jpg           the same as a JPEG (quality 95, 4:4:4); rot6_pil.png is what Pillow shows
                     (decoded, `ImageOps.exif_transpose`): JPEG decoders agree only to a few levels
  rgba.webp          a lossless RGBA WebP; rgba.png the same pixels
  a1111.jpg          a JPEG whose EXIF UserComment holds generation parameters the way A1111
                     writes them (piexif: big-endian, `UNICODE\\0` + UTF-16BE); a1111.txt the text
"""
import os

import numpy as np
from PIL import Image, ImageOps

OUT = "tests/fixtures/image_formats"
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(7)
W, H = 12, 8

# Smooth ramps plus noise: JPEG keeps it close, and any rotation is visible.
y, x = np.mgrid[0:H, 0:W]
base = np.stack([x * 20, y * 30, (x + y) * 10], -1) + rng.integers(0, 20, (H, W, 3))
upright = Image.fromarray(base.clip(0, 255).astype(np.uint8), "RGB")
upright.save(f"{OUT}/upright.png")
upright.save(f"{OUT}/photo.bmp")

stored = upright.transpose(Image.Transpose.ROTATE_90)  # counter-clockwise
exif = Image.Exif()
exif[0x0112] = 6
stored.save(f"{OUT}/rot6.webp", lossless=True, exif=exif.tobytes())
stored.save(f"{OUT}/rot6.jpg", quality=95, subsampling=0, exif=exif.tobytes())
for name in ("rot6.webp", "rot6.jpg"):
    shown = ImageOps.exif_transpose(Image.open(f"{OUT}/{name}")).convert("RGB")
    assert shown.size == (W, H), (name, shown.size)
    if name.endswith("webp"):
        assert np.array_equal(np.asarray(shown), np.asarray(upright)), name
    else:
        shown.save(f"{OUT}/rot6_pil.png")

rgba = np.concatenate([base.clip(0, 255).astype(np.uint8),
                       rng.integers(0, 256, (H, W, 1)).astype(np.uint8)], -1)
Image.fromarray(rgba, "RGBA").save(f"{OUT}/rgba.png")
Image.fromarray(rgba, "RGBA").save(f"{OUT}/rgba.webp", lossless=True, exact=True)

text = "a lovely cat <lora:x:0.8>, caf\u00e9 \u732b\nNegative prompt: blurry\nSteps: 20, Seed: 42"
exif = Image.Exif()
exif.get_ifd(0x8769)[0x9286] = b"UNICODE\0" + text.encode("utf-16-be")
upright.save(f"{OUT}/a1111.jpg", quality=90, exif=exif.tobytes())
with open(f"{OUT}/a1111.txt", "w", encoding="utf-8") as f:
    f.write(text)
print("wrote", sorted(os.listdir(OUT)))
