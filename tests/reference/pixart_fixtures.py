"""Golden fixtures for the PixArt-α/Σ transformer (tests/pixart_parity.rs).

Run from the repository root:  python3 tests/reference/pixart_fixtures.py
Builds tiny random-weight diffusers `PixArtTransformer2DModel`s, runs one forward on CPU in f32
and writes, under tests/fixtures/pixart/:

- `<case>.safetensors`: diffusers weights under `w.`, inputs under `in.` and the reference
  output `out` (PyTorch [B, C, H, W] = ggml [W, H, C, B]).
- `<case>_original.safetensors`: the same weights renamed to the original PixArt repo layout
  (fused `attn.qkv` and `cross_attn.kv_linear`), i.e. the inverse of diffusers' conversion
  scripts, under `w.`. Its forward must reproduce `out` of `<case>`.

Cases: `sigma` (2 heads × 8, no micro-conditions) and `alpha_ms` (3 heads × 8, the α-1024-MS
resolution / aspect-ratio micro-conditions; the hidden size must divide by 3).
Inputs: a non-square 8×6 latent (W×H), batch 2 with different timesteps and a caption mask
that drops the last tokens of the second prompt.
"""
import os

import torch
from safetensors.torch import save_file
from diffusers import PixArtTransformer2DModel

OUT_DIR = "tests/fixtures/pixart"


def to_original(sd):
    """diffusers PixArt state dict -> original PixArt repo names (fused qkv / kv)."""
    top = {
        "pos_embed.proj.": "x_embedder.proj.",
        "adaln_single.emb.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
        "adaln_single.emb.timestep_embedder.linear_2.": "t_embedder.mlp.2.",
        "adaln_single.emb.resolution_embedder.linear_1.": "csize_embedder.mlp.0.",
        "adaln_single.emb.resolution_embedder.linear_2.": "csize_embedder.mlp.2.",
        "adaln_single.emb.aspect_ratio_embedder.linear_1.": "ar_embedder.mlp.0.",
        "adaln_single.emb.aspect_ratio_embedder.linear_2.": "ar_embedder.mlp.2.",
        "adaln_single.linear.": "t_block.1.",
        "caption_projection.linear_1.": "y_embedder.y_proj.fc1.",
        "caption_projection.linear_2.": "y_embedder.y_proj.fc2.",
        "proj_out.": "final_layer.linear.",
    }
    block = {
        "attn1.to_out.0.": "attn.proj.",
        "attn2.to_q.": "cross_attn.q_linear.",
        "attn2.to_out.0.": "cross_attn.proj.",
        "ff.net.0.proj.": "mlp.fc1.",
        "ff.net.2.": "mlp.fc2.",
        "scale_shift_table": "scale_shift_table",
    }
    out = {"final_layer.scale_shift_table": sd["scale_shift_table"]}
    n_layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks."))
    for k, v in sd.items():
        for a, b in top.items():
            if k.startswith(a):
                out[b + k[len(a):]] = v
    for i in range(n_layers):
        d = f"transformer_blocks.{i}."
        o = f"blocks.{i}."
        for a, b in block.items():
            for k, v in sd.items():
                if k.startswith(d + a):
                    out[o + b + k[len(d + a):]] = v
        for p in ("weight", "bias"):
            out[o + f"attn.qkv.{p}"] = torch.cat([sd[d + f"attn1.to_{n}.{p}"] for n in "qkv"], 0)
            out[o + f"cross_attn.kv_linear.{p}"] = torch.cat([sd[d + f"attn2.to_{n}.{p}"] for n in "kv"], 0)
    # Tensors of the original checkpoints that inference does not use.
    out["y_embedder.y_embedding"] = torch.zeros(3, sd["caption_projection.linear_1.weight"].shape[1])
    return out


def make_case(name, heads, head_dim, micro, seed):
    torch.manual_seed(seed)
    dim = heads * head_dim
    model = PixArtTransformer2DModel(
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=4,
        out_channels=8,
        num_layers=2,
        cross_attention_dim=dim,
        caption_channels=24,
        sample_size=8,
        patch_size=2,
        norm_type="ada_norm_single",
        use_additional_conditions=micro,
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)

    batch, n_txt = 2, 5
    x = torch.randn(batch, 4, 6, 8)  # [B, C, H, W]: an 8 (W) x 6 (H) latent
    t = torch.tensor([999.0, 333.0])
    ctx = torch.randn(batch, n_txt, 24)
    mask = torch.ones(batch, n_txt)
    mask[1, 3:] = 0.0  # the second prompt has 3 real tokens
    kwargs = {}
    inputs = {"in.x": x, "in.t": t, "in.context": ctx, "in.mask": mask}
    if micro:
        res = torch.tensor([[48.0, 64.0], [64.0, 40.0]])  # (h, w) in pixels
        ar = (res[:, 0] / res[:, 1]).unsqueeze(1)
        kwargs["added_cond_kwargs"] = {"resolution": res, "aspect_ratio": ar}
        inputs["in.resolution"] = res
        inputs["in.aspect_ratio"] = ar
    with torch.no_grad():
        out = model(
            x, encoder_hidden_states=ctx, timestep=t, encoder_attention_mask=mask, **kwargs
        ).sample
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tensors = {f"w.{k}": v for k, v in sd.items()}
    tensors.update({k: v.contiguous() for k, v in inputs.items()})
    tensors["out"] = out.contiguous()
    save_file(tensors, f"{OUT_DIR}/{name}.safetensors")
    orig = {f"w.{k}": v.contiguous() for k, v in to_original(sd).items()}
    save_file(orig, f"{OUT_DIR}/{name}_original.safetensors")
    print(f"{name}: {len(sd)} weights, out max |y| = {out.abs().max():.3f}")


if __name__ == "__main__":
    os.makedirs(OUT_DIR, exist_ok=True)
    make_case("sigma", heads=2, head_dim=8, micro=False, seed=20240)
    make_case("alpha_ms", heads=3, head_dim=8, micro=True, seed=20241)
