"""Golden fixtures for the Wan transformer (tests/wan_dit_parity.rs).

Run from the repository root:  python3 tests/reference/wan_dit_fixtures.py
Builds two tiny random-weight diffusers `WanTransformer3DModel`s, runs them on CPU in f32 and
writes, under tests/fixtures/wan_dit/:

- `t2v/` (config.json + diffusion_pytorch_model.safetensors): T2V, patch (1, 2, 2),
  2 heads x 16 (rope axes [8, 4, 4]), 2 layers, 6 in / 4 out channels, text dim 24, freq
  dim 64, ffn 48, affine cross-attention norm.
- `t2v.single.safetensors` + `t2v.single.borrow.json`: the same weights under the Wan
  repository's names (the inverse of diffusers' `convert_wan_transformer_to_diffusers`,
  checked against it), prefixed `model.diffusion_model.` as ComfyUI / the official single
  files, as a recipe: every tensor is borrowed from the diffusers file by name (target name
  -> [file, source name, PyTorch shape]) and the test assembles the file (tests/common
  `assemble_checkpoint`), so git does not store the weights twice.
- `i2v/` and `i2v.single.*`: I2V with an FLF2V-style position table: image
  features of width 20 (two images x 5 tokens, position table of 10), `add_k_proj` /
  `add_v_proj`, no cross-attention norm, patch (2, 2, 2) (exercises temporal patches).
- `cases.safetensors`: per case `<case>.latent` [C, T, H, W] (ggml [W, H, T, C]),
  `<case>.text` [L, text_dim], `<case>.t` (one timestep, or one per patch frame),
  `<case>.image` [n, 20] (I2V) and the output `<case>.out` [C_out, T, H, W]. Cases: `t2v`
  (T=3, 8x12, 7 tokens, t=937), `t2v_late` (t=212.5), `t2v_frames` (per-frame timesteps
  [0, 640, 640], as Wan 2.2 TI2V with a conditioning frame), `t2v_odd` (T=2, 7x11: the
  reference zero-pads to whole patches and crops, as stable-diffusion.cpp), `i2v` (T=4,
  8x12, 512 text tokens, as diffusers' I2V attention hard-codes, t=811).
"""
import json
import os
import re

import torch
from safetensors.torch import save_file
from diffusers import WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

OUT_DIR = "tests/fixtures/wan_dit"
PREFIX = "model.diffusion_model."


def build(seed, **kw):
    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=6,
        out_channels=4,
        text_dim=24,
        freq_dim=64,
        ffn_dim=48,
        num_layers=2,
        **kw,
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("pos_embed"):
                p.copy_(0.5 * torch.randn_like(p))
            elif p.ndim >= 2:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


BLOCK_RULES = [
    ("attn1.", "self_attn."),
    ("attn2.", "cross_attn."),
    (".to_out.0.", ".o."),
    (".to_q.", ".q."),
    (".to_k.", ".k."),
    (".to_v.", ".v."),
    (".add_k_proj.", ".k_img."),
    (".add_v_proj.", ".v_img."),
    (".norm_added_k.", ".norm_k_img."),
    ("norm2.", "norm3."),  # diffusers' affine cross-attention norm is the original norm3
    ("ffn.net.0.proj.", "ffn.0."),
    ("ffn.net.2.", "ffn.2."),
    ("scale_shift_table", "modulation"),
]

TOP_RULES = {
    "condition_embedder.time_embedder.linear_1.": "time_embedding.0.",
    "condition_embedder.time_embedder.linear_2.": "time_embedding.2.",
    "condition_embedder.text_embedder.linear_1.": "text_embedding.0.",
    "condition_embedder.text_embedder.linear_2.": "text_embedding.2.",
    "condition_embedder.time_proj.": "time_projection.1.",
    "condition_embedder.image_embedder.norm1.": "img_emb.proj.0.",
    "condition_embedder.image_embedder.ff.net.0.proj.": "img_emb.proj.1.",
    "condition_embedder.image_embedder.ff.net.2.": "img_emb.proj.3.",
    "condition_embedder.image_embedder.norm2.": "img_emb.proj.4.",
    "condition_embedder.image_embedder.pos_embed": "img_emb.emb_pos",
    "scale_shift_table": "head.modulation",
    "proj_out.": "head.head.",
}


