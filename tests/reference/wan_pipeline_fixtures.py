"""Golden fixtures for Wan 2.1 text-to-video (tests/wan_pipeline.rs).

Run from the repository root:
    python3 tests/reference/wan_pipeline_fixtures.py

Writes tests/fixtures/wan/:
  transformer/           a tiny WanTransformer3DModel (2 blocks, 2 heads x 12, text width 16, FFN 48, 16 latent
                         channels, patch (1, 2, 2)) as a diffusers folder
  text_encoder/          a tiny transformers UMT5EncoderModel (d_model 16, 2 layers, 4 heads x 4, d_ff 24, the T5
                         v1.1 vocabulary of 32128 rows; weights rounded to f16 and stored so, `shared.weight` only),
                         driven by the shared
                         t5-v1_1 tokenizer (passed as --t5xxl-tokenizer)
  vae/                   a tiny AutoencoderKLWan (base 4, dim_mult [1, 2, 2, 2]: 8x spatial, 4x temporal, z 16,
                         Wan 2.1's latent statistics)
  reference.safetensors
    `prompt_states` / `negative_states`  umT5 states as WanPipeline makes them: the prompt padded to 512 tokens
                         (with </s>), the padding masked in attention and zeroed after, [512, 16]
    `video_cfg`          [F, 3, H, W] in [0, 1]: WanPipeline's loop (its transformer, CFG 5 with an empty negative
                         prompt, latents seed 42 (1, 16, T, h, w)) on sd-cli's `discrete` sigmas with shift 5,
                         4 euler steps, 9 frames of 64x48, decoded by the VAE
    `image_cfg`          [3, H, W]: the same loop with one latent frame (`-M img_gen`: a single image)
"""
import os
import sys

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from transformers import T5TokenizerFast, UMT5Config, UMT5EncoderModel

sys.path.insert(0, os.path.dirname(__file__))
from sd3_fixtures import sdcli_sigmas  # noqa: E402

OUT = "tests/fixtures/wan"
TOKENIZER = os.path.join(os.path.dirname(__file__), "../../../shared/tokenizers/t5-v1_1.tokenizer.json")
PROMPT = "A lovely cat walking on the grass."
SEED, W, H, FRAMES, STEPS, CFG, SHIFT = 42, 64, 48, 9, 4, 5.0, 5.0


def text_encoder():
    torch.manual_seed(3)
    cfg = UMT5Config(vocab_size=32128, d_model=16, d_kv=4, num_heads=4, d_ff=24, num_layers=2,
                     feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                     relative_attention_max_distance=128, tie_word_embeddings=False)
    model = UMT5EncoderModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "relative_attention_bias" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.3)
            p.copy_(p.half().float())
    model.save_pretrained(f"{OUT}/text_encoder", safe_serialization=True)
    # Store f16 (the values are already f16-exact): 1 MB instead of 2.
    sd = {k: v.half().contiguous() for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    save_file(sd, f"{OUT}/text_encoder/model.safetensors", metadata={"format": "pt"})
    return model


def transformer():
    torch.manual_seed(5)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
                                  out_channels=16, text_dim=16, freq_dim=256, ffn_dim=48, num_layers=2,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(f"{OUT}/transformer", safe_serialization=True)
    return model


def vae():
    torch.manual_seed(8)
    model = AutoencoderKLWan(base_dim=4, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                             temperal_downsample=[False, True, True]).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
            else:
                p.mul_(1.0)
    model.save_pretrained(f"{OUT}/vae", safe_serialization=True)
    return model


def states(te, tok, text):
    t = tok(text, padding="max_length", max_length=512, truncation=True, add_special_tokens=True,
            return_attention_mask=True, return_tensors="pt")
    with torch.no_grad():
        out = te(t.input_ids, t.attention_mask).last_hidden_state[0]
    n = int(t.attention_mask.sum())
    out[n:] = 0
    return out


def run(model, ae, cond, uncond, frames):
    """WanPipeline's loop on sd-cli's sigmas; returns the frames [F, 3, H, W] in [0, 1] and the latent."""
    t = (frames - 1) // 4 + 1
    x = torch.randn((1, 16, t, H // 8, W // 8), generator=torch.Generator().manual_seed(SEED))
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
    return (video / 2 + 0.5).clamp(0, 1).permute(1, 0, 2, 3).contiguous(), x


def main():
    os.makedirs(OUT, exist_ok=True)
    te, tok = text_encoder(), T5TokenizerFast(tokenizer_file=TOKENIZER)
    model, ae = transformer(), vae()
    cond, uncond = states(te, tok, PROMPT), states(te, tok, "")
    refs = {"prompt_states": cond.contiguous(), "negative_states": uncond.contiguous()}
    for name, frames in [("video_cfg", FRAMES), ("image_cfg", 1)]:
        video, x = run(model, ae, cond, uncond, frames)
        refs[name] = video if frames > 1 else video[0].contiguous()
        if frames > 1:
            refs["final_latent"] = x[0].contiguous()
        print(name, tuple(video.shape), float(video.min()), float(video.max()), "saturated",
              float(((video <= 0) | (video >= 1)).float().mean()))
    save_file(refs, f"{OUT}/reference.safetensors")


if __name__ == "__main__":
    main()
