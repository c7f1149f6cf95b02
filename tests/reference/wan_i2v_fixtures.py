"""Golden fixtures for Wan 2.1 image-to-video and first/last-frame video (tests/wan_i2v_pipeline.rs).

Run from the repository root (after wan_pipeline_fixtures.py, whose text encoder and VAE it reuses):
    python3 tests/reference/wan_i2v_fixtures.py

The video is 32x32 and the tiny CLIP vision tower reads 32x32 images, so neither the VAE's copy of the
init image nor the tower's is resized: diffusers' processors (bicubic) and sd-cli's (upstream's
resizes) then agree exactly.

Writes tests/fixtures/wan_i2v/:
  i2v/                   a tiny WanTransformer3DModel with the image branch (36 input channels: latent,
                         4 mask channels, 16 condition channels; CLIP width 24 through `img_emb`)
  flf2v/                 the same with the first/last-frame position table (pos_embed_seq_len 2 x 65)
  concat_only/           36 input channels and no image branch (Wan 2.2 I2V-A14B style)
  moe_high/              another such transformer: the high-noise expert of the `moe` run
  ti2v/                  a 6-channel transformer for the tiny Wan 2.2 VAE (tests/fixtures/wan22_vae/diffusers)
  image_encoder/         a tiny transformers CLIPVisionModel (hidden 24, 3 layers, 2 heads, patch 4,
                         image 32: 65 tokens; gelu), saved with its config.json
  start.png, end.png     32x32 RGB
  reference.safetensors  [F, 3, H, W] in [0, 1], 5 frames, 4 euler steps on sd-cli's `discrete`
                         sigmas (shift 5), CFG 5 with an empty negative prompt, latents seed 42:
    `i2v`                WanImageToVideoPipeline's conditioning (prepare_latents) with start.png in
                         its denoising loop, the image tokens as sd-cli takes them: every layer of the
                         tower, no post_layernorm (transformers' hidden_states[-1])
    `i2v_penultimate`    the same with diffusers' encode_image (hidden_states[-2]: `--clip-skip 2`)
    `flf2v`              the same with last_image=end.png on the flf2v transformer
    `concat_only`        start.png on the concat_only transformer, no image encoder
    `moe`                Wan 2.2 A14B's two experts: moe_high with CFG 3 on the steps whose sigma is at
                         least 0.875 (2 of 4), then concat_only with CFG 5
    `ti2v_t2v`           Wan 2.2 TI2V-style text-to-video on ti2v/ and the Wan 2.2 VAE, 64x32
    `ti2v_i2v`           the same model's image-to-video from start_wide.png (64x32): WanImageToVideoPipeline's
                         expand_timesteps loop (first latent frame = the image's, clean, timestep 0)
"""
import os
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from diffusers import AutoencoderKLWan, WanImageToVideoPipeline, WanTransformer3DModel
from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel, T5TokenizerFast, \
    UMT5EncoderModel

sys.path.insert(0, os.path.dirname(__file__))
from sd3_fixtures import sdcli_sigmas  # noqa: E402
import wan_pipeline_fixtures as t2v  # noqa: E402

OUT = "tests/fixtures/wan_i2v"
SEED, W, H, FRAMES, STEPS, CFG, SHIFT = 42, 32, 32, 5, 4, 5.0, 5.0
CLIP_TOKENS = 1 + (32 // 4) ** 2
BOUNDARY, EXPERT_CFG = 0.875, 3.0
TI2V_VAE = "tests/fixtures/wan22_vae/diffusers"


def image_encoder():
    torch.manual_seed(21)
    cfg = CLIPVisionConfig(hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=2,
                           image_size=32, patch_size=4, hidden_act="gelu", layer_norm_eps=1e-5)
    model = CLIPVisionModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(f"{OUT}/image_encoder", safe_serialization=True)
    return model


def transformer(name, seed, image_dim, pos_len, channels=(36, 16)):
    torch.manual_seed(seed)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                  in_channels=channels[0], out_channels=channels[1], text_dim=16, freq_dim=256, ffn_dim=48, num_layers=2,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                                  image_dim=image_dim, added_kv_proj_dim=24 if image_dim else None,
                                  pos_embed_seq_len=pos_len).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(f"{OUT}/{name}", safe_serialization=True)
    return model


