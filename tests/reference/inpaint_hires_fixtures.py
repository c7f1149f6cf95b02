"""Golden fixtures for `--mask` inpainting and the `--hires` fix (tests/inpaint_hires.rs).

Run from the repository root (after sd_pipeline_fixtures.py):
    python3 tests/reference/inpaint_hires_fixtures.py

The runs use the tiny SD1 pipeline of tests/fixtures/sd_pipeline/sd1 (diffusers' UNet2DConditionModel,
AutoencoderKL and CLIPTextModel loaded from that folder) and a 9-input-channel inpainting UNet made from
it (the SD1 UNet with a wider conv_in), written as an original single-file checkpoint recipe
(`sd1_inpaint.single.*`: every tensor but conv_in is borrowed from the sd1 folder's files).

The sampling loop is written out with diffusers' modules because sd-cli's rules are the spec and differ
from diffusers' inpaint pipelines (docs/inpainting.md, REFERENCE-NOTES):
- the mask is rounded to 0/1 and reduced to latent size by block maximum; every step's denoised
  estimate is blended with the clean init latent outside it (diffusers' 4-channel inpaint pipeline
  blends the noisy latents with the init latent noised to the next timestep instead);
- inpainting UNets read [latent mask, latent of the init image with the masked pixels grey] after the
  latent, and blend too, with the latent mask widened by one latent pixel (diffusers does not blend);
- img2img starts from the init latent plus noise · sigma at every strength (diffusers starts from pure
  noise at strength 1) and keeps the last floor(strength · steps) + 1 steps;
- hires fix: both passes in one loop; the second samples floor(hires_steps / strength) scheduler steps
  and keeps the img2img tail, from the upscaled latent with fresh noise of the same seed; the upscalers
  are PyTorch's interpolate (bilinear, bicubic, nearest-exact: upstream's half-pixel rules) and
  upstream's Lanczos-3 on the decoded image, written out below.

Sampler: Euler on the scaled-linear DDPM table (sd-cli's `euler` + `discrete`; with 4 or 8 steps the
integer timesteps are where k-diffusion's log-sigma and diffusers' interpolation agree).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file
from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
from transformers import CLIPTextModel

sys.path.insert(0, os.path.dirname(__file__))
import ldm_layout  # noqa: E402
import sd_pipeline_fixtures as spf  # noqa: E402

SD1 = "tests/fixtures/sd_pipeline/sd1"
OUT = "tests/fixtures/inpaint_hires"
PROMPT = spf.PROMPT
NEGATIVE = spf.NEGATIVE
CFG, W, H = 5.0, 24, 16
SEED = 42


def load():
    unet = UNet2DConditionModel.from_pretrained(f"{SD1}/unet").eval()
    vae = AutoencoderKL.from_pretrained(f"{SD1}/vae").eval()
    te = CLIPTextModel.from_pretrained(f"{SD1}/text_encoder", torch_dtype=torch.float32).eval()
    tok = spf.tokenizer("<|endoftext|>")
    with torch.no_grad():
        def enc(text):
            ids = tok(text, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
            return te(ids).last_hidden_state
        ctx = (enc(PROMPT), enc(NEGATIVE))
    return unet, vae, ctx


def sigmas_for(steps):
    s = EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                               beta_schedule="scaled_linear", timestep_spacing="linspace",
                               interpolation_type="linear")
    s.set_timesteps(steps)
    return s.sigmas.tolist(), s.timesteps.tolist()


def img2img_tail(sigmas, timesteps, strength):
    steps = len(sigmas) - 1
    t_enc = min(int(strength * steps), steps - 1)
    start = steps - t_enc - 1
    return sigmas[start:], timesteps[start:]


def sample(unet, ctx, x0, sigmas, timesteps, concat=None, mask=None, init=None):
    """k-diffusion Euler with CFG; `mask` blends each denoised estimate with `init` (or zeros)."""
    x = x0
    cond, uncond = ctx
    for i, t in enumerate(timesteps):
        s = sigmas[i]
        xin = x / (s * s + 1) ** 0.5
        if concat is not None:
            xin = torch.cat([xin, concat], 1)
        with torch.no_grad():
            ec = unet(xin, t, encoder_hidden_states=cond).sample
            eu = unet(xin, t, encoder_hidden_states=uncond).sample
        eps = eu + CFG * (ec - eu)
        den = x - s * eps
        if mask is not None:
            keep = init if init is not None else torch.zeros_like(den)
            den = den * mask + keep * (1 - mask)
        x = x + (x - den) / s * (sigmas[i + 1] - s)
    return x


def encode(vae, img01):
    with torch.no_grad():
        return vae.encode(img01 * 2 - 1).latent_dist.mean * vae.config.scaling_factor


def decode(vae, z):
    with torch.no_grad():
        return (vae.decode(z / vae.config.scaling_factor).sample / 2 + 0.5).clamp(0, 1)


def noise(shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(SEED))


def to_chw(img):
    return img[0].float().contiguous()


def init_image():
    """A smooth 8-bit picture (saved as PNG; the runs read it back as bytes)."""
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    rgb = np.stack([0.5 + 0.4 * np.sin(xx / 4.0), 0.5 + 0.4 * np.cos(yy / 3.0), (xx + yy) / (W + H)], -1)
    px = (rgb.clip(0, 1) * 255).round().astype(np.uint8)
    Image.fromarray(px, "RGB").save(f"{OUT}/init.png")
    return torch.from_numpy(px.astype(np.float32) / 255).permute(2, 0, 1)[None]


def mask_image():
    """White (repaint) over a rectangle whose edges fall inside latent pixels, plus a lone grey-ish
    pixel that rounds to 1 (150) and one that rounds to 0 (120)."""
    m = np.zeros((H, W), np.uint8)
    m[3:10, 5:14] = 255
    m[12, 20] = 150
    m[1, 1] = 120
    Image.fromarray(m, "L").save(f"{OUT}/mask.png")
    return torch.from_numpy((m.astype(np.float32) / 255).round())[None, None]


def latent_mask(m, f):
    return F.max_pool2d(m, f)


def lanczos_resize(img, w, h):
    """Upstream's Lanczos-3 (normalised taps, clamped edges, half-pixel centres), separably."""
    def taps(n_in, n_out):
        scale = n_in / n_out
        mat = np.zeros((n_out, n_in))
        for o in range(n_out):
            c = (o + 0.5) * scale - 0.5
            idx = range(int(np.ceil(c - 3)), int(np.floor(c + 3)) + 1)
            ws = []
            for i in idx:
                x = abs(c - i)
                wgt = np.sinc(x) * np.sinc(x / 3) if x < 3 else 0.0
                ws.append((min(max(i, 0), n_in - 1), wgt))
            total = sum(wgt for _, wgt in ws)
            for i, wgt in ws:
                mat[o, i] += wgt / total
        return torch.from_numpy(mat).float()
    ty, tx = taps(img.shape[2], h), taps(img.shape[3], w)
    return torch.einsum("oh,bchw,pw->bcop", ty.double(), img.double(), tx.double()).float()


