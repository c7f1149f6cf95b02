"""Golden fixtures for the MiniMax-H3 transformer (tests/minimax_h3_dit_parity.rs).

Run from the repository root:  python3 tests/reference/minimax_h3_dit_fixtures.py
Builds a tiny random-weight diffusers `MiniMaxH3Transformer3DModel` (2 heads x 32 with
rope_freq_dim 4, so 24 of 32 head channels rotate; hidden 48, which is not heads x head_dim,
as in the released model; 2 blocks, 2 refiner blocks, ffn 40, 6 video / 5 audio latent
channels, patch (1, 2, 2), text dim 24, freq dim 64, timestep MLP 40 -> 20), runs it on CPU
in f32 on packed sequences laid out by diffusers' own pipeline steps
(`MiniMaxH3PrepareLayoutStep.build_packed_sequence`, `MiniMaxH3SetTimestepsStep.build_row_timesteps`)
and writes under tests/fixtures/minimax_h3_dit/:

- `diffusers/` (config.json + diffusion_pytorch_model.safetensors).
- `single.safetensors` + `single.borrow.json`: the same weights under the released
  single-file names (the inverse of diffusers' `convert_minimax_h3_transformer_checkpoint_to_diffusers`,
  checked against it), prefixed `model.diffusion_model.`; the fused `qkv_proj` / `mlp.fc1`
  tensors are stored, the rest borrowed from the diffusers file (tests/common `assemble_checkpoint`).
- `pruned.safetensors` + `pruned.borrow.json`: the original names with `time_embedder` replaced by an
  `adaln_t_table` of 11 rows, row i = silu(time_embedder(i / 10)) (the AdaLN curve-table
  variant; its AdaLN projections then take the table rows without a SiLU). diffusers has no
  such model: on timesteps on the grid it must equal the unpruned model exactly.
- `cases.safetensors`, per case: `<case>.video` [rows, 24] (conditioning rows first),
  `<case>.audio` [rows, 5] (channel-major: channel 0's latents, then channel 1's),
  `<case>.text` [L, 24], `<case>.tags` (text rows' modality tags), `<case>.params`
  [latent frames, latent height, latent width, audio latents, keyframes (0 none, 1 first,
  2 first + last), video t, audio t], diffusers' layout (`<case>.positions` [S, 3],
  `<case>.timestep_rows` [S] the timestep of every row) and the outputs
  `<case>.video_out` / `<case>.audio_out` of the generated rows. Cases: `t2va` (3 latent
  frames of 8x12, 7 audio latents, 9 text tokens with two video-tagged rows, t 0.63 / 0.41),
  `fl2va` (first and last keyframes, t 0.37 / 0.52), `grid` (t 0.6 / 0.3, both on the
  pruned table's grid, no keyframe: every row's timestep is on the grid).
"""

import json
import os

import torch
from safetensors.torch import save_file
from diffusers import MiniMaxH3Transformer3DModel
from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
)

OUT_DIR = "tests/fixtures/minimax_h3_dit"
PREFIX = "model.diffusion_model."
CONFIG = dict(
    num_attention_heads=2, attention_head_dim=32, hidden_size=48, num_layers=2,
    num_refiner_layers=2, ffn_dim=40, in_channels=6, audio_in_channels=5, patch_size=(1, 2, 2),
    text_dim=24, freq_dim=64, time_embed_hidden_dim=40, time_embed_dim=20, rope_freq_dim=4,
    rope_theta=10000.0,
)
GRID = 11

RENAMES = [
    ("token_refiner.refiner_blocks.", "token_refiner.blocks."),
    ("time_embedder.linear_1.", "time_embedder.proj_in."),
    ("time_embedder.linear_2.", "time_embedder.proj_out."),
    ("audio_proj_in.", "audio_patch_proj."),
    ("context_embedder.", "condition_proj."),
    ("norm_out.norm.", "final_layer.norm."),
    ("norm_out.linear.", "final_layer.adaln_proj.linear."),
    ("audio_proj_out.", "final_layer.audio_out."),
    ("proj_out.", "final_layer.video_out."),
    (".attn.norm_q.", ".attn.q_norm."),
    (".attn.norm_k.", ".attn.k_norm."),
    (".attn.to_out.0.", ".attn.out_proj."),
    (".ff.net.0.proj.", ".mlp.fc1."),
    (".ff.net.2.", ".mlp.fc2."),
]


def build():
    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(**CONFIG).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.6 / max(1, p.shape[-1]) ** 0.5 if p.ndim > 1 else 0.1))
    return model


def to_original(sd):
    """diffusers names -> the released single-file names (fused q/k/v, [gate; value] fc1)."""
    out, borrowed = {}, {}
    for k, v in sd.items():
        nk = k
        if nk.startswith("transformer_blocks."):
            nk = "blocks." + nk[len("transformer_blocks."):]
        if nk.startswith("proj_in."):
            nk = "video_patch_proj." + nk[len("proj_in."):]
        for a, b in RENAMES:
            if nk.startswith(a) or (a.startswith(".") and a in nk):
                nk = nk.replace(a, b, 1)
        if ".attn.to_k." in nk or ".attn.to_v." in nk:
            continue
        if ".attn.to_q." in nk:
            base = k[: -len("to_q.weight")]
            nk = nk.replace(".attn.to_q.", ".attn.qkv_proj.")
            out[nk] = torch.cat([sd[base + "to_q.weight"], sd[base + "to_k.weight"], sd[base + "to_v.weight"]])
            continue
        if ".mlp.fc1." in nk:
            value, gate = v.chunk(2, dim=0)
            out[nk] = torch.cat([gate, value]).contiguous()
            continue
        out[nk] = v.contiguous()
        borrowed[nk] = k
    inv = 1.0 / (CONFIG["rope_theta"] ** (torch.arange(0, 2 * CONFIG["rope_freq_dim"], 2).float()
                                           / (2 * CONFIG["rope_freq_dim"])))
    out["rope.inv_freq"] = inv
    return out, borrowed