def images():
    g = np.random.default_rng(5)
    yy, xx = np.mgrid[0:H, 0:W]
    a = np.stack([xx * 8, yy * 6, (xx * yy) % 256], -1) % 256
    b = np.stack([255 - yy * 7, (xx + yy) * 4, xx * 5], -1) % 256
    a = np.clip(a + g.integers(-12, 12, a.shape), 0, 255).astype(np.uint8)
    b = np.clip(b + g.integers(-12, 12, b.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(a, "RGB"), Image.fromarray(b, "RGB")


def run(pipe, model, cond, uncond, start, end, layer=-1, expert=None):
    """WanImageToVideoPipeline's conditioning and loop on sd-cli's sigmas → frames [F, 3, H, W] in [0, 1]."""
    img = pipe.video_processor.preprocess(start, height=H, width=W).float()
    last = pipe.video_processor.preprocess(end, height=H, width=W).float() if end is not None else None
    embeds = None
    if model.config.image_dim is not None:
        with torch.no_grad():
            if layer == -2:  # diffusers' encode_image
                embeds = pipe.encode_image(start if end is None else [start, end], torch.device("cpu"))
            else:  # sd-cli: every layer, no post_layernorm (transformers' hidden_states[-1])
                px = pipe.image_processor(images=start if end is None else [start, end],
                                          return_tensors="pt").pixel_values
                embeds = pipe.image_encoder(pixel_values=px, output_hidden_states=True).hidden_states[layer]
    x, condition = pipe.prepare_latents(img, 1, 16, H, W, FRAMES, torch.float32, torch.device("cpu"),
                                        torch.Generator().manual_seed(SEED), None, last)
    sigmas = sdcli_sigmas(STEPS, SHIFT) + [0.0]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        ts = torch.tensor([s * 1000.0])
        inp = torch.cat([x, condition], dim=1)
        # WanPipeline's two experts: `transformer` (high noise, guidance_scale) while
        # t >= boundary_ratio * 1000, then `transformer_2` (guidance_scale_2).
        net, cfg = (expert, EXPERT_CFG) if expert is not None and s >= BOUNDARY else (model, CFG)
        with torch.no_grad():
            c = net(hidden_states=inp, timestep=ts, encoder_hidden_states=cond[None],
                    encoder_hidden_states_image=embeds, return_dict=False)[0]
            u = net(hidden_states=inp, timestep=ts, encoder_hidden_states=uncond[None],
                    encoder_hidden_states_image=embeds, return_dict=False)[0]
        x = x + (s_next - s) * (u + cfg * (c - u))
    ae = pipe.vae
    mean = torch.tensor(ae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(ae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        video = ae.decode(x * std + mean, return_dict=False)[0][0]
    return (video / 2 + 0.5).clamp(0, 1).permute(1, 0, 2, 3).contiguous()


def ti2v_text_to_video(te, tok, cond, uncond):
    """Wan 2.2 TI2V-5B style text-to-video: the Wan 2.2 VAE of wan22_vae_fixtures.py (z 6, 16x,
    patchified) under a transformer of 6 channels; WanPipeline's loop (expand_timesteps changes
    nothing without an image) on sd-cli's sigmas, 64x32, 5 frames → [F, 3, H, W]."""
    ae = AutoencoderKLWan.from_pretrained(TI2V_VAE).eval()
    z = ae.config.z_dim
    model = transformer("ti2v", 36, None, None, (z, z))
    x = torch.randn((1, z, 2, 32 // 16, 64 // 16), generator=torch.Generator().manual_seed(SEED))
    sigmas = sdcli_sigmas(STEPS, SHIFT) + [0.0]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        ts = torch.tensor([s * 1000.0])
        with torch.no_grad():
            c = model(hidden_states=x, timestep=ts, encoder_hidden_states=cond[None], return_dict=False)[0]
            u = model(hidden_states=x, timestep=ts, encoder_hidden_states=uncond[None], return_dict=False)[0]
        x = x + (s_next - s) * (u + CFG * (c - u))
    mean = torch.tensor(ae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(ae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        video = ae.decode(x * std + mean, return_dict=False)[0][0]
    return (video / 2 + 0.5).clamp(0, 1).permute(1, 0, 2, 3).contiguous()


def ti2v_image_to_video(te, tok, cond, uncond, image):
    """Wan 2.2 TI2V-5B image-to-video as WanImageToVideoPipeline runs it with expand_timesteps: the
    init image's latent (posterior mode, normalised) is the first latent frame, fed clean with
    timestep 0 on its tokens, and put back at the end; the same ti2v/ transformer, 64x32, 5 frames."""
    ae = AutoencoderKLWan.from_pretrained(TI2V_VAE).eval()
    z = ae.config.z_dim
    model = WanTransformer3DModel.from_pretrained(f"{OUT}/ti2v").eval()
    h, w = 32 // 16, 64 // 16
    x = torch.randn((1, z, 2, h, w), generator=torch.Generator().manual_seed(SEED))
    px = torch.from_numpy(np.asarray(image)).float().permute(2, 0, 1)[None, :, None] / 255 * 2 - 1
    mean = torch.tensor(ae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(ae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        condition = (ae.encode(px).latent_dist.mode() - mean) / std
    mask = torch.ones(1, 1, 2, h, w)
    mask[:, :, 0] = 0
    sigmas = sdcli_sigmas(STEPS, SHIFT) + [0.0]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        inp = (1 - mask) * condition + mask * x
        ts = (mask[0][0][:, ::2, ::2] * (s * 1000.0)).flatten()[None]
        with torch.no_grad():
            c = model(hidden_states=inp, timestep=ts, encoder_hidden_states=cond[None], return_dict=False)[0]
            u = model(hidden_states=inp, timestep=ts, encoder_hidden_states=uncond[None], return_dict=False)[0]
        x = x + (s_next - s) * (u + CFG * (c - u))
    x = (1 - mask) * condition + mask * x
    with torch.no_grad():
        video = ae.decode(x * std + mean, return_dict=False)[0][0]
    return (video / 2 + 0.5).clamp(0, 1).permute(1, 0, 2, 3).contiguous()


def main():
    os.makedirs(OUT, exist_ok=True)
    te = UMT5EncoderModel.from_pretrained(f"{t2v.OUT}/text_encoder").eval()
    tok = T5TokenizerFast(tokenizer_file=t2v.TOKENIZER)
    ae = AutoencoderKLWan.from_pretrained(f"{t2v.OUT}/vae").eval()
    cond, uncond = t2v.states(te, tok, t2v.PROMPT), t2v.states(te, tok, "")
    enc = image_encoder()
    proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    start, end = images()
    start.save(f"{OUT}/start.png")
    end.save(f"{OUT}/end.png")
    refs = {}
    i2v = transformer("i2v", 31, 24, None)
    cases = [("i2v", i2v, None, -1),
             ("i2v_penultimate", i2v, None, -2),
             ("flf2v", transformer("flf2v", 32, 24, 2 * CLIP_TOKENS), end, -1),
             ("concat_only", transformer("concat_only", 33, None, None), None, -1)]
    for name, model, last, layer in cases:
        if name == "concat_only":
            concat_only = model
        pipe = WanImageToVideoPipeline(tokenizer=tok, text_encoder=te, vae=ae, scheduler=None, transformer=model,
                                       image_encoder=enc if model.config.image_dim else None,
                                       image_processor=proc if model.config.image_dim else None)
        video = run(pipe, model, cond, uncond, start, last, layer)
        refs[name] = video
        print(name, tuple(video.shape), float(video.min()), float(video.max()), "saturated",
              float(((video <= 0) | (video >= 1)).float().mean()))
    expert = transformer("moe_high", 34, None, None)
    pipe = WanImageToVideoPipeline(tokenizer=tok, text_encoder=te, vae=ae, scheduler=None, transformer=expert,
                                   transformer_2=concat_only, boundary_ratio=BOUNDARY)
    refs["moe"] = run(pipe, concat_only, cond, uncond, start, None, -1, expert)
    refs["ti2v_t2v"] = ti2v_text_to_video(te, tok, cond, uncond)
    g = np.random.default_rng(9)
    yy, xx = np.mgrid[0:32, 0:64]
    wide = np.stack([xx * 4, yy * 8, (xx + yy) * 3], -1) % 256
    wide = Image.fromarray(np.clip(wide + g.integers(-12, 12, wide.shape), 0, 255).astype(np.uint8), "RGB")
    wide.save(f"{OUT}/start_wide.png")
    refs["ti2v_i2v"] = ti2v_image_to_video(te, tok, cond, uncond, wide)
    save_file(refs, f"{OUT}/reference.safetensors")


if __name__ == "__main__":
    main()
