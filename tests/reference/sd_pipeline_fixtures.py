"""Golden fixtures for whole Stable Diffusion 1.x / 2.x / SDXL runs (tests/sd_pipeline.rs).

Run from the repository root:  python3 tests/reference/sd_pipeline_fixtures.py

Builds tiny random-weight pipelines with the real diffusers/transformers classes (CLIPTextModel,
CLIPTextModelWithProjection, UNet2DConditionModel, AutoencoderKL) and runs
StableDiffusionPipeline / StableDiffusionXLPipeline with EulerDiscreteScheduler configured like
sd-cli's `euler` + `discrete` (scaled_linear betas 0.00085..0.012, 4 steps: integer timesteps
999/666/333/0, where k-diffusion's log-sigma and diffusers' linear interpolation agree).

Each variant is written the ways users have it:
  <variant>/              a diffusers pipeline folder (model_index.json, unet/, text_encoder/,
                          [text_encoder_2/], vae/, scheduler/) — the per-component files too
  <variant>.single.safetensors + <variant>.single.borrow.json
                          the original single-file checkpoint (LDM UNet/VAE names, SD2/SDXL bigG
                          in OpenCLIP names) as a recipe: the tensors equal to one of the diffusers
                          folder's are named in `borrow` (target name -> file, name, shape) and
                          copied in by the test; the others (fused q/k/v, transposed projections,
                          SD2's extra last layer) are in the .safetensors
  <variant>/reference.safetensors
                          prompt embeddings, the final latent (already divided by the VAE scale)
                          and the image [3, H, W] in [0, 1]

The CLIP vocabulary is built from the real merges in ../shared/tokenizers (the OpenAI rule:
256 byte symbols, the same with `</w>`, every merge, then the two specials -> 49408 ids).
Tiny text encoders use hidden width 8 and one head: sd-cli's rule without a config.json is
CLIP's head size 64, at least one head.

Differences from upstream sd-cli that the variants avoid (sd-cli is the spec, REFERENCE-NOTES
26-28): SDXL's empty negative prompt (diffusers zeroes the pooled embedding too) -> the runs use
a non-empty negative prompt; prompts carry no emphasis syntax (diffusers reads it literally) and
no "!": SD2's and SDXL-bigG's tokenizers use "!" as their pad token, and HF then reads every "!"
of a prompt as that special token (id 0) where sd-cli's BPE gives "!</w>" (256).
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer
from diffusers import (AutoencoderKL, AutoencoderTiny, EulerDiscreteScheduler, StableDiffusionPipeline,
                       StableDiffusionXLPipeline, UNet2DConditionModel)

sys.path.insert(0, os.path.dirname(__file__))
import ldm_layout  # noqa: E402

OUT = "tests/fixtures/sd_pipeline"
MERGES = os.path.join(os.path.dirname(__file__), "../../../shared/tokenizers/clip.merges.txt")
PROMPT = "A lovely cat, holding a sign."
NEGATIVE = "blurry, low quality"
SEED, STEPS, CFG, W, H = 42, 4, 5.0, 24, 16
COMPONENT_FILES = ["unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
                   "text_encoder/model.safetensors", "text_encoder_2/model.safetensors"]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def tokenizer_files(folder):
    os.makedirs(folder, exist_ok=True)
    merges = open(MERGES, encoding="utf-8").read().split("\n")[1:49152 - 256 - 2 + 1]
    merges = [m for m in merges if m]
    vocab = list(bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab]
    vocab += ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408, len(vocab)
    with open(f"{folder}/vocab.json", "w", encoding="utf-8") as f:
        json.dump({v: i for i, v in enumerate(vocab)}, f, ensure_ascii=False)
    with open(f"{folder}/merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")


def tokenizer(pad):
    tokenizer_files("/tmp/sd_clip_tok")
    return CLIPTokenizer("/tmp/sd_clip_tok/vocab.json", "/tmp/sd_clip_tok/merges.txt", pad_token=pad,
                         model_max_length=77)


def randomize(model, scale):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                fan_in = p[0].numel() if p.ndim > 1 else 1
                p.copy_(torch.randn_like(p) * (scale if p.ndim == 1 else 1.0 / fan_in ** 0.5))


def clip(act, layers, projection=None):
    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=8, intermediate_size=20, num_hidden_layers=layers,
                         num_attention_heads=1, max_position_embeddings=77, hidden_act=act,
                         projection_dim=projection or 8, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    model = (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg).eval()
    randomize(model, 0.1)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb.copy_((torch.randn_like(emb) * 0.5).half().float())  # stored in f16 (small fixtures)
    return model


def unet(kind):
    common = dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 32),
                  norm_num_groups=32)
    if kind == "sd1":
        cfg = dict(down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                   up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8, attention_head_dim=8)
    elif kind == "sd2":
        cfg = dict(down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                   up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=8,
                   attention_head_dim=(1, 1), use_linear_projection=True)
    else:
        cfg = dict(down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                   up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=16,
                   attention_head_dim=(1, 1), use_linear_projection=True, transformer_layers_per_block=(1, 2),
                   addition_embed_type="text_time", addition_time_embed_dim=8,
                   projection_class_embeddings_input_dim=12 + 6 * 8)
    model = UNet2DConditionModel(**common, **cfg).eval()
    randomize(model, 0.1)
    return model


def vae(scale):
    model = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                          up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 32),
                          layers_per_block=1, latent_channels=4, norm_num_groups=32, sample_size=32,
                          scaling_factor=scale).eval()
    randomize(model, 0.1)
    with torch.no_grad():
        model.decoder.conv_out.weight.mul_(0.3)  # keep the image inside (0, 1): clamping hides errors
    return model


def scheduler(prediction):
    return EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                  beta_schedule="scaled_linear", prediction_type=prediction,
                                  timestep_spacing="linspace", interpolation_type="linear")


def capture_decode(pipe):
    captured = {}
    orig = pipe.vae.decode

    def hook(z, *a, **k):
        captured["latent"] = z.detach().clone()
        return orig(z, *a, **k)

    pipe.vae.decode = hook
    return captured, orig


def drop_tokenizers(folder):
    """The tokenizer folders (2 MB each) are not fixtures: sd-cli carries the CLIP vocabulary."""
    import shutil
    for t in ("tokenizer", "tokenizer_2"):
        shutil.rmtree(f"{folder}/{t}", ignore_errors=True)


def f16_tables(path):
    """Rewrites a saved text encoder with its token table in f16."""
    from safetensors.torch import load_file
    sd = load_file(path)
    sd = {k: (v.half() if k.endswith("token_embedding.weight") else v).contiguous() for k, v in sd.items()}
    save_file(sd, path, metadata={"format": "pt"})


def save_image_ref(folder, image, latent, extra):
    tensors = {
        "latent": latent[0].float().contiguous(),
        "image": torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous(),
    }
    tensors.update({k: v.float().contiguous() for k, v in extra.items()})
    save_file(tensors, f"{folder}/reference.safetensors")


def write_single(name, tensors, sources):
    """The single-file checkpoint as a recipe: every tensor that equals (bytes and element count)
    a tensor of the diffusers folder's files is borrowed from there by name (the test assembles
    the file; git does not store the weights twice); the rest (fused q/k/v, transposed
    projections, an extra layer) is written out."""
    from safetensors.torch import load_file
    pool = {}
    for rel in sources:
        for k, v in load_file(f"{OUT}/{rel}").items():
            pool.setdefault((v.dtype, v.numel(), v.flatten().float().numpy().tobytes()), (rel, k))
    borrow, small = {}, {}
    for k, v in tensors.items():
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
    save_file(small, f"{OUT}/{name}.single.safetensors")
    with open(f"{OUT}/{name}.single.borrow.json", "w") as f:
        json.dump(borrow, f, indent=0, sort_keys=True)
    print(name, "single file:", len(borrow), "tensors borrowed,", len(small), "written")


def shared_vae(scale):
    """One VAE's weights for every variant (git stores the identical files once)."""
    torch.manual_seed(7)
    return vae(scale)


