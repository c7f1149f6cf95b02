"""Golden fixtures for the UNet (tests/unet_parity.rs).

Run from the repository root:  python3 tests/reference/unet_fixtures.py
Writes, for each variant under tests/fixtures/unet/<variant>/:
  diffusers/config.json, diffusers/diffusion_pytorch_model.safetensors
      a tiny random diffusers `UNet2DConditionModel` (weights stored f16; every weight is an f16
      value, and the references are computed in f32 with those values)
  ldm.safetensors
      the same weights in the LDM single-file layout (`model.diffusion_model.` prefix,
      `input_blocks.N.M`, `middle_block`, `output_blocks`, `in_layers/emb_layers/out_layers/
      skip_connection`), numbered as LDM's `UNetModel` numbers its blocks; for 2 resnets per
      level the names are checked against stable-diffusion.cpp's own diffusers -> LDM tables
      (name_conversion.cpp, transcribed below)
  io.safetensors
      in.x [2, C, H, W], in.t [2] (DDPM timesteps), in.context [2, n, D]; SDXL-style variants
      also in.pooled [2, P] and in.time_ids [2, 6 or 5]; out.y = the model output for batch 2.
      The sdxl variant also has in.x_odd / out.y_odd: a latent whose sizes do not halve
      evenly (diffusers' upsample_size path).
Tensors keep PyTorch's row-major layout; the Rust side reads the shapes reversed (ggml order).

The models compute as diffusers does (resnet/output GroupNorm eps 1e-5, exact GELU in the GEGLU);
stable-diffusion.cpp's 1e-6 and tanh GELU differ only at rounding level.
Widths are tiny (8/16 channels, 4 norm groups) to keep each file well under 1 MB.
"""
import json
import os
import re

import torch
from safetensors.torch import save_file
from diffusers import UNet2DConditionModel

OUT = "tests/fixtures/unet"
LDM_PREFIX = "model.diffusion_model."


COMMON = dict(
    in_channels=4,
    out_channels=4,
    norm_num_groups=4,
    cross_attention_dim=32,
    sample_size=8,
)
SDXL_DOWN = ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
SDXL_UP = ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D")
TEXT_TIME = dict(addition_embed_type="text_time", addition_time_embed_dim=8)

# name -> (config, latent (H, W), pooled width or None, micro-condition count)
VARIANTS = {
    # SD1.x: 1x1-conv projections, attention at every level but the deepest, 2 resnets/level.
    "sd1": (
        dict(
            block_out_channels=(8, 16),
            layers_per_block=2,
            attention_head_dim=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        ),
        (8, 12),
        None,
        0,
    ),
    # SD2.x: linear projections, per-level heads.
    "sd2": (
        dict(
            block_out_channels=(8, 16),
            layers_per_block=1,
            attention_head_dim=[2, 4],
            use_linear_projection=True,
            down_block_types=("CrossAttnDownBlock2D",) * 2,
            up_block_types=("CrossAttnUpBlock2D",) * 2,
        ),
        (16, 8),
        None,
        0,
    ),
    # SDXL base: no attention at level 0, deeper transformers below, text_time conditioning
    # with 6 micro-conditions.
    "sdxl": (
        dict(
            block_out_channels=(8, 16, 16),
            layers_per_block=1,
            attention_head_dim=[1, 2, 4],
            transformer_layers_per_block=[1, 2, 2],
            use_linear_projection=True,
            down_block_types=SDXL_DOWN,
            up_block_types=SDXL_UP,
            projection_class_embeddings_input_dim=16 + 6 * 8,
            **TEXT_TIME,
        ),
        (8, 12),
        16,
        6,
    ),
    # SDXL refiner: attention only in the middle levels, 5 micro-conditions (aesthetic score);
    # heads as stable-diffusion.cpp's default rule gives them (head size 64 -> 1 head here).
    "refiner": (
        dict(
            block_out_channels=(8, 16, 16),
            layers_per_block=1,
            attention_head_dim=1,
            transformer_layers_per_block=2,
            use_linear_projection=True,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            projection_class_embeddings_input_dim=24 + 5 * 8,
            **TEXT_TIME,
        ),
        (8, 8),
        24,
        5,
    ),
    # SSD-1B / Vega style: uneven per-block transformer depths and a mid block without its
    # transformer (a single resnet).
    "ssd1b": (
        dict(
            block_out_channels=(8, 16, 16),
            layers_per_block=2,
            attention_head_dim=[1, 2, 2],
            transformer_layers_per_block=[1, [1, 2], [2, 1]],
            reverse_transformer_layers_per_block=[[1, 2, 1], [2, 1, 1], [1, 1, 1]],
            mid_block_type="UNetMidBlock2D",
            use_linear_projection=True,
            down_block_types=SDXL_DOWN,
            up_block_types=SDXL_UP,
            projection_class_embeddings_input_dim=16 + 6 * 8,
            **TEXT_TIME,
        ),
        (12, 8),
        16,
        6,
    ),
}