def to_original(sd):
    """diffusers names -> the Wan repository's names."""
    out = {}
    for k, v in sd.items():
        m = re.match(r"blocks\.(\d+)\.(.*)", k)
        if m:
            rest = m.group(2)
            for a, b in BLOCK_RULES:
                rest = rest.replace(a, b)
            nk = f"blocks.{m.group(1)}.{rest}"
        else:
            nk = k
            for a, b in TOP_RULES.items():
                if k.startswith(a):
                    nk = b + k[len(a):]
                    break
        out[nk] = v.contiguous()
    return out


def check_inverse(sd, original):
    back = convert_wan_transformer_to_diffusers({PREFIX + k: v for k, v in original.items()})
    # diffusers' converter has no rule for FLF2V's table; everything else must round-trip.
    back = {("condition_embedder.image_embedder.pos_embed" if k == "img_emb.emb_pos" else k): v
            for k, v in back.items()}
    assert set(back) == set(sd), set(back) ^ set(sd)
    for k in sd:
        assert torch.equal(back[k], sd[k]), k


def save(model, name):
    model.save_pretrained(os.path.join(OUT_DIR, name), safe_serialization=True)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    original = to_original(sd)
    check_inverse(sd, original)
    back = dict(zip(original, sd))  # to_original keeps the order
    weights = f"{name}/diffusion_pytorch_model.safetensors"
    borrow = {PREFIX + k: [weights, back[k], list(v.shape)] for k, v in original.items()}
    save_file({}, os.path.join(OUT_DIR, f"{name}.single.safetensors"))
    with open(os.path.join(OUT_DIR, f"{name}.single.borrow.json"), "w") as f:
        json.dump(borrow, f, indent=0, sort_keys=True)


def run(model, latent, text, t, image=None):
    with torch.no_grad():
        return model(hidden_states=latent, timestep=t, encoder_hidden_states=text,
                     encoder_hidden_states_image=image, return_dict=False)[0]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    cases = {}

    t2v = build(0)
    save(t2v, "t2v")
    latent = torch.randn(1, 6, 3, 8, 12, generator=g)
    text = torch.randn(1, 7, 24, generator=g)
    for name, t in [("t2v", 937.0), ("t2v_late", 212.5)]:
        cases[f"{name}.latent"] = latent[0].clone()
        cases[f"{name}.text"] = text[0].clone()
        cases[f"{name}.t"] = torch.tensor([t])
        cases[f"{name}.out"] = run(t2v, latent, text, torch.tensor([t]))[0]

    # Per-frame timesteps, given per token as the Wan 2.2 TI2V pipeline does.
    frames = torch.tensor([0.0, 640.0, 640.0])
    per_token = frames.repeat_interleave(4 * 6)[None]
    cases["t2v_frames.latent"] = latent[0].clone()
    cases["t2v_frames.text"] = text[0].clone()
    cases["t2v_frames.t"] = frames
    cases["t2v_frames.out"] = run(t2v, latent, text, per_token)[0]

    odd = torch.randn(1, 6, 2, 7, 11, generator=g)
    padded = torch.nn.functional.pad(odd, (0, 1, 0, 1))
    cases["t2v_odd.latent"] = odd[0]
    cases["t2v_odd.text"] = text[0].clone()
    cases["t2v_odd.t"] = torch.tensor([500.0])
    cases["t2v_odd.out"] = run(t2v, padded, text, torch.tensor([500.0]))[0][:, :, :7, :11].contiguous()

    i2v = build(2, patch_size=(2, 2, 2), image_dim=20, added_kv_proj_dim=32,
                pos_embed_seq_len=10, cross_attn_norm=False)
    save(i2v, "i2v")
    latent = torch.randn(1, 6, 4, 8, 12, generator=g)
    text = torch.randn(1, 512, 24, generator=g)
    image = torch.randn(2, 5, 20, generator=g)  # two images' CLIP tokens (FLF2V)
    cases["i2v.latent"] = latent[0]
    cases["i2v.text"] = text[0]
    cases["i2v.image"] = image.reshape(10, 20)
    cases["i2v.t"] = torch.tensor([811.0])
    cases["i2v.out"] = run(i2v, latent, text, torch.tensor([811.0]), image)[0]

    for k, v in cases.items():
        if k.endswith(".out"):
            print(k, tuple(v.shape), "max |out|", v.abs().max().item())
    save_file({k: v.contiguous() for k, v in cases.items()}, os.path.join(OUT_DIR, "cases.safetensors"))


if __name__ == "__main__":
    main()