def shared_clip_l():
    """SD1's CLIP-L is SDXL's first encoder too (identical files)."""
    torch.manual_seed(8)
    return clip("quick_gelu", 3)


def taesd():
    """A tiny AutoencoderTiny with the fixtures' 2x VAE factor (uneven blocks per level)."""
    torch.manual_seed(9)
    model = AutoencoderTiny(in_channels=3, out_channels=3, encoder_block_out_channels=(32, 32),
                            decoder_block_out_channels=(32, 32), num_encoder_blocks=(1, 2),
                            num_decoder_blocks=(2, 1), latent_channels=4, upsampling_scaling_factor=2).eval()
    randomize(model, 0.1)
    with torch.no_grad():  # keep the image inside (0, 1): clamping hides errors
        model.decoder.layers[-1].weight.mul_(0.05)
        model.decoder.layers[-1].bias.fill_(0.5)
    return model


def sd12(name, act, te_layers, prediction, vae_scale):
    te = shared_clip_l() if name == "sd1" else None
    torch.manual_seed({"sd1": 1, "sd2": 2}[name])
    te = te or clip(act, te_layers)
    un = unet(name)
    va = shared_vae(vae_scale)
    tok = tokenizer("<|endoftext|>" if name == "sd1" else "!")
    pipe = StableDiffusionPipeline(vae=va, text_encoder=te, tokenizer=tok, unet=un, scheduler=scheduler(prediction),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    folder = f"{OUT}/{name}"
    with torch.no_grad():
        cond, uncond = pipe.encode_prompt(PROMPT, "cpu", 1, True, NEGATIVE)
        # diffusers' clip_skip=1 (penultimate layer + final LN) is sd-cli's --clip-skip 2; its
        # encode_prompt reaches the final norm through `.text_model`, which transformers 5's
        # CLIPTextModel no longer has, so this is the same computation spelled out.
        ids = tok(PROMPT, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        hidden = te(ids, output_hidden_states=True).hidden_states[-2]
        cond_skip2 = te.final_layer_norm(hidden)
        captured, orig = capture_decode(pipe)
        image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG, height=H,
                     width=W, generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
        pipe.vae.decode = orig
    pipe.save_pretrained(folder, safe_serialization=True)
    drop_tokenizers(folder)
    f16_tables(f"{folder}/text_encoder/model.safetensors")
    save_image_ref(folder, image, captured["latent"],
                   {"cond": cond[0], "uncond": uncond[0], "cond_clip_skip_2": cond_skip2[0]})

    te_sd = ldm_layout.hf_clip_state(te)
    if name == "sd1":
        te_single = {"cond_stage_model.transformer." + k: v for k, v in te_sd.items()}
    else:
        # SD2 checkpoints keep OpenCLIP-H's last layer, which diffusers' conversion drops (its pipeline
        # reads the last hidden state of the shortened model = the full model's penultimate layer):
        # add one more random layer to the single file; it must not change the picture.
        full = clip(act, te_layers + 1)
        full_sd = ldm_layout.hf_clip_state(full)
        for k, v in te_sd.items():
            full_sd[k] = v
        ldm_layout.check_openclip(full, "cond_stage_model.model.")
        te_single = ldm_layout.clip_to_openclip(full_sd, "cond_stage_model.model.")
    ldm_layout.check_unet(un.state_dict(), un.config)
    ldm_layout.check_vae(va.state_dict(), va.config)
    single = {}
    single.update(ldm_layout.unet_to_ldm(un.state_dict(), un.config))
    single.update(ldm_layout.vae_to_ldm(va.state_dict(), len(va.config.block_out_channels)))
    single.update(te_single)
    write_single(name, single, [f"{name}/{c}" for c in COMPONENT_FILES[:3]])
    if name == "sd1":
        # The same run decoded by TAESD (`--taesd`): it reads the sampler's latent as it is.
        tae = taesd()
        tae.save_pretrained(f"{OUT}/taesd", safe_serialization=True)
        pipe.vae = tae
        pipe.register_modules(vae=tae)
        with torch.no_grad():
            tae_image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG,
                             height=H, width=W, generator=torch.Generator().manual_seed(SEED),
                             output_type="np").images[0]
            x = torch.rand(1, 3, H, W, generator=torch.Generator().manual_seed(5)) * 2 - 1
            enc = tae.encode(x).latents
            dec = tae.decode(enc).sample
        save_file({"image": torch.from_numpy(np.ascontiguousarray(tae_image)).float().permute(2, 0, 1).contiguous(),
                   "encode_in": x[0].contiguous(), "encode_out": enc[0].contiguous(),
                   "decode_out": dec[0].contiguous()}, f"{OUT}/taesd/reference.safetensors")
        print("taesd image", float(tae_image.min()), float(tae_image.max()),
              "saturated", float(((tae_image <= 0) | (tae_image >= 1)).mean()))
    print(name, "image", image.shape, float(image.min()), float(image.max()),
          "saturated", float(((image <= 0) | (image >= 1)).mean()), "latent", tuple(captured["latent"].shape))


def sdxl():
    te = shared_clip_l()
    torch.manual_seed(3)
    te2 = clip("gelu", 3, projection=12)
    un = unet("sdxl")
    va = shared_vae(0.13025)
    pipe = StableDiffusionXLPipeline(vae=va, text_encoder=te, text_encoder_2=te2, tokenizer=tokenizer("<|endoftext|>"),
                                     tokenizer_2=tokenizer("!"), unet=un, scheduler=scheduler("epsilon"),
                                     force_zeros_for_empty_prompt=True, add_watermarker=False)
    folder = f"{OUT}/sdxl"
    with torch.no_grad():
        cond, uncond, pooled, upooled = pipe.encode_prompt(PROMPT, None, "cpu", 1, True, NEGATIVE)
        captured, orig = capture_decode(pipe)
        image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG, height=H,
                     width=W, generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
        pipe.vae.decode = orig
    pipe.save_pretrained(folder, safe_serialization=True)
    drop_tokenizers(folder)
    f16_tables(f"{folder}/text_encoder/model.safetensors")
    f16_tables(f"{folder}/text_encoder_2/model.safetensors")
    save_image_ref(folder, image, captured["latent"],
                   {"cond": cond[0], "uncond": uncond[0], "pooled": pooled[0], "uncond_pooled": upooled[0]})

    te_sd = ldm_layout.hf_clip_state(te)
    te2_sd = ldm_layout.hf_clip_state(te2)
    ldm_layout.check_unet(un.state_dict(), un.config)
    ldm_layout.check_openclip(te2, "conditioner.embedders.1.model.")
    single = {}
    single.update(ldm_layout.unet_to_ldm(un.state_dict(), un.config))
    single.update(ldm_layout.vae_to_ldm(va.state_dict(), len(va.config.block_out_channels)))
    single.update({"conditioner.embedders.0.transformer." + k: v for k, v in te_sd.items()})
    single.update(ldm_layout.clip_to_openclip(te2_sd, "conditioner.embedders.1.model."))
    write_single("sdxl", single, [f"sdxl/{c}" for c in COMPONENT_FILES])
    print("sdxl image", image.shape, float(image.min()), float(image.max()),
          "saturated", float(((image <= 0) | (image >= 1)).mean()))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    sd12("sd1", "quick_gelu", 3, "epsilon", 0.18215)
    sd12("sd2", "gelu", 3, "v_prediction", 0.18215)
    sdxl()
