"""Golden fixtures for Z-Image (tests/z_image_pipeline.rs).

Run from the repository root:
    python3 tests/reference/z_image_fixtures.py

Writes tests/fixtures/z_image/:
  transformer/               a tiny ZImageTransformer2DModel (dim 32, 2 heads x 16, rope axes [4, 6, 6],
                             1 + 1 refiner blocks, 2 main layers, captions of width 24) as a diffusers folder
  z_image.safetensors        the same weights in the released single-file names (fused attention.qkv,
                             attention.out, q_norm/k_norm, x_embedder, final_layer, model.diffusion_model.)
  text_encoder/              a tiny transformers Qwen3Model (hidden 24 = the transformer's caption width, 3 layers,
                             2 heads x 16, 1 KV head, rope theta 1e6) as a diffusers folder; tokenizer/ the tiny Qwen
                             tokenizer of tests/fixtures/qwen_tokenizer/tiny (run qwen_tokenizer_fixtures.py first)
  reference.safetensors      `{case}_ids` (the templated prompt's ids) and `{case}_states` (Qwen3 hidden_states[-2],
                             [L, 24]) per prompt; ZImagePipeline images `image_cfg` (guidance 3.5 = sd-cli cfg 4.5,
                             negative prompt) and `image_turbo` (guidance 0 = cfg 1), 4 euler steps on sd-cli's
                             `discrete` sigmas with shift 3 (the scheduler's own shift 1), FLUX fixtures' VAE;
                             `lora_image` (Turbo with loras/z_image_peft.safetensors merged, a PEFT LoRA);
                             `image_weighted` (Turbo, "A lovely (cat:1.5), holding a sign." with upstream's
                             emphasis: pieces tokenized apart, rows weighted, mean restored; `weighted_ids`);
                             transformer calls on random inputs: `call{i}_x` (latent [16, H, W]),
                             `call{i}_cap` (caption states [L, 24]), `call{i}_sigma` and `call{i}_out` (the
                             flow velocity: minus the model's output, as ZImagePipeline uses it); captions of
                             9 and 32 tokens (padding to 32 and none), grids 4x6 and 5x3 patches
"""
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3Model

sys.path.insert(0, os.path.dirname(__file__))
from sd3_fixtures import sdcli_sigmas  # noqa: E402

OUT = "tests/fixtures/z_image"
TOK = "tests/fixtures/qwen_tokenizer/tiny"
FLUX_VAE = "tests/fixtures/flux/vae"
PROMPT, NEGATIVE = "A lovely cat, holding a sign.", "blurry"
WEIGHTED = "A lovely (cat:1.5), holding a sign."
SEED, W, H, STEPS = 42, 48, 32, 4
TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def text_encoder():
    torch.manual_seed(11)
    cfg = Qwen3Config(vocab_size=1026, hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
                      max_position_embeddings=512, tie_word_embeddings=False)
    model = Qwen3Model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    return model


def encode(model, tok, text):
    """What sd-cli and ZImagePipeline feed the transformer: the templated prompt, every token, through
    hidden_states[-2] (no final norm)."""
    ids = tok(TEMPLATE.format(text), add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        states = model(input_ids=ids, output_hidden_states=True).hidden_states[-2][0]
    return ids[0], states


def transformer(seed):
    torch.manual_seed(seed)
    model = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2,
                                     n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=24, axes_dims=[4, 6, 6],
                                     axes_lens=[256, 64, 64]).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "norm_q" in name or "norm_k" in name \
                    or name == "cap_embedder.0.weight":
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    return model


