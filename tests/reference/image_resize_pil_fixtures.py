#!/usr/bin/env python3
"""Pillow resize fixtures for tests/image_resize_pil.rs.

Re-runnable from the repo root: python3 tests/reference/image_resize_pil_fixtures.py

Writes tests/fixtures/image_resize_pil/:
- sources.bin: small source images (RGB, RGBA with alpha 0/255/varied, L, 1-pixel sides),
  raw interleaved bytes, concatenated.
- outputs.bin: Pillow's `Image.resize(size, filter)` of each source to each target size with
  each filter, raw bytes, concatenated.
- manifest.json: offsets and sizes of both, plus "hashed" cases: larger images built from a
  formula both sides compute (see `pattern`), whose Pillow output is stored only as an
  FNV-1a 64 hash and byte sum (no pixels in the repo).
"""
import json
import os

import numpy as np
import PIL
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "image_resize_pil")
os.makedirs(OUT, exist_ok=True)

FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "box": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "hamming": Image.Resampling.HAMMING,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
CHANNELS = {"RGB": 3, "RGBA": 4, "L": 1}

rng = np.random.default_rng(2024)


def noisy(h, w, c):
    """Half smooth gradient, half noise: exercises both plain interpolation and clipping."""
    y, x = np.mgrid[0:h, 0:w]
    grad = np.stack([(x * 255 // max(w - 1, 1) + 40 * k) % 256 for k in range(c)], -1)
    grad = (grad + 0 * y[..., None]).astype(np.uint8)
    noise = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
    mask = ((x // 4 + y // 3) % 2 == 0)[..., None]
    return np.where(mask, noise, grad).astype(np.uint8)


def with_alpha(img):
    """Replaces the last channel with alpha: blocks of 0 and 255 and varied values."""
    h, w, _ = img.shape
    a = rng.integers(0, 256, (h, w), dtype=np.uint8)
    y, x = np.mgrid[0:h, 0:w]
    a[(x + y) % 5 == 0] = 0
    a[(x + 2 * y) % 7 == 0] = 255
    a[: h // 3, : w // 3] = 0
    a[h // 2 :, w // 2 :] = 255
    img = img.copy()
    img[..., 3] = a
    return img


sources = {
    "rgb_31x23": ("RGB", noisy(23, 31, 3)),
    "rgb_17x26": ("RGB", noisy(26, 17, 3)),
    "rgba_25x21": ("RGBA", with_alpha(noisy(21, 25, 4))),
    "rgba_16x9": ("RGBA", with_alpha(noisy(9, 16, 4))),
    "l_19x11": ("L", noisy(11, 19, 1)),
    "rgb_1x1": ("RGB", noisy(1, 1, 3)),
    "rgb_13x1": ("RGB", noisy(1, 13, 3)),
    "rgba_1x17": ("RGBA", with_alpha(noisy(17, 1, 4))),
}


def targets(w, h):
    """Down/up by non-integer factors, mixed, one side kept, same size, 1-pixel sides."""
    t = {
        (max(1, w * 3 // 7), max(1, h * 5 // 11)),  # down ~0.43
        (max(1, w * 2 // 3), max(1, h * 4 // 5)),  # down ~0.7
        (w * 7 // 4 + 1, h * 3 // 2 + 1),  # up ~1.75 / 1.5
        (w * 9 // 4, h * 11 // 5),  # up ~2.2
        (w * 3 // 2 + 1, max(1, h // 2)),  # mixed
        (max(1, w // 3), h * 2 + 1),  # mixed the other way
        (w, max(1, h * 3 // 4)),  # vertical pass only
        (w * 4 // 3 + 1, h),  # horizontal pass only
        (w, h),  # copy
        (1, 1),
        (1, h + 3),
        (w + 2, 1),
        (3 * w, 2),  # integer factor
    }
    return sorted(t)


src_blob = bytearray()
out_blob = bytearray()
manifest = {"pillow": PIL.__version__, "sources": {}, "cases": [], "hashed": []}

for name, (mode, arr) in sources.items():
    h, w = arr.shape[:2]
    data = arr.reshape(-1).tobytes()
    manifest["sources"][name] = {
        "mode": mode,
        "width": w,
        "height": h,
        "offset": len(src_blob),
        "len": len(data),
    }
    src_blob += data
    img = Image.fromarray(arr[..., 0] if mode == "L" else arr, mode)
    for tw, th in targets(w, h):
        for fname, f in FILTERS.items():
            out = np.asarray(img.resize((tw, th), f)).reshape(-1).tobytes()
            assert len(out) == tw * th * CHANNELS[mode]
            manifest["cases"].append(
                {
                    "source": name,
                    "filter": fname,
                    "width": tw,
                    "height": th,
                    "offset": len(out_blob),
                    "len": len(out),
                }
            )
            out_blob += out


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def pattern(w, h, c):
    """Deterministic test image (same formula in tests/image_resize_pil.rs): checkerboard of
    32-pixel tiles alternating hashed noise and a wrapping ramp; for 4 channels alpha is 0 in
    a band, 255 in another and hashed elsewhere."""
    y, x = np.mgrid[0:h, 0:w].astype(np.uint64)
    out = np.zeros((h, w, c), dtype=np.uint8)
    for k in range(c):
        v = (x * np.uint64(2654435761)) ^ (y * np.uint64(40503)) ^ np.uint64(k * 97 + 1)
        v &= np.uint64(0xFFFFFFFF)
        v = ((v ^ (v >> np.uint64(13))) * np.uint64(1274126177)) & np.uint64(0xFFFFFFFF)
        noise = (v >> np.uint64(24)).astype(np.uint8)
        ramp = ((x * np.uint64(3) + y * np.uint64(5) + np.uint64(k * 40)) % np.uint64(256)).astype(np.uint8)
        tile = ((x // np.uint64(32) + y // np.uint64(32)) % np.uint64(2)) == 0
        out[..., k] = np.where(tile, noise, ramp)
    if c == 4:
        a = out[..., 3]
        a[(y % np.uint64(64)) < np.uint64(10)] = 0
        a[(x % np.uint64(50)) < np.uint64(8)] = 255
    return out


HASHED = [
    # (mode, src w, src h, dst w, dst h, filter): sizes like edit reference images.
    ("RGB", 512, 384, 731, 548, "lanczos"),
    ("RGB", 512, 384, 300, 211, "lanczos"),
    ("RGB", 512, 384, 449, 613, "bicubic"),
    ("RGB", 384, 512, 252, 336, "bicubic"),
    ("RGBA", 400, 300, 573, 417, "lanczos"),
    ("RGBA", 400, 300, 173, 129, "bicubic"),
    ("RGB", 300, 200, 1024, 683, "bilinear"),
    ("RGB", 640, 480, 97, 61, "nearest"),
    # Pass order (Pillow 13): height shrinks by 41 > 2 * 20 pixels -> vertical first ...
    ("RGB", 400, 300, 380, 259, "lanczos"),
    # ... by exactly 2 * 20 -> horizontal first.
    ("RGB", 400, 300, 380, 260, "lanczos"),
    ("RGBA", 300, 400, 320, 250, "bicubic"),
    ("RGB", 512, 384, 504, 392, "bicubic"),
]
for mode, w, h, tw, th, fname in HASHED:
    arr = pattern(w, h, CHANNELS[mode])
    out = np.asarray(Image.fromarray(arr, mode).resize((tw, th), FILTERS[fname])).reshape(-1).tobytes()
    manifest["hashed"].append(
        {
            "mode": mode,
            "src_width": w,
            "src_height": h,
            "width": tw,
            "height": th,
            "filter": fname,
            "fnv1a64": f"{fnv1a64(out):016x}",
            "sum": int(np.frombuffer(out, np.uint8).sum(dtype=np.uint64)),
        }
    )

with open(os.path.join(OUT, "sources.bin"), "wb") as f:
    f.write(src_blob)
with open(os.path.join(OUT, "outputs.bin"), "wb") as f:
    f.write(out_blob)
with open(os.path.join(OUT, "manifest.json"), "w") as f:
    json.dump(manifest, f, separators=(",", ":"))
print(
    f"{len(manifest['cases'])} cases, {len(manifest['hashed'])} hashed; "
    f"sources {len(src_blob)} B, outputs {len(out_blob)} B"
)
