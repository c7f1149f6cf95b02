"""Golden fixtures for SD3 / SD3.5 (tests/sd3_pipeline.rs).

Run from the repository root (after sd_pipeline_fixtures.py, pixart_pipeline_fixtures.py and
flux_fixtures.py, whose tiny CLIP-L, CLIP-G (SDXL's bigG), T5 and 16-channel VAE this reuses):
    python3 tests/reference/sd3_fixtures.py

Writes tests/fixtures/sd3/:
  sd35/transformer/          a tiny SD3Transformer2DModel with q/k RMS norms and a dual-attention first
                             block (SD3.5 medium's MMDiT-X), as a diffusers folder
  sd35.safetensors           the same SD3.5-medium-like model in Stability's names (x_block.attn2, as
                             sd3.5_medium.safetensors has it)
  sd3.safetensors            a tiny SD3 (no q/k norms) in Stability's single-file names (joint_blocks,
                             fused qkv, (shift, scale) adaptive norms, model.diffusion_model.)
  (CLIP-L is the SD fixtures' encoder, run by diffusers as CLIPTextModelWithProjection with an
   identity projection: sd-cli never projects CLIP-L's pooled state, diffusers does)
  reference.safetensors      StableDiffusion3Pipeline images and a transformer call of each model

StableDiffusion3Pipeline runs under sd-cli's rules (REFERENCE-NOTES 30): T5 over 77 tokens
(`max_sequence_length=77`), sd-cli's `discrete` flow sigmas (shift 3 applied once: the scheduler's own
shift is 1), the VAE's latent normalisation 1.5305 / 0.0609.
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from transformers import CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel, T5TokenizerFast

sys.path.insert(0, os.path.dirname(__file__))
import sd_pipeline_fixtures as spf  # noqa: E402

OUT = "tests/fixtures/sd3"
SD1, SDXL, PIXART, FLUX = ("tests/fixtures/sd_pipeline/sd1", "tests/fixtures/sd_pipeline/sdxl",
                           "tests/fixtures/pixart_pipeline", "tests/fixtures/flux")
T5_TOKENIZER = os.path.join(os.path.dirname(__file__), "../../../shared/tokenizers/t5-v1_1.tokenizer.json")
PROMPT, NEGATIVE = "A lovely cat, holding a sign.", "blurry"
SEED, W, H, STEPS, CFG = 42, 24, 16, 4, 4.5


def transformer(seed, qk_norm, dual):
    torch.manual_seed(seed)
    model = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=16,
                                  num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=32,
                                  pooled_projection_dim=20, out_channels=16, pos_embed_max_size=12,
                                  qk_norm=qk_norm, dual_attention_layers=dual).eval()
    spf.randomize(model, 0.1)
    with torch.no_grad():
        model.proj_out.weight.mul_(0.5)
        model.pos_embed.pos_embed.copy_(torch.randn_like(model.pos_embed.pos_embed) * 0.5)
    return model


def swap_halves(t):
    a, b = t.chunk(2, 0)
    return torch.cat([b, a], 0)


def to_sai(model):
    """diffusers SD3Transformer2DModel state (the model or its state dict) → Stability's single-file names."""
    state = model if isinstance(model, dict) else model.state_dict()
    sd = {k: v.detach().clone() for k, v in state.items()}
    out = {}
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks."))

    def mv(src, dst, f=lambda t: t):
        out[dst] = f(sd.pop(src))

    for s in ("weight", "bias"):
        mv(f"pos_embed.proj.{s}", f"x_embedder.proj.{s}")
        mv(f"time_text_embed.timestep_embedder.linear_1.{s}", f"t_embedder.mlp.0.{s}")
        mv(f"time_text_embed.timestep_embedder.linear_2.{s}", f"t_embedder.mlp.2.{s}")
        mv(f"time_text_embed.text_embedder.linear_1.{s}", f"y_embedder.mlp.0.{s}")
        mv(f"time_text_embed.text_embedder.linear_2.{s}", f"y_embedder.mlp.2.{s}")
        mv(f"context_embedder.{s}", f"context_embedder.{s}")
        mv(f"norm_out.linear.{s}", f"final_layer.adaLN_modulation.1.{s}", swap_halves)
        mv(f"proj_out.{s}", f"final_layer.linear.{s}")
    mv("pos_embed.pos_embed", "pos_embed")
    for i in range(depth):
        p, x, c = f"transformer_blocks.{i}.", f"joint_blocks.{i}.x_block.", f"joint_blocks.{i}.context_block."
        last = i + 1 == depth
        for s in ("weight", "bias"):
            mv(f"{p}norm1.linear.{s}", f"{x}adaLN_modulation.1.{s}")
            mv(f"{p}norm1_context.linear.{s}", f"{c}adaLN_modulation.1.{s}", swap_halves if last else (lambda t: t))
            out[f"{x}attn.qkv.{s}"] = torch.cat([sd.pop(f"{p}attn.to_{q}.{s}") for q in "qkv"], 0)
            out[f"{c}attn.qkv.{s}"] = torch.cat([sd.pop(f"{p}attn.add_{q}_proj.{s}") for q in "qkv"], 0)
            mv(f"{p}attn.to_out.0.{s}", f"{x}attn.proj.{s}")
            mv(f"{p}ff.net.0.proj.{s}", f"{x}mlp.fc1.{s}")
            mv(f"{p}ff.net.2.{s}", f"{x}mlp.fc2.{s}")
            if f"{p}attn2.to_q.{s}" in sd:  # SD3.5 medium's second image attention
                out[f"{x}attn2.qkv.{s}"] = torch.cat([sd.pop(f"{p}attn2.to_{q}.{s}") for q in "qkv"], 0)
                mv(f"{p}attn2.to_out.0.{s}", f"{x}attn2.proj.{s}")
            if not last:
                mv(f"{p}attn.to_add_out.{s}", f"{c}attn.proj.{s}")
                mv(f"{p}ff_context.net.0.proj.{s}", f"{c}mlp.fc1.{s}")
                mv(f"{p}ff_context.net.2.{s}", f"{c}mlp.fc2.{s}")
        for a, b in [("attn.norm_q", f"{x}attn.ln_q"), ("attn.norm_k", f"{x}attn.ln_k"),
                     ("attn.norm_added_q", f"{c}attn.ln_q"), ("attn.norm_added_k", f"{c}attn.ln_k"),
                     ("attn2.norm_q", f"{x}attn2.ln_q"), ("attn2.norm_k", f"{x}attn2.ln_k")]:
            if f"{p}{a}.weight" in sd:
                mv(f"{p}{a}.weight", f"{b}.weight")
    assert not sd, sorted(sd)
    return {"model.diffusion_model." + k: v.contiguous() for k, v in out.items()}