RESNET_LDM = [
    ("norm1", "in_layers.0"),
    ("conv1", "in_layers.2"),
    ("time_emb_proj", "emb_layers.1"),
    ("norm2", "out_layers.0"),
    ("conv2", "out_layers.3"),
    ("conv_shortcut", "skip_connection"),
]
TOP_LDM = {
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "add_embedding.linear_1": "label_emb.0.0",
    "add_embedding.linear_2": "label_emb.0.2",
    "conv_in": "input_blocks.0.0",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
}


def ldm_numbering(config):
    """LDM `UNetModel` block indices: input block per resnet and per down-sampler, output block
    per up resnet (one more per level), the up-sampler after the level's last block."""
    levels = len(config["block_out_channels"])
    n = config["layers_per_block"]
    up_attn = [t.startswith("CrossAttn") for t in config["up_block_types"]]
    down_res, down_sampler, up_res, up_sampler = {}, {}, {}, {}
    idx = 0
    for i in range(levels):
        for j in range(n):
            idx += 1
            down_res[(i, j)] = idx
        if i < levels - 1:
            idx += 1
            down_sampler[i] = idx
    idx = 0
    for i in range(levels):
        for j in range(n + 1):
            up_res[(i, j)] = idx
            idx += 1
        if i < levels - 1:
            # After the resnet (.0) and, when the level has one, the transformer (.1).
            up_sampler[i] = f"{up_res[(i, n)]}.{2 if up_attn[i] else 1}"
    return down_res, down_sampler, up_res, up_sampler


def to_ldm(config, key):
    down_res, down_sampler, up_res, up_sampler = ldm_numbering(config)
    for hf, sd in TOP_LDM.items():
        if key.startswith(hf + "."):
            return sd + key[len(hf):]

    def resnet_leaf(rest):
        for hf, sd in RESNET_LDM:
            if rest.startswith(hf + "."):
                return sd + rest[len(hf):]
        raise ValueError(rest)

    m = re.match(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key)
    if m:
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"input_blocks.{down_res[(i, j)]}.0.{resnet_leaf(rest)}"
    m = re.match(r"down_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", key)
    if m:
        return f"input_blocks.{down_res[(int(m[1]), int(m[2]))]}.1.{m[3]}"
    m = re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", key)
    if m:
        return f"input_blocks.{down_sampler[int(m[1])]}.0.op.{m[2]}"
    m = re.match(r"mid_block\.resnets\.(\d+)\.(.*)", key)
    if m:
        return f"middle_block.{2 * int(m[1])}.{resnet_leaf(m[2])}"
    m = re.match(r"mid_block\.attentions\.(\d+)\.(.*)", key)
    if m:
        return f"middle_block.{2 * int(m[1]) + 1}.{m[2]}"
    m = re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key)
    if m:
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"output_blocks.{up_res[(i, j)]}.0.{resnet_leaf(rest)}"
    m = re.match(r"up_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", key)
    if m:
        return f"output_blocks.{up_res[(int(m[1]), int(m[2]))]}.1.{m[3]}"
    m = re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.(.*)", key)
    if m:
        return f"output_blocks.{up_sampler[int(m[1])]}.{m[2]}"
    raise ValueError(f"no LDM name for {key}")