def inpaint_unet(unet):
    """The SD1 UNet with 9 input channels: its conv_in extended by 5 random channels."""
    cfg = dict(unet.config)
    cfg["in_channels"] = 9
    wide = UNet2DConditionModel.from_config(cfg).eval()
    sd = unet.state_dict()
    w = sd["conv_in.weight"]
    torch.manual_seed(11)
    extra = torch.randn(w.shape[0], 5, *w.shape[2:]) * w.std()
    sd["conv_in.weight"] = torch.cat([w, extra], 1)
    wide.load_state_dict(sd)
    return wide


def write_inpaint_single(unet, vae):
    """The inpainting model as an LDM single file (UNet + VAE + CLIP), as a borrow recipe."""
    te_sd = load_file(f"{SD1}/text_encoder/model.safetensors")
    single = {}
    single.update(ldm_layout.unet_to_ldm(unet.state_dict(), unet.config))
    single.update(ldm_layout.vae_to_ldm(vae.state_dict(), len(vae.config.block_out_channels)))
    single.update({"cond_stage_model.transformer." + k: v for k, v in te_sd.items()})
    sources = ["unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
               "text_encoder/model.safetensors"]
    pool = {}
    for rel in sources:
        for k, v in load_file(f"{SD1}/{rel}").items():
            pool.setdefault((v.dtype, v.numel(), v.flatten().float().numpy().tobytes()), (f"../sd_pipeline/sd1/{rel}", k))
    borrow, small = {}, {}
    for k, v in single.items():
        v = v.contiguous()
        hit = None
        for dtype in (v.dtype, torch.float16):
            key = (dtype, v.numel(), v.flatten().float().numpy().tobytes())
            if key in pool and (dtype == v.dtype or v.half().float().equal(v)):
                hit = pool[key]
                break
        if hit:
            borrow[k] = [hit[0], hit[1], list(v.shape)]
        else:
            small[k] = v
    save_file(small, f"{OUT}/sd1_inpaint.single.safetensors")
    with open(f"{OUT}/sd1_inpaint.single.borrow.json", "w") as f:
        json.dump(borrow, f, indent=0, sort_keys=True)
    print("inpaint single file:", len(borrow), "borrowed,", len(small), "written:", sorted(small))


