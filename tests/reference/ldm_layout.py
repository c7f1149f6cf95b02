"""diffusers -> original (CompVis/LDM, OpenCLIP) single-file names, for fixture scripts.

The inverse of diffusers' `convert_ldm_unet_checkpoint`, `convert_ldm_vae_checkpoint` and
`convert_open_clip_checkpoint` (diffusers.loaders.single_file_utils); each function is checked by
a round trip through diffusers' own converter in `check_*`.
"""
import re

import torch

RESNET = (("norm1.", "in_layers.0."), ("conv1.", "in_layers.2."), ("time_emb_proj.", "emb_layers.1."),
          ("norm2.", "out_layers.0."), ("conv2.", "out_layers.3."), ("conv_shortcut.", "skip_connection."))


def unet_key(key, config):
    """One diffusers UNet2DConditionModel key -> its LDM name (without `model.diffusion_model.`)."""
    per = config["layers_per_block"]
    top = {"conv_in.": "input_blocks.0.0.", "time_embedding.linear_1.": "time_embed.0.",
           "time_embedding.linear_2.": "time_embed.2.", "add_embedding.linear_1.": "label_emb.0.0.",
           "add_embedding.linear_2.": "label_emb.0.2.", "conv_norm_out.": "out.0.", "conv_out.": "out.2."}
    for d, l in top.items():
        if key.startswith(d):
            return l + key[len(d):]

    def resnet(rest):
        for d, l in RESNET:
            if rest.startswith(d):
                return l + rest[len(d):]
        raise KeyError(rest)

    m = re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", key)
    if m:
        b, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        idx = 1 + b * (per + 1) + j
        return f"input_blocks.{idx}.0.{resnet(rest)}" if kind == "resnets" else f"input_blocks.{idx}.1.{rest}"
    m = re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", key)
    if m:
        return f"input_blocks.{(int(m[1]) + 1) * (per + 1)}.0.op.{m[2]}"
    m = re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.(.*)", key)
    if m:
        kind, j, rest = m[1], int(m[2]), m[3]
        return f"middle_block.{2 * j}.{resnet(rest)}" if kind == "resnets" else f"middle_block.1.{rest}"
    m = re.match(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", key)
    if m:
        b, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        idx = b * (per + 1) + j
        return f"output_blocks.{idx}.0.{resnet(rest)}" if kind == "resnets" else f"output_blocks.{idx}.1.{rest}"
    m = re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", key)
    if m:
        b = int(m[1])
        has_attn = config["up_block_types"][b].startswith("CrossAttn")
        return f"output_blocks.{b * (per + 1) + per}.{2 if has_attn else 1}.conv.{m[2]}"
    raise KeyError(key)


def unet_to_ldm(sd, config, prefix="model.diffusion_model."):
    return {prefix + unet_key(k, config): v.contiguous() for k, v in sd.items()}


def vae_key(key, n_levels):
    k = key
    k = re.sub(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2.", k)
    k = re.sub(r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample.", k)

    def up(m, what):
        return f"decoder.up.{n_levels - 1 - int(m.group(1))}.{what}"

    k = re.sub(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.", lambda m: up(m, f"block.{m.group(2)}."), k)
    k = re.sub(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda m: up(m, "upsample."), k)
    k = re.sub(r"\.mid_block\.resnets\.(\d+)\.", lambda m: f".mid.block_{int(m.group(1)) + 1}.", k)
    k = k.replace(".mid_block.attentions.0.", ".mid.attn_1.")
    for old, new in (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."), ("to_v.", "v."),
                     ("to_out.0.", "proj_out.")):
        k = k.replace(f".attn_1.{old}", f".attn_1.{new}")
    k = k.replace("conv_shortcut.", "nin_shortcut.")
    k = k.replace("conv_norm_out.", "norm_out.")
    return k


def vae_to_ldm(sd, n_levels, prefix="first_stage_model."):
    out = {}
    for k, v in sd.items():
        lk = vae_key(k, n_levels)
        if ".attn_1." in lk and lk.endswith("weight") and v.ndim == 2:
            v = v[:, :, None, None]  # LDM attention projections are 1x1 convs
        out[prefix + lk] = v.contiguous()
    return out


def clip_to_openclip(sd, prefix):
    """transformers CLIPTextModel(WithProjection) state dict -> OpenCLIP names under `prefix`."""
    out = {}
    layers = {}
    for k, v in sd.items():
        if k.endswith("position_ids"):
            continue
        if k == "text_model.embeddings.token_embedding.weight":
            out[prefix + "token_embedding.weight"] = v
        elif k == "text_model.embeddings.position_embedding.weight":
            out[prefix + "positional_embedding"] = v
        elif k.startswith("text_model.final_layer_norm."):
            out[prefix + "ln_final." + k.rsplit(".", 1)[1]] = v
        elif k == "text_projection.weight":
            out[prefix + "text_projection"] = v.T.contiguous()
        else:
            m = re.match(r"text_model\.encoder\.layers\.(\d+)\.(.*)", k)
            if not m:
                raise KeyError(k)
            i, rest = int(m[1]), m[2]
            base = f"{prefix}transformer.resblocks.{i}."
            m2 = re.match(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
            if m2:
                layers.setdefault((i, m2[2]), {})[m2[1]] = v
                continue
            for d, o in (("layer_norm1.", "ln_1."), ("layer_norm2.", "ln_2."), ("mlp.fc1.", "mlp.c_fc."),
                         ("mlp.fc2.", "mlp.c_proj."), ("self_attn.out_proj.", "attn.out_proj.")):
                if rest.startswith(d):
                    out[base + o + rest[len(d):]] = v
                    break
            else:
                raise KeyError(k)
    for (i, kind), qkv in layers.items():
        out[f"{prefix}transformer.resblocks.{i}.attn.in_proj_{kind}"] = torch.cat(
            [qkv["q"], qkv["k"], qkv["v"]], 0).contiguous()
    return out


def check_unet(sd, config):
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
    back = convert_ldm_unet_checkpoint(unet_to_ldm(sd, config), dict(config))
    assert set(back) == set(sd), (set(sd) ^ set(back))
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def check_vae(sd, config):
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
    ldm = vae_to_ldm(sd, len(config["block_out_channels"]))
    back = convert_ldm_vae_checkpoint(ldm, dict(config))
    assert set(back) == set(sd), (set(sd) ^ set(back))
    assert all(torch.equal(back[k].reshape(sd[k].shape), sd[k]) for k in sd)


def hf_clip_state(model):
    """A CLIP text model's state dict under the `text_model.` names single files use
    (transformers 5 drops that level for CLIPTextModel)."""
    out = {}
    for k, v in model.state_dict().items():
        if k.endswith("position_ids"):
            continue
        if not (k.startswith("text_model.") or k.startswith("text_projection")):
            k = "text_model." + k
        out[k] = v
    return out


def check_openclip(model, prefix):
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint
    sd = hf_clip_state(model)
    back = convert_open_clip_checkpoint(model, clip_to_openclip(sd, prefix), prefix=prefix)
    back = {k: v for k, v in back.items() if not k.endswith("position_ids")}
    assert set(back) == set(sd), (set(sd) ^ set(back))
    assert all(torch.equal(back[k], sd[k]) for k in sd)