def check_inverse(sd, original):
    back = convert_minimax_h3_transformer_checkpoint_to_diffusers(dict(original), dict(CONFIG))
    assert set(back) == set(sd), set(back) ^ set(sd)
    for k in sd:
        assert torch.equal(back[k], sd[k]), k


def layout(params, tags):
    frames, lh, lw, audio_n, keyframes, t_v, t_a = params
    anchors = [(), ("first",), ("first", "last")][keyframes]
    (pos, token_tags, vid_idx, aud_idx, txt_idx, ncv, nca) = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        tags, frames, lh, lw, audio_n, (1, 2, 2), 2, 2, 0, anchors)
    uniq, inv = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        vid_idx, aud_idx, ncv, nca, txt_idx.numel(), t_v, t_a, max(t_v, 0.999), 1.0)
    return pos, token_tags, vid_idx, aud_idx, txt_idx, ncv, uniq, inv


def run(model, video, audio, text, lay):
    pos, token_tags, vid_idx, aud_idx, txt_idx, ncv, uniq, inv = lay
    with torch.no_grad():
        v, a = model(hidden_states=video[None], audio_hidden_states=audio[None],
                     encoder_hidden_states=text[None], timestep=uniq, timestep_indices=inv,
                     token_tags=token_tags, position_ids=pos, video_indices=vid_idx,
                     audio_indices=aud_idx, text_indices=txt_idx, return_dict=False)
    return v[0, ncv:], a[0]


def save_pruned(model, original):
    """The AdaLN curve-table variant built from the unpruned weights."""
    with torch.no_grad():
        ts = torch.arange(GRID, dtype=torch.float32) / (GRID - 1)
        temb = model.time_embedder(model.time_proj(ts))
        table = torch.nn.functional.silu(temb).contiguous()
    save_file({PREFIX + "adaln_t_table": table}, os.path.join(OUT_DIR, "pruned.safetensors"))
    # Everything else borrowed from the single file's recipe and its own tensors.
    with open(os.path.join(OUT_DIR, "single.borrow.json")) as f:
        borrow = json.load(f)
    for k, v in original.items():
        if PREFIX + k not in borrow:
            borrow[PREFIX + k] = ["single.safetensors", PREFIX + k, list(v.shape)]
    borrow = {k: v for k, v in borrow.items() if not k.startswith(PREFIX + "time_embedder.")}
    with open(os.path.join(OUT_DIR, "pruned.borrow.json"), "w") as f:
        json.dump(borrow, f, indent=0, sort_keys=True)


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    model = build()
    model.save_pretrained(os.path.join(OUT_DIR, "diffusers"), safe_serialization=True)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    original, borrowed = to_original(sd)
    check_inverse(sd, {k: v for k, v in original.items()})
    weights = "diffusers/diffusion_pytorch_model.safetensors"
    borrow = {PREFIX + k: [weights, borrowed[k], list(original[k].shape)] for k in borrowed}
    own = {PREFIX + k: v for k, v in original.items() if k not in borrowed}
    save_file(own, os.path.join(OUT_DIR, "single.safetensors"))
    with open(os.path.join(OUT_DIR, "single.borrow.json"), "w") as f:
        json.dump(borrow, f, indent=0, sort_keys=True)
    save_pruned(model, original)

    g = torch.Generator().manual_seed(1)
    cases = {}
    specs = [
        ("t2va", [3, 8, 12, 7, 0, 0.63, 0.41], [1, 1, 0, 0, 1, 1, 1, 1, 1]),
        ("fl2va", [2, 6, 10, 5, 2, 0.37, 0.52], [1] * 6),
        ("grid", [2, 4, 6, 4, 0, 0.6, 0.3], [1] * 5),
    ]
    for name, params, tags in specs:
        tags = torch.tensor(tags)
        lay = layout(params, tags)
        pos, token_tags, vid_idx, aud_idx, txt_idx, ncv, uniq, inv = lay
        video = torch.randn(vid_idx.numel(), 24, generator=g)
        audio = torch.randn(aud_idx.numel(), 5, generator=g)
        text = torch.randn(txt_idx.numel(), 24, generator=g)
        v, a = run(model, video, audio, text, lay)
        cases[f"{name}.video"] = video
        cases[f"{name}.audio"] = audio
        cases[f"{name}.text"] = text
        cases[f"{name}.tags"] = tags.float()
        cases[f"{name}.params"] = torch.tensor(params, dtype=torch.float32)
        cases[f"{name}.positions"] = pos.float()
        cases[f"{name}.timestep_rows"] = uniq[inv].float()
        cases[f"{name}.video_out"] = v
        cases[f"{name}.audio_out"] = a
        print(name, "rows", pos.shape[0], "video", tuple(v.shape), "max", v.abs().max().item(),
              "audio max", a.abs().max().item())
    save_file({k: v.contiguous() for k, v in cases.items()}, os.path.join(OUT_DIR, "cases.safetensors"))


if __name__ == "__main__":
    main()
