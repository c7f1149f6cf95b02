#!/usr/bin/env python3
"""Reference tile grids for sd-cli's VAE tiling (tests/vae_tiling.rs).

An independent Python model of upstream stable-diffusion.cpp's tile planning
(VAE::get_tile_sizes in src/model/vae/vae.hpp after commit 8d11c3f, sd_tiling_calc_tiles
and the origin walk of process_tiles_2d in src/core/ggml_extend.hpp), written from the
C++ semantics: C int division/modulo truncate toward zero, `int * float` products are
float32, the relative-size formula runs in double.

Also the decode OOM retry sequence (prepare_vae_decode_retry_tiling in
src/core/backend_fit.cpp).

Run: python3 tests/reference/vae_tiling_fixtures.py   (writes tests/fixtures/vae_tiling/)
"""
import json
import math
import os
import random

import numpy as np

F32 = np.float32
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "vae_tiling")


def c_div(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def c_mod(a, b):
    return a - b * c_div(a, b)


def get_tile_size(requested, factor, latent, scale, overlap):
    """One axis of get_tile_sizes; returns latent tile size or None for an error."""
    if requested < 0 or not math.isfinite(factor) or factor < 0.0:
        return None
    min_dim = min(4, latent)
    size = float(c_div(requested if requested > 0 else 256, scale))
    if factor > 0.0:
        if factor > 1.0:
            factor = 1.0 / (factor * (1.0 - float(overlap)) + float(overlap))
        size = math.floor(float(latent) * factor)
    if size < min_dim and (requested > 0 or factor > 0.0):
        return None
    return int(min(float(latent), max(float(min_dim), size)))


def calc_tiles(small, tile, overlap):
    """sd_tiling_calc_tiles, non-circular; returns (num, float32 overlap factor)."""
    ov = int(F32(tile) * F32(overlap))
    non = tile - ov
    num = c_div(small - ov, non)
    overshoot = c_mod((num + 1) * non + ov, small)
    if overshoot != non and overshoot <= num * (c_div(tile, 2) - ov):
        num += 1
    if num <= 2:
        if small <= tile:
            return 1, F32(0.0)
        return 2, F32(2 * tile - small) / F32(tile)
    return num, F32(tile * num - small) / F32(tile * (num - 1))


def origins(small, tile, factor):
    ov = int(F32(tile) * F32(factor))
    step = tile - ov
    out = []
    y = 0
    while y < small:
        if y + tile >= small:
            out.append(small - tile)
            break
        out.append(y)
        y += step
    return out


def plan(img_w, img_h, scale, tw, th, rel, overlap):
    lw, lh = img_w // scale, img_h // scale
    if lw <= 0 or lh <= 0 or not math.isfinite(float(overlap)):
        return None
    ov = F32(min(max(float(overlap), 0.0), 0.5))
    rw, rh = rel if rel is not None else (0.0, 0.0)
    sw = get_tile_size(tw, float(F32(rw)), lw, scale, ov)
    sh = get_tile_size(th, float(F32(rh)), lh, scale, ov)
    if sw is None or sh is None:
        return None
    nx, fx = calc_tiles(lw, sw, ov)
    ny, fy = calc_tiles(lh, sh, ov)
    return {
        "tile_w": sw,
        "tile_h": sh,
        "overlap": float(ov),
        "factor_x": float(fx),
        "factor_y": float(fy),
        "calc_nx": nx,
        "calc_ny": ny,
        "origins_x": origins(lw, sw, fx),
        "origins_y": origins(lh, sh, fy),
    }


def retry_sequence(lw, lh, scale, tiled_tile):
    """Tile sizes (latent) tried by the decode retry loop when every run fails."""
    enabled = tiled_tile is not None
    cur = tiled_tile if enabled else (lw, lh)
    seq = [list(cur)]
    while True:
        def smaller(size):
            nxt = size // 2
            if not enabled:
                nxt = min(nxt, 256 // scale)
            return min(size, max(4, nxt))

        nxt = (smaller(cur[0]), smaller(cur[1]))
        if nxt == tuple(cur):
            return seq
        enabled = True
        cur = nxt
        seq.append(list(cur))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1234)
    scales = [8, 16, 32]
    images = [(512, 512), (768, 512), (1024, 1024), (1024, 576), (832, 1216), (640, 360),
              (64, 64), (200, 136), (2048, 2048), (1536, 640), (256, 256), (96, 96), (24, 24),
              (520, 1000), (333, 777), (4096, 256)]
    tiles = [(0, 0), (256, 256), (512, 256), (128, 384), (64, 64), (32, 32), (16, 16), (8, 8),
             (100, 300), (1000, 1000), (0, 128), (40, 48)]
    overlaps = [0.5, 0.0, 0.25, 0.7, -0.1, 0.33, 0.125, 0.45]
    rels = [None, (0.5, 0.5), (0.25, 1.0), (3.0, 2.0), (4.5, 1.5), (0.01, 0.01), (2.0, 5.0),
            (0.3, 0.0), (1.0001, 7.0), (0.1, 0.9)]

    cases = []
    # Full cross of scale x image x tile size at the default overlap, no relative size.
    for s in scales:
        for (w, h) in images:
            for (tw, th) in tiles:
                cases.append((w, h, s, tw, th, None, 0.5))
    # Every overlap and relative size on a few images.
    for s in scales:
        for (w, h) in [(512, 512), (1024, 576), (333, 777), (2048, 2048)]:
            for ov in overlaps:
                for rel in rels:
                    cases.append((w, h, s, 256, 256, rel, ov))
    # Random extras.
    for _ in range(600):
        s = rng.choice(scales)
        w = rng.randint(1, 2600)
        h = rng.randint(1, 2600)
        tw = rng.choice([0, rng.randint(1, 1200)])
        th = rng.choice([0, rng.randint(1, 1200)])
        rel = rng.choice([None, None, (round(rng.uniform(0.01, 1.0), 3), round(rng.uniform(0.01, 1.0), 3)),
                          (round(rng.uniform(1.0, 9.0), 2), round(rng.uniform(1.0, 9.0), 2))])
        ov = round(rng.uniform(-0.1, 0.8), 3)
        cases.append((w, h, s, tw, th, rel, ov))

    out = []
    for (w, h, s, tw, th, rel, ov) in cases:
        ov32 = float(F32(ov))
        rel32 = None if rel is None else [float(F32(rel[0])), float(F32(rel[1]))]
        out.append({
            "image": [w, h], "scale": s, "tile_px": [tw, th], "relative": rel32, "overlap": ov32,
            "expect": plan(w, h, s, tw, th, rel32, ov32),
        })

    retries = []
    for s in scales:
        for (w, h) in images:
            lw, lh = w // s, h // s
            if lw == 0 or lh == 0:
                continue
            retries.append({"image": [w, h], "scale": s, "tiled_px": None,
                            "sequence": retry_sequence(lw, lh, s, None)})
            for (tw, th) in [(256, 256), (512, 512), (1024, 384)]:
                p = plan(w, h, s, tw, th, None, 0.5)
                if p is None:
                    continue
                retries.append({"image": [w, h], "scale": s, "tiled_px": [tw, th],
                                "sequence": retry_sequence(lw, lh, s, (p["tile_w"], p["tile_h"]))})

    with open(os.path.join(OUT, "grids.json"), "w") as f:
        json.dump({"cases": out, "retries": retries}, f, separators=(",", ":"))
    n_err = sum(1 for c in out if c["expect"] is None)
    print(f"wrote {len(out)} grid cases ({n_err} errors), {len(retries)} retry sequences")


if __name__ == "__main__":
    main()
