"""Golden fixtures for FLUX.1 (tests/flux_pipeline.rs).

Run from the repository root (after sd_pipeline_fixtures.py and pixart_pipeline_fixtures.py, whose tiny
CLIP-L and T5 encoders FLUX reuses):
    python3 tests/reference/flux_fixtures.py

Writes tests/fixtures/flux/:
  dev/transformer/          a tiny FluxTransformer2DModel with guidance embedding (diffusers folder)
  vae/                      a tiny 16-channel AutoencoderKL without quant convs (FLUX `ae` shape,
                            scaling 0.3611, shift 0.1159)
  schnell.safetensors       a second tiny transformer without guidance embedding, in BFL's single-file
                            names (fused img_attn.qkv and single-block linear1, final_layer with
                            (shift, scale) halves), as `flux1-schnell.safetensors` has them
  reference.safetensors     prompt embeddings (T5 over 256 tokens, unmasked; pooled CLIP), one
                            transformer call per model (and the dev call with --skip-layers [0,3]:
                            `call_dev_skip`), and FluxPipeline images

FluxPipeline runs under sd-cli's rules (REFERENCE-NOTES 29): T5 padded to 256 tokens
(`max_sequence_length=256`), the `flux` schedule's mu from the latent pixel count (H/8)(W/8) instead of
diffusers' packed token count (its `calculate_shift` is replaced for the run), guidance 3.5, euler.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from PIL import Image
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxPipeline,
                       FluxTransformer2DModel)
from diffusers.pipelines.flux import pipeline_flux, pipeline_flux_kontext
from transformers import CLIPTextModel, T5EncoderModel, T5TokenizerFast

sys.path.insert(0, os.path.dirname(__file__))
import sd_pipeline_fixtures as spf  # noqa: E402

OUT = "tests/fixtures/flux"
SD1 = "tests/fixtures/sd_pipeline/sd1"
PIXART = "tests/fixtures/pixart_pipeline"
T5_TOKENIZER = os.path.join(os.path.dirname(__file__), "../../../shared/tokenizers/t5-v1_1.tokenizer.json")
PROMPT = "A lovely cat, holding a sign."
SEED, W, H = 42, 24, 16
AXES = (4, 6, 6)


def transformer(seed, guidance):
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                   pooled_projection_dim=8, guidance_embeds=guidance, axes_dims_rope=AXES).eval()
    spf.randomize(model, 0.1)
    with torch.no_grad():
        model.proj_out.weight.mul_(0.5)
    return model


def vae():
    torch.manual_seed(21)
    model = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                          up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 32),
                          layers_per_block=1, latent_channels=16, norm_num_groups=32, sample_size=32,
                          scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                          use_post_quant_conv=False).eval()
    spf.randomize(model, 0.1)
    with torch.no_grad():
        model.decoder.conv_out.weight.mul_(0.3)
    return model


def to_bfl(model):
    """diffusers FluxTransformer2DModel state → BFL names (the inverse of diffusers' converter)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {}

    def mv(src, dst):
        out[dst] = sd.pop(src)

    for a, b in [("x_embedder", "img_in"), ("context_embedder", "txt_in"), ("proj_out", "final_layer.linear"),
                 ("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                 ("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                 ("time_text_embed.text_embedder.linear_1", "vector_in.in_layer"),
                 ("time_text_embed.text_embedder.linear_2", "vector_in.out_layer"),
                 ("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
                 ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer")]:
        for s in ("weight", "bias"):
            if f"{a}.{s}" in sd:
                mv(f"{a}.{s}", f"{b}.{s}")
    for s in ("weight", "bias"):
        scale, shift = sd.pop(f"norm_out.linear.{s}").chunk(2, 0)
        out[f"final_layer.adaLN_modulation.1.{s}"] = torch.cat([shift, scale], 0)
    for i in range(len(model.transformer_blocks)):
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for s in ("weight", "bias"):
            mv(f"{p}norm1.linear.{s}", f"{q}img_mod.lin.{s}")
            mv(f"{p}norm1_context.linear.{s}", f"{q}txt_mod.lin.{s}")
            out[f"{q}img_attn.qkv.{s}"] = torch.cat([sd.pop(f"{p}attn.to_{x}.{s}") for x in "qkv"], 0)
            out[f"{q}txt_attn.qkv.{s}"] = torch.cat([sd.pop(f"{p}attn.add_{x}_proj.{s}") for x in "qkv"], 0)
            mv(f"{p}attn.to_out.0.{s}", f"{q}img_attn.proj.{s}")
            mv(f"{p}attn.to_add_out.{s}", f"{q}txt_attn.proj.{s}")
            mv(f"{p}ff.net.0.proj.{s}", f"{q}img_mlp.0.{s}")
            mv(f"{p}ff.net.2.{s}", f"{q}img_mlp.2.{s}")
            mv(f"{p}ff_context.net.0.proj.{s}", f"{q}txt_mlp.0.{s}")
            mv(f"{p}ff_context.net.2.{s}", f"{q}txt_mlp.2.{s}")
        mv(f"{p}attn.norm_q.weight", f"{q}img_attn.norm.query_norm.scale")
        mv(f"{p}attn.norm_k.weight", f"{q}img_attn.norm.key_norm.scale")
        mv(f"{p}attn.norm_added_q.weight", f"{q}txt_attn.norm.query_norm.scale")
        mv(f"{p}attn.norm_added_k.weight", f"{q}txt_attn.norm.key_norm.scale")
    for i in range(len(model.single_transformer_blocks)):
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for s in ("weight", "bias"):
            out[f"{q}linear1.{s}"] = torch.cat([sd.pop(f"{p}attn.to_{x}.{s}") for x in "qkv"]
                                               + [sd.pop(f"{p}proj_mlp.{s}")], 0)
            mv(f"{p}proj_out.{s}", f"{q}linear2.{s}")
            mv(f"{p}norm.linear.{s}", f"{q}modulation.lin.{s}")
        mv(f"{p}attn.norm_q.weight", f"{q}norm.query_norm.scale")
        mv(f"{p}attn.norm_k.weight", f"{q}norm.key_norm.scale")
    assert not sd, sorted(sd)
    return {"model.diffusion_model." + k: v.contiguous() for k, v in out.items()}


def sdcli_mu(seq_len):
    return 0.5 + (seq_len - 256) * (1.15 - 0.5) / (4096 - 256)


def reference_image():
    """A 32x16 picture for Kontext (-r): upstream's resize rule keeps its size for a 24x16 output
    (area 384 at aspect 2 rounds to 32x16), and diffusers' to the multiple of 4."""
    yy, xx = np.mgrid[0:16, 0:32].astype(np.float32)
    rgb = np.stack([0.5 + 0.45 * np.sin(xx / 5.0), 0.5 + 0.45 * np.cos(yy / 2.5), 1 - (xx + yy) / 48], -1)
    px = (rgb.clip(0, 1) * 255).round().astype(np.uint8)
    Image.fromarray(px, "RGB").save(f"{OUT}/kontext_ref.png")
    return Image.fromarray(px, "RGB")


def fill_reference(model, pipe, ae):
    """FLUX Fill under sd-cli's rules, as a loop over diffusers' transformer and VAE: the masked
    image (repainted pixels grey) encoded, each latent pixel's f x f mask pixels as channels (dx + f*dy),
    strength 1 (pure noise at sigma 1), and every denoised estimate blended with the init latent outside
    the mask widened by one latent pixel (diffusers' FluxFillPipeline does not blend)."""
    f = pipe.vae_scale_factor
    lh, lw = H // f, W // f
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    rgb = np.stack([0.5 + 0.4 * np.cos(xx / 3.0), 0.5 + 0.4 * np.sin(yy / 4.0), (W - xx + yy) / (W + H)], -1)
    px = (rgb.clip(0, 1) * 255).round().astype(np.uint8)
    Image.fromarray(px, "RGB").save(f"{OUT}/fill_init.png")
    m = np.zeros((H, W), np.uint8)
    m[2:11, 7:19] = 255
    m[14, 3] = 150
    Image.fromarray(m, "L").save(f"{OUT}/fill_mask.png")
    x = torch.from_numpy(px.astype(np.float32) / 255).permute(2, 0, 1)[None]
    mask = torch.from_numpy((m.astype(np.float32) / 255).round())[None, None]
    sc, sh = ae.config.scaling_factor, ae.config.shift_factor
    with torch.no_grad():
        enc = lambda im: (ae.encode(im * 2 - 1).latent_dist.mean - sh) * sc  # noqa: E731
        init = enc(x)
        masked = enc((1 - mask) * (x - 0.5) + 0.5)
        mask_ch = mask[:, 0].view(1, lh, f, lw, f).permute(0, 2, 4, 1, 3).reshape(1, f * f, lh, lw)
        fill = torch.cat([masked, mask_ch], 1)
        dilated = torch.nn.functional.max_pool2d(torch.nn.functional.max_pool2d(mask, f), 3, stride=1, padding=1)
        emb, pooled, txt_ids = pipe.encode_prompt(PROMPT, None, max_sequence_length=256)
        pack = lambda t: FluxPipeline._pack_latents(t, 1, t.shape[1], lh, lw)  # noqa: E731
        img_ids = FluxPipeline._prepare_latent_image_ids(1, lh // 2, lw // 2, "cpu", torch.float32)
        n = 4
        mu = sdcli_mu(lh * lw)
        base = np.linspace(1.0, 1 / n, n)
        sig = [float(np.exp(mu) / (np.exp(mu) + (1 / s - 1))) for s in base] + [0.0]
        lat = torch.randn(1, 16, lh, lw, generator=torch.Generator().manual_seed(SEED))
        for i in range(n):
            s0, s1 = sig[i], sig[i + 1]
            v = model(hidden_states=torch.cat([pack(lat), pack(fill)], 2), encoder_hidden_states=emb,
                      pooled_projections=pooled, timestep=torch.tensor([s0]), img_ids=img_ids, txt_ids=txt_ids,
                      guidance=torch.tensor([3.5])).sample
            v = FluxPipeline._unpack_latents(v, H, W, f)
            den = lat - s0 * v
            den = den * dilated + init * (1 - dilated)
            lat = lat + (s1 - s0) * (lat - den) / s0
        image = (ae.decode(lat / sc + sh).sample / 2 + 0.5).clamp(0, 1)
    return image[0]


class KeyMaskProcessor:
    """FluxAttnProcessor with sd-cli's Chroma mask: padded text keys masked for every query.
    (diffusers 0.42.1 builds a float query x key mask that SDPA adds to the logits instead.)"""
    key_mask = None

    def __init__(self):
        from diffusers.models.transformers.transformer_flux import FluxAttnProcessor
        self.inner = FluxAttnProcessor()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        return self.inner(attn, hidden_states, encoder_hidden_states, KeyMaskProcessor.key_mask, image_rotary_emb)


def chroma_reference(model, t5, t5_tok, ae, cfg, negative):
    """Chroma under sd-cli's rules, as a loop over diffusers' ChromaTransformer2DModel: T5 over 512
    tokens without its mask, the DiT masking text keys past the prompt's tokens and one pad, CFG."""
    f = 2 ** (len(ae.config.block_out_channels) - 1)
    lh, lw = H // f, W // f
    for blk in list(model.transformer_blocks) + list(model.single_transformer_blocks):
        blk.attn.set_processor(KeyMaskProcessor())

    def encode(text):
        tok = t5_tok(text, padding="max_length", max_length=512, truncation=True, return_tensors="pt")
        emb = t5(tok.input_ids).last_hidden_state
        real = int(tok.attention_mask.sum())
        keep = torch.zeros(512, dtype=torch.bool)
        keep[:real + 1] = True
        return emb, keep

    with torch.no_grad():
        conds = [encode(PROMPT), encode(negative)]
        pack = lambda t: FluxPipeline._pack_latents(t, 1, t.shape[1], lh, lw)  # noqa: E731
        img_ids = FluxPipeline._prepare_latent_image_ids(1, lh // 2, lw // 2, "cpu", torch.float32)
        txt_ids = torch.zeros(512, 3)
        n = 4
        mu = sdcli_mu(lh * lw)
        base = np.linspace(1.0, 1 / n, n)
        sig = [float(np.exp(mu) / (np.exp(mu) + (1 / s - 1))) for s in base] + [0.0]
        lat = torch.randn(1, 16, lh, lw, generator=torch.Generator().manual_seed(SEED))
        for i in range(n):
            s0, s1 = sig[i], sig[i + 1]
            vs = []
            for emb, keep in conds:
                KeyMaskProcessor.key_mask = torch.cat([keep, torch.ones(img_ids.shape[0], dtype=torch.bool)])[
                    None, None, None, :]
                v = model(hidden_states=pack(lat), encoder_hidden_states=emb, timestep=torch.tensor([s0]),
                          img_ids=img_ids, txt_ids=txt_ids).sample
                vs.append(FluxPipeline._unpack_latents(v, H, W, f))
            v = vs[1] + cfg * (vs[0] - vs[1])
            lat = lat + (s1 - s0) * v
        image = (ae.decode(lat / ae.config.scaling_factor + ae.config.shift_factor).sample / 2 + 0.5).clamp(0, 1)
    return image[0]


def chroma_to_bfl(model):
    """diffusers ChromaTransformer2DModel state → BFL/ComfyUI Chroma names."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {}
    for k, v in sd.items():
        k2 = (k.replace("x_embedder", "img_in").replace("context_embedder", "txt_in")
              .replace("proj_out", "final_layer.linear") if not k.startswith("single_transformer_blocks") else k)
        if k2.startswith("distilled_guidance_layer."):
            k2 = k2.replace(".linear_1.", ".in_layer.").replace(".linear_2.", ".out_layer.")
            if ".norms." in k2:
                k2 = k2.replace(".weight", ".scale")
        out[k2] = v
    res = {}
    for k in list(out):
        if not (k.startswith("transformer_blocks.") or k.startswith("single_transformer_blocks.")):
            res["model.diffusion_model." + k] = out.pop(k).contiguous()
    blocks = out
    for i in range(len(model.transformer_blocks)):
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for s in ("weight", "bias"):
            res[f"model.diffusion_model.{q}img_attn.qkv.{s}"] = torch.cat([blocks.pop(f"{p}attn.to_{x}.{s}") for x in "qkv"], 0)
            res[f"model.diffusion_model.{q}txt_attn.qkv.{s}"] = torch.cat(
                [blocks.pop(f"{p}attn.add_{x}_proj.{s}") for x in "qkv"], 0)
            for a, b in [("attn.to_out.0", "img_attn.proj"), ("attn.to_add_out", "txt_attn.proj"),
                         ("ff.net.0.proj", "img_mlp.0"), ("ff.net.2", "img_mlp.2"),
                         ("ff_context.net.0.proj", "txt_mlp.0"), ("ff_context.net.2", "txt_mlp.2")]:
                res[f"model.diffusion_model.{q}{b}.{s}"] = blocks.pop(f"{p}{a}.{s}")
        for a, b in [("attn.norm_q", "img_attn.norm.query_norm"), ("attn.norm_k", "img_attn.norm.key_norm"),
                     ("attn.norm_added_q", "txt_attn.norm.query_norm"), ("attn.norm_added_k", "txt_attn.norm.key_norm")]:
            res[f"model.diffusion_model.{q}{b}.scale"] = blocks.pop(f"{p}{a}.weight")
    for i in range(len(model.single_transformer_blocks)):
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for s in ("weight", "bias"):
            res[f"model.diffusion_model.{q}linear1.{s}"] = torch.cat(
                [blocks.pop(f"{p}attn.to_{x}.{s}") for x in "qkv"] + [blocks.pop(f"{p}proj_mlp.{s}")], 0)
            res[f"model.diffusion_model.{q}linear2.{s}"] = blocks.pop(f"{p}proj_out.{s}")
        res[f"model.diffusion_model.{q}norm.query_norm.scale"] = blocks.pop(f"{p}attn.norm_q.weight")
        res[f"model.diffusion_model.{q}norm.key_norm.scale"] = blocks.pop(f"{p}attn.norm_k.weight")
    assert not blocks, sorted(blocks)
    return {k: v.contiguous() for k, v in res.items()}


def run_pipeline(pipe, guidance, **extra):
    captured = {}
    orig = pipe.vae.decode

    def hook(z, *a, **k):
        captured["latent"] = z.detach().clone()
        return orig(z, *a, **k)

    pipe.vae.decode = hook
    latent_pixels = (H // pipe.vae_scale_factor) * (W // pipe.vae_scale_factor)
    saved = pipeline_flux.calculate_shift, pipeline_flux_kontext.calculate_shift
    pipeline_flux.calculate_shift = lambda *a, **k: sdcli_mu(latent_pixels)
    pipeline_flux_kontext.calculate_shift = pipeline_flux.calculate_shift
    try:
        with torch.no_grad():
            image = pipe(prompt=PROMPT, num_inference_steps=4, guidance_scale=guidance, height=H, width=W,
                         max_sequence_length=256, generator=torch.Generator().manual_seed(SEED),
                         output_type="np", **extra).images[0]
    finally:
        pipeline_flux.calculate_shift, pipeline_flux_kontext.calculate_shift = saved
        pipe.vae.decode = orig
    return image, captured["latent"]


def skip_call(model, x, txt, pooled, img_ids, txt_ids):
    """The dev call without double block 0 and single block 1: sd-cli's --skip-layers [0,3] (single
    blocks count after the double ones, as upstream numbers them)."""
    double, single = model.transformer_blocks, model.single_transformer_blocks
    model.transformer_blocks = torch.nn.ModuleList(list(double)[1:])
    model.single_transformer_blocks = torch.nn.ModuleList([b for i, b in enumerate(single) if i != 1])
    try:
        with torch.no_grad():
            return model(hidden_states=x, encoder_hidden_states=txt, pooled_projections=pooled,
                         timestep=torch.tensor([0.7]), img_ids=img_ids, txt_ids=txt_ids,
                         guidance=torch.tensor([3.5])).sample[0]
    finally:
        model.transformer_blocks, model.single_transformer_blocks = double, single


def main():
    os.makedirs(OUT, exist_ok=True)
    clip = CLIPTextModel.from_pretrained(f"{SD1}/text_encoder", torch_dtype=torch.float32).eval()
    t5 = T5EncoderModel.from_pretrained(f"{PIXART}/text_encoder").eval()
    t5_tok = T5TokenizerFast(tokenizer_file=T5_TOKENIZER)
    clip_tok = spf.tokenizer("<|endoftext|>")
    dev, schnell, ae = transformer(31, True), transformer(32, False), vae()
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_image_seq_len=256,
                                            max_image_seq_len=4096, base_shift=0.5, max_shift=1.15)
    refs = {}
    images = {}
    for name, model, guidance in [("dev", dev, 3.5), ("schnell", schnell, 0.0)]:
        pipe = FluxPipeline(scheduler=sched, vae=ae, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                            tokenizer_2=t5_tok, transformer=model)
        image, latent = run_pipeline(pipe, guidance)
        images[name] = image
        refs[f"{name}_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
        refs[f"{name}_latent"] = latent[0].contiguous()
        print(name, "image", image.shape, float(image.min()), float(image.max()),
              "saturated", float(((image <= 0) | (image >= 1)).mean()))
        if name == "dev":
            with torch.no_grad():
                emb, pooled, _ = pipe.encode_prompt(PROMPT, None, max_sequence_length=256)
            refs["t5"] = emb[0].contiguous()
            refs["pooled"] = pooled[0].contiguous()

    # LoRA (diffusers/PEFT names, no alpha: scale 1) on the schnell model, whose BFL file fuses
    # q/k/v (double blocks) and q/k/v + MLP input (single blocks): the LoRA lands on row slices.
    torch.manual_seed(36)
    targets = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_v", "transformer_blocks.1.attn.add_k_proj",
               "transformer_blocks.0.attn.to_out.0", "single_transformer_blocks.0.attn.to_k",
               "single_transformer_blocks.1.proj_mlp", "single_transformer_blocks.0.proj_out", "x_embedder"]
    lora = {}
    lora_model = transformer(32, False)
    with torch.no_grad():
        mods = dict(lora_model.named_modules())
        for t in targets:
            w = mods[t].weight
            a = torch.randn(2, w.shape[1]) * 0.2
            b = torch.randn(w.shape[0], 2) * 0.2
            w.add_(b @ a)
            lora[f"transformer.{t}.lora_A.weight"] = a.contiguous()
            lora[f"transformer.{t}.lora_B.weight"] = b.contiguous()
    os.makedirs(f"{OUT}/loras", exist_ok=True)
    save_file(lora, f"{OUT}/loras/flux_peft.safetensors")
    pipe = FluxPipeline(scheduler=sched, vae=ae, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                        tokenizer_2=t5_tok, transformer=lora_model)
    image, _ = run_pipeline(pipe, 0.0)
    refs["lora_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()

    # Kontext: the dev model with a reference image (index 1 positions, tokens after the target's).
    os.makedirs(OUT, exist_ok=True)
    pipe = FluxKontextPipeline(scheduler=sched, vae=ae, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                               tokenizer_2=t5_tok, transformer=dev)
    image, _ = run_pipeline(pipe, 2.5, image=reference_image(), _auto_resize=False, max_area=W * H)
    refs["kontext_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
    print("kontext image", image.shape, float(image.min()), float(image.max()))

    # TAEF1 (--taesd): a tiny 16-channel AutoencoderTiny decoding the sampler latent as it is
    # (FluxPipeline divides by its scaling factor 1 and adds its shift 0).
    torch.manual_seed(34)
    from diffusers import AutoencoderTiny
    tae = AutoencoderTiny(in_channels=3, out_channels=3, encoder_block_out_channels=(32, 32),
                          decoder_block_out_channels=(32, 32), num_encoder_blocks=(1, 2), num_decoder_blocks=(2, 1),
                          latent_channels=16, upsampling_scaling_factor=2).eval()
    spf.randomize(tae, 0.1)
    with torch.no_grad():
        tae.decoder.layers[-1].weight.mul_(0.05)
        tae.decoder.layers[-1].bias.fill_(0.5)
    pipe = FluxPipeline(scheduler=sched, vae=tae, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                        tokenizer_2=t5_tok, transformer=dev)
    image, _ = run_pipeline(pipe, 3.5)
    refs["taef1_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
    tae.save_pretrained(f"{OUT}/taef1", safe_serialization=True)

    # FLUX Fill: a third tiny transformer taking [latent, masked latent, mask] per token.
    torch.manual_seed(33)
    fill_model = FluxTransformer2DModel(patch_size=1, in_channels=64 + 64 + 4 * 4, out_channels=64, num_layers=2,
                                        num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                                        joint_attention_dim=16, pooled_projection_dim=8, guidance_embeds=True,
                                        axes_dims_rope=AXES).eval()
    spf.randomize(fill_model, 0.1)
    with torch.no_grad():
        fill_model.proj_out.weight.mul_(0.5)
    pipe = FluxPipeline(scheduler=sched, vae=ae, text_encoder=clip, tokenizer=clip_tok, text_encoder_2=t5,
                        tokenizer_2=t5_tok, transformer=fill_model)
    refs["fill_image"] = fill_reference(fill_model, pipe, ae).contiguous()
    fill_model.save_pretrained(f"{OUT}/fill/transformer", safe_serialization=True)

    # Chroma: diffusers folder and BFL single file of one tiny model, CFG 4 with a negative prompt.
    from diffusers import ChromaTransformer2DModel
    torch.manual_seed(35)
    chroma = ChromaTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2,
                                      attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                                      axes_dims_rope=AXES, approximator_num_channels=64, approximator_hidden_dim=32,
                                      approximator_layers=2).eval()
    spf.randomize(chroma, 0.1)
    with torch.no_grad():
        chroma.proj_out.weight.mul_(0.5)
    chroma.save_pretrained(f"{OUT}/chroma/transformer", safe_serialization=True)
    # sd-cli's approximator RMS norms use eps 1e-6 (torch's nn.RMSNorm default is float32's eps).
    for norm in chroma.distilled_guidance_layer.norms:
        norm.eps = 1e-6
    save_file(chroma_to_bfl(chroma), f"{OUT}/chroma.safetensors")
    refs["chroma_image"] = chroma_reference(chroma, t5, t5_tok, ae, 4.0, "blurry").contiguous()
    with torch.no_grad():
        ids = t5_tok(PROMPT, padding="max_length", max_length=512, truncation=True, return_tensors="pt").input_ids
        refs["chroma_t5"] = t5(ids).last_hidden_state[0].contiguous()

    # One transformer call of each model on random inputs (positions as FluxPipeline builds them).
    torch.manual_seed(77)
    hl, wl = H // 2 // 2, W // 2 // 2
    x = torch.randn(1, hl * wl, 64)
    txt = torch.randn(1, 7, 16)
    pooled = torch.randn(1, 8)
    img_ids = FluxPipeline._prepare_latent_image_ids(1, hl, wl, "cpu", torch.float32)
    txt_ids = torch.zeros(7, 3)
    refs["call_x"], refs["call_txt"], refs["call_pooled"] = x[0], txt[0], pooled[0]
    with torch.no_grad():
        for name, model in [("dev", dev), ("schnell", schnell)]:
            out = model(hidden_states=x, encoder_hidden_states=txt, pooled_projections=pooled,
                        timestep=torch.tensor([0.7]), img_ids=img_ids, txt_ids=txt_ids,
                        guidance=torch.tensor([3.5]) if model.config.guidance_embeds else None).sample
            refs[f"call_{name}"] = out[0].contiguous()
        refs["call_dev_skip"] = skip_call(dev, x, txt, pooled, img_ids, txt_ids).contiguous()

    dev.save_pretrained(f"{OUT}/dev/transformer", safe_serialization=True)
    ae.save_pretrained(f"{OUT}/vae", safe_serialization=True)
    save_file(to_bfl(schnell), f"{OUT}/schnell.safetensors")
    save_file({k: v.float().contiguous() for k, v in refs.items()}, f"{OUT}/reference.safetensors")
    with open(f"{OUT}/prompt.json", "w") as f:
        json.dump({"prompt": PROMPT, "seed": SEED, "width": W, "height": H, "steps": 4, "axes": AXES}, f)


if __name__ == "__main__":
    main()
