#!/usr/bin/env python3
"""Writes small PNG fixtures (every colour type / bit depth we normalise, plus text chunks)
and the pixels PIL decodes from them, for tests/image_io.rs.

Re-runnable: python3 tests/reference/image_io_fixtures.py
Expected pixels are PIL's conversion to RGB/RGBA 8-bit; for 16-bit inputs PIL's
conversion drops the low byte only in "I;16" -> we compute the high byte ourselves
(value >> 8), which is what a 16->8 strip means.
"""
import json
import os
import zlib
import struct

import numpy as np
from PIL import Image, PngImagePlugin

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "image_io")
os.makedirs(OUT, exist_ok=True)

rng = np.random.default_rng(1234)
W, H = 7, 5  # odd sizes exercise row padding of sub-byte depths
expected = {}


def save(name, img, expect, **kw):
    path = os.path.join(OUT, name)
    img.save(path, **kw)
    expected[name] = {
        "width": W,
        "height": H,
        "channels": expect.shape[-1],
        "pixels": expect.reshape(-1).astype(int).tolist(),
    }


rgb = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
save("rgb8.png", Image.fromarray(rgb, "RGB"), rgb)

rgba = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
save("rgba8.png", Image.fromarray(rgba, "RGBA"), rgba)

gray = rng.integers(0, 256, (H, W), dtype=np.uint8)
save("gray8.png", Image.fromarray(gray, "L"), np.stack([gray] * 3, -1))

la = rng.integers(0, 256, (H, W, 2), dtype=np.uint8)
save("gray_alpha8.png", Image.fromarray(la, "LA"),
     np.stack([la[..., 0]] * 3 + [la[..., 1]], -1))

# 1-bit gray: PIL "1" mode writes bit depth 1; values expand to 0/255.
bw = rng.integers(0, 2, (H, W), dtype=np.uint8) * 255
save("gray1.png", Image.fromarray(bw, "L").convert("1"), np.stack([bw] * 3, -1))

# Palette without transparency.
pal_idx = rng.integers(0, 4, (H, W), dtype=np.uint8)
palette = [10, 20, 30, 200, 100, 50, 0, 255, 0, 255, 255, 255]
p = Image.fromarray(pal_idx, "P")
p.putpalette(palette)
pal_rgb = np.array(palette, dtype=np.uint8).reshape(-1, 3)[pal_idx]
save("palette.png", p, pal_rgb)

# Palette with a tRNS entry -> RGBA.
pt = Image.fromarray(pal_idx, "P")
pt.putpalette(palette)
alpha = np.array([255, 0, 128, 255], dtype=np.uint8)[pal_idx]
save("palette_trns.png", pt, np.concatenate([pal_rgb, alpha[..., None]], -1),
     transparency=bytes([255, 0, 128, 255]))


# 16-bit RGB written by hand (PIL cannot write 16-bit RGB PNGs).
def chunk(kind, body):
    c = struct.pack(">I", len(body)) + kind + body
    return c + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


rgb16 = rng.integers(0, 65536, (H, W, 3), dtype=np.uint16)
raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(H))
png16 = (b"\x89PNG\r\n\x1a\n"
         + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 16, 2, 0, 0, 0))
         + chunk(b"IDAT", zlib.compress(raw))
         + chunk(b"IEND", b""))
with open(os.path.join(OUT, "rgb16.png"), "wb") as f:
    f.write(png16)
expected["rgb16.png"] = {"width": W, "height": H, "channels": 3,
                         "pixels": (rgb16 >> 8).reshape(-1).astype(int).tolist()}

# Text chunks of all three kinds, written by PIL, in a known order.
info = PngImagePlugin.PngInfo()
info.add_text("parameters", "a cat\nSteps: 20, Seed: 42")
info.add_text("Comment", "zipped " * 20, zip=True)                 # zTXt
info.add_itxt("Title", "caf\u00e9 \u732b", lang="en", tkey="T")    # iTXt, uncompressed
info.add_itxt("Zipped", "\u732b" * 50, zip=True)                  # iTXt, compressed
Image.fromarray(rgb, "RGB").save(os.path.join(OUT, "text_chunks.png"), pnginfo=info)
expected_text = [
    ["tEXt", "parameters", "a cat\nSteps: 20, Seed: 42"],
    ["zTXt", "Comment", "zipped " * 20],
    ["iTXt", "Title", "caf\u00e9 \u732b"],
    ["iTXt", "Zipped", "\u732b" * 50],
]

with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump({"images": expected, "text_chunks": expected_text}, f)
print("wrote", sorted(os.listdir(OUT)))