def main():
    os.makedirs(OUT, exist_ok=True)
    unet, vae, ctx = load()
    f = 2 ** (len(vae.config.block_out_channels) - 1)
    lw, lh = W // f, H // f
    x_img = init_image()
    m_px = mask_image()
    m_lat = latent_mask(m_px, f)
    init = encode(vae, x_img)
    refs = {}

    # 1. SD1 img2img with a mask (strength 0.6 of 4 steps: the last 3).
    sig, ts = img2img_tail(*sigmas_for(4), 0.6)
    z = sample(unet, ctx, init + noise((1, 4, lh, lw)) * sig[0], sig, ts, mask=m_lat, init=init)
    refs["masked_latent"] = to_chw(z)
    refs["masked_image"] = to_chw(decode(vae, z))

    # 2. The same mask without an init image: upstream blends with an empty latent.
    sig, ts = sigmas_for(4)
    z = sample(unet, ctx, noise((1, 4, lh, lw)) * sig[0], sig, ts, mask=m_lat, init=None)
    refs["mask_only_image"] = to_chw(decode(vae, z))

    # 3. The inpainting UNet, strength 1 (whole schedule, from init + noise).
    wide = inpaint_unet(unet)
    write_inpaint_single(wide, vae)
    masked_px = (1 - m_px) * (x_img - 0.5) + 0.5
    concat = torch.cat([m_lat, encode(vae, masked_px)], 1)
    dilated = F.max_pool2d(m_lat, 3, stride=1, padding=1)
    sig, ts = sigmas_for(4)
    z = sample(wide, ctx, init + noise((1, 4, lh, lw)) * sig[0], sig, ts, concat=concat, mask=dilated, init=init)
    refs["inpaint_image"] = to_chw(decode(vae, z))
    refs["inpaint_concat"] = to_chw(concat)

    # 4. Hires fix from txt2img: 24x16 -> 48x32, hires steps 2 at strength 0.5 (4 scheduler steps, last 3).
    sig, ts = sigmas_for(4)
    base = sample(unet, ctx, noise((1, 4, lh, lw)) * sig[0], sig, ts)
    refs["hires_base_image"] = to_chw(decode(vae, base))
    hs, ht = img2img_tail(*sigmas_for(int(2 / 0.5)), 0.5)
    upscalers = {
        "latent": lambda z: F.interpolate(z, size=(2 * lh, 2 * lw), mode="bilinear", align_corners=False),
        "latent_bicubic": lambda z: F.interpolate(z, size=(2 * lh, 2 * lw), mode="bicubic", align_corners=False),
        "latent_nearest_exact": lambda z: F.interpolate(z, size=(2 * lh, 2 * lw), mode="nearest-exact"),
        "lanczos": lambda z: encode(vae, lanczos_resize(decode(vae, z), 2 * W, 2 * H).clamp(0, 1)),
    }
    for name, up in upscalers.items():
        start = up(base)
        z = sample(unet, ctx, start + noise((1, 4, 2 * lh, 2 * lw)) * hs[0], hs, ht)
        refs[f"hires_{name}_image"] = to_chw(decode(vae, z))
        print("hires", name, tuple(z.shape))

    # 5. Hires fix of a masked img2img run (the mask follows to the new size by nearest).
    sig, ts = img2img_tail(*sigmas_for(4), 0.6)
    z1 = sample(unet, ctx, init + noise((1, 4, lh, lw)) * sig[0], sig, ts, mask=m_lat, init=init)
    up = F.interpolate(z1, size=(2 * lh, 2 * lw), mode="bilinear", align_corners=False)
    m2 = F.interpolate(m_lat, size=(2 * lh, 2 * lw), mode="nearest")
    z = sample(unet, ctx, up + noise((1, 4, 2 * lh, 2 * lw)) * hs[0], hs, ht, mask=m2, init=up)
    refs["hires_masked_image"] = to_chw(decode(vae, z))

    # Resampling checks against PyTorch on a random latent (upscale and downscale).
    torch.manual_seed(5)
    src = torch.randn(1, 3, 5, 7)
    refs["resample_src"] = to_chw(src)
    for (h2, w2) in [(11, 16), (3, 4)]:
        refs[f"resample_bilinear_{w2}x{h2}"] = to_chw(F.interpolate(src, size=(h2, w2), mode="bilinear", align_corners=False))
        refs[f"resample_bicubic_{w2}x{h2}"] = to_chw(F.interpolate(src, size=(h2, w2), mode="bicubic", align_corners=False))
        refs[f"resample_nearest_{w2}x{h2}"] = to_chw(F.interpolate(src, size=(h2, w2), mode="nearest"))
        refs[f"resample_nearest_exact_{w2}x{h2}"] = to_chw(F.interpolate(src, size=(h2, w2), mode="nearest-exact"))
    refs["resample_lanczos_16x11"] = to_chw(lanczos_resize(src, 16, 11))
    refs["mask_latent"] = to_chw(m_lat)
    save_file(refs, f"{OUT}/reference.safetensors")
    for k, v in refs.items():
        if k.endswith("image"):
            print(k, tuple(v.shape), float(v.min()), float(v.max()), "saturated", float(((v <= 0) | (v >= 1)).float().mean()))


if __name__ == "__main__":
    main()