def sdcli_sigmas(n, shift=3.0):
    """sd-cli's `discrete` schedule for flow models: t = 999 … 0 evenly, σ = shift·s/(1 + (shift−1)s),
    s = (t + 1)/1000 (the trailing 0 is the scheduler's)."""
    ts = [999 - 999 / (n - 1) * i for i in range(n)]
    return [shift * ((t + 1) / 1000) / (1 + (shift - 1) * ((t + 1) / 1000)) for t in ts]


def slg_reference(model, pipe, vae, scale, layers, start, end):
    """CFG plus sd-cli's skip-layer guidance as a loop over diffusers' transformer: on steps s
    (1-based) with int(start*n) < s < int(end*n), n = the number of sigmas, the guided velocity gains
    scale * (cond - cond without `layers`) (diffusers' pipeline counts its window differently)."""
    f = 2 ** (len(vae.config.block_out_channels) - 1)
    lh, lw = H // f, W // f
    with torch.no_grad():
        ctx, nctx, pooled, npooled = pipe.encode_prompt(PROMPT, PROMPT, PROMPT, do_classifier_free_guidance=True,
                                                        negative_prompt=NEGATIVE, negative_prompt_2=NEGATIVE,
                                                        negative_prompt_3=NEGATIVE, max_sequence_length=77)
        sig = sdcli_sigmas(STEPS) + [0.0]
        x = torch.randn(1, 16, lh, lw, generator=torch.Generator().manual_seed(SEED)) * sig[0]
        run = lambda e, p, skip=None: model(hidden_states=x, encoder_hidden_states=e, pooled_projections=p,  # noqa
                                            timestep=torch.tensor([sig[i] * 1000]), skip_layers=skip).sample
        for i in range(STEPS):
            c, u = run(ctx, pooled), run(nctx, npooled)
            v = u + CFG * (c - u)
            if int(start * len(sig)) < i + 1 < int(end * len(sig)):
                v = v + scale * (c - run(ctx, pooled, layers))
            x = x + (sig[i + 1] - sig[i]) * v
        image = (vae.decode(x / 1.5305 + 0.0609).sample / 2 + 0.5).clamp(0, 1)
    return image[0]