def to_original(model):
    """diffusers names → the released single-file names (the inverse of diffusers' converter)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {}
    for k in list(sd):
        if k not in sd:  # a to_k / to_v already fused with its to_q
            continue
        v = sd.pop(k)
        k2 = k.replace("all_x_embedder.2-1.", "x_embedder.").replace("all_final_layer.2-1.", "final_layer.")
        k2 = k2.replace("attention.to_out.0.", "attention.out.")
        k2 = k2.replace("attention.norm_q.", "attention.q_norm.").replace("attention.norm_k.", "attention.k_norm.")
        if ".attention.to_q." in k2:
            base = k2.replace(".attention.to_q.", ".attention.qkv.")
            out[base] = torch.cat([v, sd.pop(k.replace("to_q", "to_k")), sd.pop(k.replace("to_q", "to_v"))], 0)
            continue
        if ".attention.to_k." in k2 or ".attention.to_v." in k2:
            raise AssertionError(f"{k} before its to_q")
        out[k2] = v
    return {"model.diffusion_model." + k: v.contiguous() for k, v in out.items()}


def main():
    os.makedirs(OUT, exist_ok=True)
    model = transformer(5)
    model.save_pretrained(f"{OUT}/transformer", safe_serialization=True)
    save_file(to_original(model), f"{OUT}/z_image.safetensors")
    refs = {}
    torch.manual_seed(9)
    for i, (h, w, l, sigma) in enumerate([(8, 12, 9, 0.7), (10, 6, 32, 0.25)]):
        x = torch.randn(16, h, w)
        cap = torch.randn(l, 24)
        with torch.no_grad():
            out = model([x.unsqueeze(1)], torch.tensor([1.0 - sigma]), [cap], return_dict=False)[0][0]
        refs[f"call{i}_x"], refs[f"call{i}_cap"] = x, cap
        refs[f"call{i}_sigma"] = torch.tensor([sigma])
        refs[f"call{i}_out"] = (-out[:, 0]).contiguous()
    # The whole pipeline (prompt embeddings given: the tiny tokenizer has no chat template).
    te, tok = text_encoder(), Qwen2Tokenizer.from_pretrained(TOK)
    te.save_pretrained(f"{OUT}/text_encoder", safe_serialization=True)
    shutil.copytree(TOK, f"{OUT}/tokenizer", dirs_exist_ok=True)
    emb = {}
    for case, text in [("prompt", PROMPT), ("negative", NEGATIVE), ("empty", "")]:
        ids, states = encode(te, tok, text)
        refs[f"{case}_ids"], refs[f"{case}_states"] = ids.float(), states.contiguous()
        emb[case] = states
    vae = AutoencoderKL.from_pretrained(FLUX_VAE).eval()
    sched = FlowMatchEulerDiscreteScheduler(shift=1.0)
    pipe = ZImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=model)
    for name, g, neg in [("image_cfg", 3.5, emb["negative"]), ("image_turbo", 0.0, None)]:
        with torch.no_grad():
            image = pipe(prompt_embeds=[emb["prompt"]], negative_prompt_embeds=None if neg is None else [neg],
                         guidance_scale=g, num_inference_steps=STEPS, sigmas=sdcli_sigmas(STEPS), height=H, width=W,
                         generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
        refs[name] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
        print(name, image.shape, float(image.min()), float(image.max()),
              "saturated", float(((image <= 0) | (image >= 1)).mean()))
    # Emphasis as upstream's LLM embedder applies it: template and prompt parts tokenized apart,
    # each token's state row scaled by its weight, then everything by (mean before / mean after).
    pieces = [("<|im_start|>user\n", 1.0), ("A lovely ", 1.0), ("cat", 1.5), (", holding a sign.", 1.0),
              ("<|im_end|>\n<|im_start|>assistant\n", 1.0)]  # upstream's parse of WEIGHTED in its template
    ids, weights = [], []
    for text, wt in pieces:
        t = tok(text, add_special_tokens=False).input_ids
        ids += t
        weights += [wt] * len(t)
    with torch.no_grad():
        states = te(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-2][0]
    before = states.mean()
    states = states * torch.tensor(weights)[:, None]
    states = states * (before / states.mean())
    refs["weighted_ids"] = torch.tensor(ids).float()
    pipe = ZImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=model)
    with torch.no_grad():
        image = pipe(prompt_embeds=[states], guidance_scale=0.0, num_inference_steps=STEPS, sigmas=sdcli_sigmas(STEPS),
                     height=H, width=W, generator=torch.Generator().manual_seed(SEED), output_type="np").images[0]
    refs["image_weighted"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()

    # A diffusers/PEFT LoRA (no alpha: scale 1) on q, v, the output projection, a feed-forward, a
    # refiner's key and the patch embedder; the single file's fused qkv takes q/k/v on row thirds.
    import copy
    torch.manual_seed(43)
    lora_model = copy.deepcopy(model)
    lora = {}
    with torch.no_grad():
        mods = dict(lora_model.named_modules())
        for t in ["layers.0.attention.to_q", "layers.1.attention.to_v", "layers.0.attention.to_out.0",
                  "layers.1.feed_forward.w2", "context_refiner.0.attention.to_k", "all_x_embedder.2-1"]:
            w = mods[t].weight
            a = torch.randn(2, w.shape[1]) * 0.2
            b = torch.randn(w.shape[0], 2) * 0.2
            w.add_(b @ a)
            lora[f"transformer.{t}.lora_A.weight"] = a.contiguous()
            lora[f"transformer.{t}.lora_B.weight"] = b.contiguous()
    os.makedirs(f"{OUT}/loras", exist_ok=True)
    save_file(lora, f"{OUT}/loras/z_image_peft.safetensors")
    pipe = ZImagePipeline(scheduler=sched, vae=vae, text_encoder=te, tokenizer=tok, transformer=lora_model)
    with torch.no_grad():
        image = pipe(prompt_embeds=[emb["prompt"]], guidance_scale=0.0, num_inference_steps=STEPS,
                     sigmas=sdcli_sigmas(STEPS), height=H, width=W, generator=torch.Generator().manual_seed(SEED),
                     output_type="np").images[0]
    refs["lora_image"] = torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()
    save_file(refs, f"{OUT}/reference.safetensors")


if __name__ == "__main__":
    main()
