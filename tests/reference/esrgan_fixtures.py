"""Golden fixtures for ESRGAN upscaling (tests/esrgan.rs).

Run from the repository root:  python3 tests/reference/esrgan_fixtures.py

BasicSR's RRDBNet (basicsr/archs/rrdbnet_arch.py, the network of Real-ESRGAN x4plus and
x4plus-anime-6B), written out here in PyTorch with its tensor names (BasicSR is not on PyPI
for this torch), on tiny random weights:

  x4.safetensors   scale 4: 8 features, growth 4, 2 RRDBs
  x4.pth           the same as Real-ESRGAN ships it: torch.save({"params_ema": state_dict})
  x2.safetensors   scale 2: 8 features, growth 4, 1 RRDB
  x2_shallow.safetensors  scale 2 without RRDBs (a small receptive field, for tiling)
  input.png        a 20x14 RGB input
  reference.safetensors   outputs [3, H, W] in [0, 1] (not clamped):
      x4           x4 on input.png
      x2_twice     x2 on input.png, rounded to 8 bits, x2 again (--upscale-repeats 2)
      x2_shallow   x2_shallow on input.png
      sd1_x2       x2 on tests/fixtures/sd_pipeline/sd1's reference picture as 8-bit pixels
"""
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file

OUT = "tests/fixtures/esrgan"


class RDB(nn.Module):
    def __init__(self, f, g):
        super().__init__()
        self.conv1 = nn.Conv2d(f, g, 3, 1, 1)
        self.conv2 = nn.Conv2d(f + g, g, 3, 1, 1)
        self.conv3 = nn.Conv2d(f + 2 * g, g, 3, 1, 1)
        self.conv4 = nn.Conv2d(f + 3 * g, g, 3, 1, 1)
        self.conv5 = nn.Conv2d(f + 4 * g, f, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(0.2)

    def forward(self, x):
        x1 = self.lrelu(self.conv1(x))
        x2 = self.lrelu(self.conv2(torch.cat((x, x1), 1)))
        x3 = self.lrelu(self.conv3(torch.cat((x, x1, x2), 1)))
        x4 = self.lrelu(self.conv4(torch.cat((x, x1, x2, x3), 1)))
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        return x5 * 0.2 + x


class RRDB(nn.Module):
    def __init__(self, f, g):
        super().__init__()
        self.rdb1, self.rdb2, self.rdb3 = RDB(f, g), RDB(f, g), RDB(f, g)

    def forward(self, x):
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    def __init__(self, scale, f, g, blocks):
        super().__init__()
        self.scale = scale
        self.conv_first = nn.Conv2d(3, f, 3, 1, 1)
        self.body = nn.Sequential(*[RRDB(f, g) for _ in range(blocks)])
        self.conv_body = nn.Conv2d(f, f, 3, 1, 1)
        if scale >= 2:
            self.conv_up1 = nn.Conv2d(f, f, 3, 1, 1)
        if scale == 4:
            self.conv_up2 = nn.Conv2d(f, f, 3, 1, 1)
        self.conv_hr = nn.Conv2d(f, f, 3, 1, 1)
        self.conv_last = nn.Conv2d(f, 3, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(0.2)

    def forward(self, x):
        feat = self.conv_first(x)
        feat = feat + self.conv_body(self.body(feat))
        if self.scale >= 2:
            feat = self.lrelu(self.conv_up1(F.interpolate(feat, scale_factor=2, mode="nearest")))
        if self.scale == 4:
            feat = self.lrelu(self.conv_up2(F.interpolate(feat, scale_factor=2, mode="nearest")))
        return self.conv_last(self.lrelu(self.conv_hr(feat)))


def model(seed, scale, blocks):
    torch.manual_seed(seed)
    m = RRDBNet(scale, 8, 4, blocks).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.02)
            else:
                p.copy_(torch.randn_like(p) * 0.6 / p[0].numel() ** 0.5)
        # Outputs around 0.5 with a spread of ~0.12 (visible in 8 bits, rarely clamped).
        m.conv_last.bias.fill_(0.5)
        probe = m(torch.rand(1, 3, 12, 12, generator=torch.Generator().manual_seed(seed)))
        m.conv_last.weight.mul_(0.12 / float((probe - 0.5).std()))
    return m


def chw(img_u8):
    return torch.from_numpy(img_u8).float().permute(2, 0, 1)[None] / 255.0


def eight_bit(t):
    return torch.round(t.clamp(0, 1) * 255) / 255


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:14, 0:20]
    img = np.stack([x * 12, y * 17, (x + y) * 7], -1) + rng.integers(0, 30, (14, 20, 3))
    img = img.clip(0, 255).astype(np.uint8)
    Image.fromarray(img, "RGB").save(f"{OUT}/input.png")
    x4, x2, shallow = model(1, 4, 2), model(2, 2, 1), model(3, 2, 0)
    save_file({k: v.contiguous() for k, v in x4.state_dict().items()}, f"{OUT}/x4.safetensors")
    torch.save({"params_ema": x4.state_dict()}, f"{OUT}/x4.pth")
    save_file({k: v.contiguous() for k, v in x2.state_dict().items()}, f"{OUT}/x2.safetensors")
    save_file({k: v.contiguous() for k, v in shallow.state_dict().items()}, f"{OUT}/x2_shallow.safetensors")
    sd1 = load_file("tests/fixtures/sd_pipeline/sd1/reference.safetensors")["image"][None]
    with torch.no_grad():
        inp = chw(img)
        refs = {
            "x4": x4(inp)[0],
            "x2_twice": x2(eight_bit(x2(inp)))[0],
            "x2_shallow": shallow(inp)[0],
            "sd1_x2": x2(eight_bit(sd1))[0],
        }
    for k, v in refs.items():
        print(k, tuple(v.shape), float(v.min()), float(v.max()),
              "saturated", float(((v <= 0) | (v >= 1)).float().mean()))
    save_file({k: v.contiguous() for k, v in refs.items()}, f"{OUT}/reference.safetensors")