def clip_l_with_identity_projection():
    base = CLIPTextModel.from_pretrained(f"{SD1}/text_encoder", torch_dtype=torch.float32).eval()
    cfg = base.config
    cfg.projection_dim = cfg.hidden_size
    model = CLIPTextModelWithProjection(cfg).eval()
    model.text_model.load_state_dict(base.state_dict())
    with torch.no_grad():
        model.text_projection.weight.copy_(torch.eye(cfg.hidden_size))
    return model


def main():
    os.makedirs(OUT, exist_ok=True)
    clip_l = clip_l_with_identity_projection()
    clip_g = CLIPTextModelWithProjection.from_pretrained(f"{SDXL}/text_encoder_2", torch_dtype=torch.float32).eval()
    t5 = T5EncoderModel.from_pretrained(f"{PIXART}/text_encoder").eval()
    vae = AutoencoderKL.from_pretrained(f"{FLUX}/vae").eval()
    vae.register_to_config(scaling_factor=1.5305, shift_factor=0.0609)
    sched = FlowMatchEulerDiscreteScheduler(shift=1.0)
    models = {"sd3": transformer(41, None, ()), "sd35": transformer(42, "rms_norm", (0,))}
    refs = {}
    for name, model in models.items():
        pipe = StableDiffusion3Pipeline(transformer=model, scheduler=sched, vae=vae, text_encoder=clip_l,
                                        tokenizer=spf.tokenizer("<|endoftext|>"), text_encoder_2=clip_g,
                                        tokenizer_2=spf.tokenizer("!"), text_encoder_3=t5,
                                        tokenizer_3=T5TokenizerFast(tokenizer_file=T5_TOKENIZER))
        with torch.no_grad():
            image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG, height=H,
                         width=W, sigmas=sdcli_sigmas(STEPS), max_sequence_length=77,
                         generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
            if name == "sd3":
                ctx, _, pooled, _ = pipe.encode_prompt(PROMPT, PROMPT, PROMPT, do_classifier_free_guidance=False,
                                                       max_sequence_length=77)
                refs["context"], refs["pooled"] = ctx[0].contiguous(), pooled[0].contiguous()
        if name == "sd3":
            with torch.no_grad():
                img2 = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG, height=H,
                            width=W, sigmas=sdcli_sigmas(STEPS, 2.0), max_sequence_length=77,
                            generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
            refs["sd3_shift2_image"] = torch.from_numpy(np.ascontiguousarray(img2)).float().permute(2, 0, 1).contiguous()
        refs[f"{name}_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
        print(name, "image", image.shape, float(image.min()), float(image.max()),
              "saturated", float(((image <= 0) | (image >= 1)).mean()))
        # One transformer call on random inputs.
        torch.manual_seed(7)
        x, c, p = torch.randn(1, 16, 8, 12), torch.randn(1, 9, 16), torch.randn(1, 20)
        with torch.no_grad():
            out = model(hidden_states=x, encoder_hidden_states=c, pooled_projections=p,
                        timestep=torch.tensor([700.0])).sample
        refs[f"{name}_call_x"], refs[f"{name}_call_ctx"], refs[f"{name}_call_pooled"] = x[0], c[0], p[0]
        refs[f"{name}_call_out"] = out[0].contiguous()
    # A diffusers/PEFT LoRA (no alpha: scale 1) on the SD3 model, whose Stability file fuses q/k/v.
    import copy
    torch.manual_seed(43)
    lora_model = copy.deepcopy(models["sd3"])
    lora = {}
    with torch.no_grad():
        mods = dict(lora_model.named_modules())
        for t in ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.add_v_proj",
                  "transformer_blocks.1.attn.to_k", "transformer_blocks.0.ff.net.2", "pos_embed.proj"]:
            w = mods[t].weight
            flat = w.reshape(w.shape[0], -1)
            a = torch.randn(2, flat.shape[1]) * 0.2
            b = torch.randn(w.shape[0], 2) * 0.2
            w.add_((b @ a).reshape(w.shape))
            lora[f"transformer.{t}.lora_A.weight"] = a.reshape(2, *w.shape[1:]).contiguous()
            lora[f"transformer.{t}.lora_B.weight"] = b.reshape(w.shape[0], 2, *([1] * (w.dim() - 2))).contiguous()
    os.makedirs(f"{OUT}/loras", exist_ok=True)
    save_file(lora, f"{OUT}/loras/sd3_peft.safetensors")
    pipe = StableDiffusion3Pipeline(transformer=lora_model, scheduler=sched, vae=vae, text_encoder=clip_l,
                                    tokenizer=spf.tokenizer("<|endoftext|>"), text_encoder_2=clip_g,
                                    tokenizer_2=spf.tokenizer("!"), text_encoder_3=t5,
                                    tokenizer_3=T5TokenizerFast(tokenizer_file=T5_TOKENIZER))
    with torch.no_grad():
        image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG, height=H,
                     width=W, sigmas=sdcli_sigmas(STEPS), max_sequence_length=77,
                     generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
    refs["lora_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()

    # Skip-layer guidance on the SD3.5-like model: --slg-scale 2.5 --skip-layers [1] over (0.2, 0.9).
    pipe = StableDiffusion3Pipeline(transformer=models["sd35"], scheduler=sched, vae=vae, text_encoder=clip_l,
                                    tokenizer=spf.tokenizer("<|endoftext|>"), text_encoder_2=clip_g,
                                    tokenizer_2=spf.tokenizer("!"), text_encoder_3=t5,
                                    tokenizer_3=T5TokenizerFast(tokenizer_file=T5_TOKENIZER))
    refs["slg_image"] = slg_reference(models["sd35"], pipe, vae, 2.5, [1], 0.2, 0.9).contiguous()

    # TAESD3 (--taesd): a 16-channel AutoencoderTiny (the FLUX fixtures' TAEF1 weights) decoding the
    # sampler latent as it is.
    from diffusers import AutoencoderTiny
    tae = AutoencoderTiny.from_pretrained(f"{FLUX}/taef1").eval()
    pipe = StableDiffusion3Pipeline(transformer=models["sd3"], scheduler=sched, vae=tae, text_encoder=clip_l,
                                    tokenizer=spf.tokenizer("<|endoftext|>"), text_encoder_2=clip_g,
                                    tokenizer_2=spf.tokenizer("!"), text_encoder_3=t5,
                                    tokenizer_3=T5TokenizerFast(tokenizer_file=T5_TOKENIZER))
    with torch.no_grad():
        image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG, height=H,
                     width=W, sigmas=sdcli_sigmas(STEPS), max_sequence_length=77,
                     generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
    refs["taesd3_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
    models["sd35"].save_pretrained(f"{OUT}/sd35/transformer", safe_serialization=True)
    save_file(to_sai(models["sd3"]), f"{OUT}/sd3.safetensors")
    save_file(to_sai(models["sd35"]), f"{OUT}/sd35.safetensors")
    save_file({k: v.float().contiguous() for k, v in refs.items()}, f"{OUT}/reference.safetensors")


if __name__ == "__main__":
    main()