def upstream_to_ldm(key, sdxl):
    """stable-diffusion.cpp's convert_diffusers_unet_to_original_{sd1,sdxl} (string replaces
    with SD's fixed 3 slots per level), transcribed to check `to_ldm`."""
    top = dict((v, k) for k, v in [
        ("time_embed.0.weight", "time_embedding.linear_1.weight"),
        ("time_embed.0.bias", "time_embedding.linear_1.bias"),
        ("time_embed.2.weight", "time_embedding.linear_2.weight"),
        ("time_embed.2.bias", "time_embedding.linear_2.bias"),
        ("input_blocks.0.0.weight", "conv_in.weight"),
        ("input_blocks.0.0.bias", "conv_in.bias"),
        ("out.0.weight", "conv_norm_out.weight"),
        ("out.0.bias", "conv_norm_out.bias"),
        ("out.2.weight", "conv_out.weight"),
        ("out.2.bias", "conv_out.bias"),
    ] + ([
        ("label_emb.0.0.weight", "add_embedding.linear_1.weight"),
        ("label_emb.0.0.bias", "add_embedding.linear_1.bias"),
        ("label_emb.0.2.weight", "add_embedding.linear_2.weight"),
        ("label_emb.0.2.bias", "add_embedding.linear_2.bias"),
    ] if sdxl else []))
    if key in top:
        return top[key]
    layer = []
    for i in range(3 if sdxl else 4):
        for j in range(2):
            layer.append((f"input_blocks.{3 * i + j + 1}.0.", f"down_blocks.{i}.resnets.{j}."))
            if (i > 0) if sdxl else (i < 3):
                layer.append((f"input_blocks.{3 * i + j + 1}.1.", f"down_blocks.{i}.attentions.{j}."))
        for j in range(4 if sdxl else 3):
            layer.append((f"output_blocks.{3 * i + j}.0.", f"up_blocks.{i}.resnets.{j}."))
            if (i < 2) if sdxl else True:
                layer.append((f"output_blocks.{3 * i + j}.1.", f"up_blocks.{i}.attentions.{j}."))
        if i < 3:
            layer.append((f"input_blocks.{3 * (i + 1)}.0.op.", f"down_blocks.{i}.downsamplers.0.conv."))
            layer.append((f"output_blocks.{3 * i + 2}.{1 if i == 0 else 2}.", f"up_blocks.{i}.upsamplers.0."))
    if sdxl:
        layer.append(("output_blocks.2.2.conv.", "output_blocks.2.1.conv."))
    layer.append(("middle_block.1.", "mid_block.attentions.0."))
    for j in range(2):
        layer.append((f"middle_block.{2 * j}.", f"mid_block.resnets.{j}."))
    out = key
    if "resnets" in out:
        for sd, hf in [(s, h) for h, s in RESNET_LDM]:
            out = out.replace(hf, sd, 1)
    for sd, hf in layer:
        out = out.replace(hf, sd, 1)
    return out


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                v = torch.randn(p.shape, generator=g) * 0.1
            elif p.ndim == 1:  # norm scales
                v = 1.0 + torch.randn(p.shape, generator=g) * 0.2
            else:
                v = torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5
            # Every weight an f16 value: the f16 files hold the exact f32 model.
            p.copy_(v.half().float())


def write(name, spec, seed):
    config, (h, w), pooled_dim, n_micro = spec
    config = {**COMMON, **config}
    model = UNet2DConditionModel(**config).eval()
    randomize(model, seed)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    base = os.path.join(OUT, name)
    folder = os.path.join(base, "diffusers")
    os.makedirs(folder, exist_ok=True)
    model.save_config(folder)
    save_file({k: v.half() for k, v in sd.items()}, os.path.join(folder, "diffusion_pytorch_model.safetensors"))

    ldm = {LDM_PREFIX + to_ldm(config, k): v.half() for k, v in sd.items()}
    assert len(ldm) == len(sd), "LDM names collide"
    if config["layers_per_block"] == 2:
        sdxl = pooled_dim is not None
        for k in sd:
            assert upstream_to_ldm(k, sdxl) == to_ldm(config, k), (k, upstream_to_ldm(k, sdxl), to_ldm(config, k))
    save_file(ldm, os.path.join(base, "ldm.safetensors"))

    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(2, 4, h, w, generator=g)
    t = torch.tensor([937.0, 41.5])
    ctx = torch.randn(2, 5, config["cross_attention_dim"], generator=g)
    io = {"in.x": x, "in.t": t, "in.context": ctx}
    kwargs = {}
    if pooled_dim is not None:
        pooled = torch.randn(2, pooled_dim, generator=g)
        px = (8 * h, 8 * w)
        if n_micro == 6:
            ids = [[*px, 0, 0, *px], [1024, 768, 32, 16, 512, 512]]
        else:
            ids = [[*px, 0, 0, 6.0], [1024, 768, 32, 16, 2.5]]
        time_ids = torch.tensor(ids, dtype=torch.float32)
        io["in.pooled"] = pooled
        io["in.time_ids"] = time_ids
        kwargs["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": time_ids}
    with torch.no_grad():
        io["out.y"] = model(x, t, encoder_hidden_states=ctx, **kwargs).sample
        if name == "sdxl":
            x_odd = torch.randn(2, 4, 6, 10, generator=g)
            io["in.x_odd"] = x_odd
            io["out.y_odd"] = model(x_odd, t, encoder_hidden_states=ctx, **kwargs).sample
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(base, "io.safetensors"))
    n = sum(v.numel() for v in sd.values())
    print(f"{name}: {n} parameters, output max |y| {io['out.y'].abs().max():.3f}")


if __name__ == "__main__":
    for i, (name, spec) in enumerate(VARIANTS.items()):
        write(name, spec, 1000 + i)
