"""Golden fixtures for Qwen Image v1 (tests/qwen_image_v1_pipeline.rs).

Run from the repository root (after wan_vae_fixtures.py and qwen_tokenizer_fixtures.py):
    python3 tests/reference/qwen_image_v1_fixtures.py

Writes tests/fixtures/qwen_image_v1/:
  transformer/               a tiny QwenImageTransformer2DModel (2 blocks, 2 heads x 16, rope axes [4, 6, 6],
                             text width 24, 16 latent channels, patch 2) as a diffusers folder
  qwen_image.safetensors     the same weights as a single file (ComfyUI: `model.diffusion_model.` + diffusers names)
  text_encoder/              a tiny transformers Qwen2_5_VLForConditionalGeneration (language model: hidden 24,
                             2 layers, 2 heads x 12, 1 KV head, q/k/v biases, rope theta 1e6; a one-block vision
                             tower) as a diffusers folder; tokenizer/ the tiny Qwen tokenizer
  reference.safetensors
    `{case}_ids`, `{case}_states`  the templated prompt's ids and the states the transformer reads
                             (hidden_states[-1] = after the final norm, first 34 rows dropped), per prompt
    `weighted_ids`, `weighted_states`  upstream's emphasis: template pieces and prompt parts tokenized
                             apart, rows weighted, mean restored, then the 34 rows dropped
    `call{i}_x|txt|sigma|out`  transformer calls on random packed tokens; grids 4x6 (diffusers' rope) and
                             3x5 patches (odd: diffusers' rope with sd-cli's centring r - rows/2)
    `image_nocfg`            QwenImagePipeline(true_cfg_scale=1), 4 euler steps on sd-cli's `discrete` sigmas
                             (shift 3; the scheduler's own shift 1, no dynamic shifting), 64x32 (an even patch grid:
                             diffusers centres odd grids differently), seed 42,
                             the Wan VAE tests/fixtures/wan_vae/a
    `image_cfg`              the same transformer, scheduler and VAE in a loop with sd-cli's CFG 4.0
                             (`uncond + 4 (cond - uncond)`, no norm rescale) and the negative prompt
    `image_img2img`          as `image_cfg` from init.png (64x32) at --strength 0.6: the init latent (posterior
                             mean, normalised) noised to the first sigma of the schedule's last 3 steps
    `lora_image`             as `image_nocfg` with loras/qwen_image_peft.safetensors (a PEFT LoRA) merged
    `edit_ids`, `edit_states`  the edit template (upstream's Edit Plus one: "Picture 1: <|vision_start|>" + 210
                             image pads + "<|vision_end|>", 64 rows dropped) for ref.png (420x392: the vision copy
                             needs no resize under sd-cli's rules) with the vision tower's merged embeddings in the
                             pad rows and every token at its sequence position (sd-cli; transformers would use 3-D
                             positions), through the final norm
    `edit_cfg`               editing in sd-cli's loop: ref.png nearest-resized to 32x32 (min(1024^2, 64x32) pixels
                             at its ratio, sides rounded to 32), VAE posterior mean normalised, its tokens after the
                             target's at frame 1 (diffusers' img_shapes), CFG 4 with the negative prompt (also with
                             the picture), 4 steps
    `edit_zero_cond`         as `edit_cfg` at cfg 1 with the transformer's zero_cond_t (Edit 2511)
"""
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline, \
    QwenImageTransformer2DModel
from diffusers.models.transformers import transformer_qwenimage as tq
from transformers import Qwen2Tokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

sys.path.insert(0, os.path.dirname(__file__))
from sd3_fixtures import sdcli_sigmas  # noqa: E402

OUT = "tests/fixtures/qwen_image_v1"
TOK = "tests/fixtures/qwen_tokenizer/tiny"
VAE = "tests/fixtures/wan_vae/a"
PROMPT, NEGATIVE = "A lovely cat, holding a sign.", "blurry"
WEIGHTED = "A lovely (cat:1.5), holding a sign."
SEED, W, H, STEPS, CFG = 42, 64, 32, 4, 4.0
STRENGTH = 0.6
PREFIX = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
          "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
DROP = 34


def text_encoder():
    torch.manual_seed(11)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=1026, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=1e6,
                         max_position_embeddings=512, rope_scaling={"type": "mrope", "mrope_section": [2, 2, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=20, num_heads=2, out_hidden_size=24),
        vocab_size=1026, tie_word_embeddings=False)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    return model


def states_of(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]


def transformer(seed):
    torch.manual_seed(seed)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=2,
                                        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
                                        axes_dims_rope=(4, 6, 6)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    return model


def sdcli_video_freqs(self, frame, height, width, idx=0, device=None):
    """diffusers' `_compute_video_freqs` with sd-cli's centring: row r at r - height // 2."""
    pos = torch.cat([self.rope_params(torch.arange(-4096, 4096), d, self.theta) for d in self.axes_dim], dim=1)
    split = pos.split([d // 2 for d in self.axes_dim], dim=1)
    f = split[0][4096 + idx:4096 + idx + frame].view(frame, 1, 1, -1).expand(frame, height, width, -1)
    hh = split[1][4096 - height // 2:4096 - height // 2 + height].view(1, height, 1, -1).expand(frame, height, width, -1)
    ww = split[2][4096 - width // 2:4096 - width // 2 + width].view(1, 1, width, -1).expand(frame, height, width, -1)
    return torch.cat([f, hh, ww], dim=-1).reshape(frame * height * width, -1)


def pack(lat):
    """diffusers' `_pack_latents` of a [C, h, w] latent → [(h/2)(w/2), 4C]."""
    c, h, w = lat.shape
    return lat.view(c, h // 2, 2, w // 2, 2).permute(1, 3, 0, 2, 4).reshape((h // 2) * (w // 2), c * 4)


def decode(vae, lat, h, w):
    lat = QwenImagePipeline._unpack_latents(lat, h, w, 8)
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        img = vae.decode(lat * std + mean, return_dict=False)[0][:, :, 0]
    return (img / 2 + 0.5).clamp(0, 1)[0]


def init_image():
    """A W x H RGB gradient with noise, [H, W, 3] uint8."""
    g = np.random.default_rng(11)
    yy, xx = np.mgrid[0:H, 0:W]
    rgb = np.stack([xx * 4, yy * 7, (xx + 2 * yy) * 3], -1) % 256
    return np.clip(rgb + g.integers(-15, 15, rgb.shape), 0, 255).astype(np.uint8)


def main():
    os.makedirs(OUT, exist_ok=True)
    model = transformer(5)
    model.save_pretrained(f"{OUT}/transformer", safe_serialization=True)
    save_file({"model.diffusion_model." + k: v.contiguous() for k, v in model.state_dict().items()},
              f"{OUT}/qwen_image.safetensors")
    refs = {}
    torch.manual_seed(9)
    for i, (rows, cols, l, sigma) in enumerate([(4, 6, 9, 0.7), (3, 5, 13, 0.25)]):
        x = torch.randn(rows * cols, 64)
        txt = torch.randn(l, 24)
        orig = tq.QwenEmbedRope._compute_video_freqs
        if rows % 2 or cols % 2:
            tq.QwenEmbedRope._compute_video_freqs = sdcli_video_freqs
        try:
            with torch.no_grad():
                out = model(hidden_states=x[None], encoder_hidden_states=txt[None], timestep=torch.tensor([sigma]),
                            img_shapes=[[(1, rows, cols)]], return_dict=False)[0][0]
        finally:
            tq.QwenEmbedRope._compute_video_freqs = orig
        refs[f"call{i}_x"], refs[f"call{i}_txt"] = x, txt
        refs[f"call{i}_sigma"] = torch.tensor([sigma])
        refs[f"call{i}_out"] = out.contiguous()

    te, tok = text_encoder(), Qwen2Tokenizer.from_pretrained(TOK)
    te.save_pretrained(f"{OUT}/text_encoder", safe_serialization=True)
    shutil.copytree(TOK, f"{OUT}/tokenizer", dirs_exist_ok=True)
    emb = {}
    for case, text in [("prompt", PROMPT), ("negative", NEGATIVE), ("empty", "")]:
        ids = tok(PREFIX + text + SUFFIX, add_special_tokens=False).input_ids
        states = states_of(te, ids)[DROP:]
        refs[f"{case}_ids"], refs[f"{case}_states"] = torch.tensor(ids).float(), states.contiguous()
        emb[case] = states
    # diffusers' own prompt encoding gives the same states.
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0), vae=None, text_encoder=te,
                             tokenizer=tok, transformer=model)
    with torch.no_grad():
        pe, _ = pipe.encode_prompt(PROMPT, device="cpu")
    assert torch.allclose(pe[0], emb["prompt"], atol=1e-5), "template/drop disagrees with QwenImagePipeline"

    # Emphasis as upstream's LLM embedder applies it.
    pieces = [(PREFIX, 1.0), ("A lovely ", 1.0), ("cat", 1.5), (", holding a sign.", 1.0), (SUFFIX, 1.0)]
    ids, weights = [], []
    for text, wt in pieces:
        t = tok(text, add_special_tokens=False).input_ids
        ids += t
        weights += [wt] * len(t)
    states = states_of(te, ids)
    before = states.mean()
    states = states * torch.tensor(weights)[:, None]
    states = states * (before / states.mean())
    refs["weighted_ids"] = torch.tensor(ids).float()
    refs["weighted_states"] = states[DROP:].contiguous()

    vae = AutoencoderKLQwenImage.from_pretrained(VAE).eval()
    sched = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)
    pipe = QwenImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=model)
    with torch.no_grad():
        image = pipe(prompt_embeds=emb["prompt"][None], prompt_embeds_mask=None, true_cfg_scale=1.0,
                     num_inference_steps=STEPS, sigmas=sdcli_sigmas(STEPS), height=H, width=W,
                     generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
    refs["image_nocfg"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()

    # sd-cli's CFG over the same transformer and scheduler.
    lat = torch.randn((1, 1, 16, H // 8, W // 8), generator=torch.Generator().manual_seed(SEED))
    x = pack(lat[0, 0])[None]
    sigmas = sdcli_sigmas(STEPS) + [0.0]
    shapes = [[(1, H // 16, W // 16)]]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        with torch.no_grad():
            c = model(hidden_states=x, encoder_hidden_states=emb["prompt"][None], timestep=torch.tensor([s]),
                      img_shapes=shapes, return_dict=False)[0]
            u = model(hidden_states=x, encoder_hidden_states=emb["negative"][None], timestep=torch.tensor([s]),
                      img_shapes=shapes, return_dict=False)[0]
        x = x + (s_next - s) * (u + CFG * (c - u))
    refs["image_cfg"] = decode(vae, x, H, W).contiguous()

    # img2img under sd-cli's rules: the init image (already W x H, so no resize) encoded to its
    # posterior mean and normalised, the schedule's tail for --strength (t = floor(s*n) capped at
    # n - 1, the last t + 1 steps), the start latent sigma*noise + (1 - sigma)*init.
    init = init_image()
    from PIL import Image as PilImage
    PilImage.fromarray(init, "RGB").save(f"{OUT}/init.png")
    px = torch.from_numpy(init).float().permute(2, 0, 1)[None, :, None] / 255 * 2 - 1
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        z0 = (vae.encode(px).latent_dist.mean - mean) / std
    full = sdcli_sigmas(STEPS) + [0.0]
    t_enc = min(int(STRENGTH * STEPS), STEPS - 1)
    sigmas = full[STEPS - t_enc - 1:]
    x = pack(sigmas[0] * lat[0, 0] + (1 - sigmas[0]) * z0[0, :, 0])[None]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        with torch.no_grad():
            c = model(hidden_states=x, encoder_hidden_states=emb["prompt"][None], timestep=torch.tensor([s]),
                      img_shapes=shapes, return_dict=False)[0]
            u = model(hidden_states=x, encoder_hidden_states=emb["negative"][None], timestep=torch.tensor([s]),
                      img_shapes=shapes, return_dict=False)[0]
        x = x + (s_next - s) * (u + CFG * (c - u))
    refs["image_img2img"] = decode(vae, x, H, W).contiguous()
    for k in ["image_nocfg", "image_cfg", "image_img2img"]:
        v = refs[k]
        print(k, tuple(v.shape), float(v.min()), float(v.max()), "saturated", float(((v <= 0) | (v >= 1)).float().mean()))

    # A diffusers/PEFT LoRA (no alpha: scale 1) on both streams' projections, a feed-forward, a
    # modulation and the text input; keys `transformer.<module>.lora_A/B.weight`.
    import copy
    torch.manual_seed(43)
    lora_model = copy.deepcopy(model)
    lora = {}
    with torch.no_grad():
        mods = dict(lora_model.named_modules())
        for t in ["transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_v_proj",
                  "transformer_blocks.0.img_mlp.net.2", "transformer_blocks.1.txt_mod.1", "txt_in"]:
            w = mods[t].weight
            a = torch.randn(2, w.shape[1]) * 0.2
            b = torch.randn(w.shape[0], 2) * 0.2
            w.add_(b @ a)
            lora[f"transformer.{t}.lora_A.weight"] = a.contiguous()
            lora[f"transformer.{t}.lora_B.weight"] = b.contiguous()
    os.makedirs(f"{OUT}/loras", exist_ok=True)
    save_file(lora, f"{OUT}/loras/qwen_image_peft.safetensors")
    pipe = QwenImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=lora_model)
    with torch.no_grad():
        image = pipe(prompt_embeds=emb["prompt"][None], prompt_embeds_mask=None, true_cfg_scale=1.0,
                     num_inference_steps=STEPS, sigmas=sdcli_sigmas(STEPS), height=H, width=W,
                     generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
    refs["lora_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
    edit_refs(refs, te, tok, model, vae)
    save_file(refs, f"{OUT}/reference.safetensors")


EDIT_SYSTEM = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
               "objects, background), then explain how the user's text instruction should alter or modify the image. "
               "Generate a new image that meets the user's requirements while maintaining consistency with the "
               "original input where appropriate.<|im_end|>\n<|im_start|>user\n")


def ref_image():
    """A smooth 420x392 RGB picture (small as a PNG)."""
    from PIL import Image
    g = torch.Generator().manual_seed(7)
    small = torch.rand((1, 3, 7, 8), generator=g)
    big = torch.nn.functional.interpolate(small, size=(392, 420), mode="bilinear", align_corners=False)[0]
    arr = (big.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    img = Image.fromarray(arr)
    img.save(f"{OUT}/ref.png")
    return img, torch.from_numpy(arr).permute(2, 0, 1).float() / 255


def edit_states(te, tok, img, text):
    from transformers import Qwen2VLImageProcessor
    proc = Qwen2VLImageProcessor()
    px = proc(images=[img], return_tensors="pt")
    with torch.no_grad():
        vis = te.model.visual(px.pixel_values, grid_thw=px.image_grid_thw).pooler_output
    ids = tok(EDIT_SYSTEM + "Picture 1: <|vision_start|>" + "<|image_pad|>" * vis.shape[0] + "<|vision_end|>" + text
              + SUFFIX, add_special_tokens=False).input_ids
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        emb = te.model.language_model.embed_tokens(ids_t)
        emb[ids_t == pad] = vis
        pos = torch.arange(len(ids)).view(1, 1, -1).expand(3, 1, -1)
        out = te.model.language_model(inputs_embeds=emb, position_ids=pos).last_hidden_state[0]
    return ids, out[64:]


def edit_run(model, vae, cond, uncond, ref_tokens, ref_grid, cfg):
    lat = torch.randn((1, 1, 16, H // 8, W // 8), generator=torch.Generator().manual_seed(SEED))
    x = pack(lat[0, 0])[None]
    n = x.shape[1]
    sigmas = sdcli_sigmas(STEPS) + [0.0]
    shapes = [[(1, H // 16, W // 16), (1,) + ref_grid]]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        inp = torch.cat([x, ref_tokens[None]], dim=1)
        with torch.no_grad():
            v = model(hidden_states=inp, encoder_hidden_states=cond[None], timestep=torch.tensor([s]),
                      img_shapes=shapes, return_dict=False)[0][:, :n]
            if uncond is not None:
                u = model(hidden_states=inp, encoder_hidden_states=uncond[None], timestep=torch.tensor([s]),
                          img_shapes=shapes, return_dict=False)[0][:, :n]
                v = u + cfg * (v - u)
        x = x + (s_next - s) * v
    return decode(vae, x, H, W).contiguous()


def edit_refs(refs, te, tok, model, vae):
    img, px = ref_image()
    ids, cond = edit_states(te, tok, img, PROMPT)
    _, uncond = edit_states(te, tok, img, NEGATIVE)
    refs["edit_ids"], refs["edit_states"] = torch.tensor(ids).float(), cond.contiguous()
    # The VAE copy: min(1024^2, W*H) pixels at the picture's ratio, sides rounded to 32.
    vw = (W * H * 420 / 392) ** 0.5
    vh = vw * 392 / 420
    rw, rh = int(round(vw / 32) * 32), int(round(vh / 32) * 32)
    small = torch.nn.functional.interpolate(px[None], size=(rh, rw), mode="nearest")[0]
    with torch.no_grad():
        z = vae.encode((small * 2 - 1)[None, :, None]).latent_dist.mode()[0, :, 0]
    mean = torch.tensor(vae.config.latents_mean).view(-1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(-1, 1, 1)
    ref_tokens = pack((z - mean) / std)
    grid = (rh // 16, rw // 16)
    refs["edit_cfg"] = edit_run(model, vae, cond, uncond, ref_tokens, grid, CFG)
    # (from_config would drop a key listed in `_use_default_values`.)
    cfg = {k: v for k, v in model.config.items() if not k.startswith("_")}
    zmodel = QwenImageTransformer2DModel(**{**cfg, "zero_cond_t": True}).eval()
    zmodel.load_state_dict(model.state_dict())
    assert all(b.zero_cond_t for b in zmodel.transformer_blocks)
    refs["edit_zero_cond"] = edit_run(zmodel, vae, cond, None, ref_tokens, grid, 1.0)
    for k in ["edit_cfg", "edit_zero_cond"]:
        v = refs[k]
        print(k, tuple(v.shape), float(v.min()), float(v.max()), "saturated",
              float(((v <= 0) | (v >= 1)).float().mean()))


if __name__ == "__main__":
    main()
