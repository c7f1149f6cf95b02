#!/usr/bin/env python3
"""Golden fixtures for the CLIP text encoder (tests/clip_parity.rs).

Run from the repository root:  python3 tests/reference/clip_fixtures.py

Two tiny random-weight transformers models stand in for the SD text encoders:

* `l`: `CLIPTextModel` like OpenAI CLIP ViT-L/14 (SD1, SDXL's first encoder): quick_gelu,
  hidden 48, 4 heads from config.json (head size 12, not CLIP's usual 64), intermediate 72,
  3 layers.
* `g`: `CLIPTextModelWithProjection` like OpenCLIP ViT-H / bigG (SD2, SDXL's second encoder):
  exact gelu, hidden 96 with one head (CLIP's head-size-64 rule: 96 / 64 → 1), intermediate 64,
  2 layers, projection 72 (not square, so a transposed projection cannot pass).

The tokenizer's ids need a 49408-row token table, too big to commit. The reference models have
that vocabulary, but their token table repeats the first V = 256 rows (row i = row i mod V);
the committed files keep only those V rows. A test runs the committed files on ids mapped with
`id mod V` (and textual-inversion ids 49408 + j to V + j), which selects the same rows, or
rebuilds the full table (tests/clip_parity.rs writes a GGUF) and runs the ids as they are.

Writes under tests/fixtures/clip/:

* l/text_encoder/   `save_pretrained` (config.json + model.safetensors): transformers 5 writes a
                    plain `CLIPTextModel` without the `text_model.` level.
* l_sd1.safetensors the same weights as an SD1 single file names them
                    (`cond_stage_model.transformer.text_model.*`).
* g/text_encoder_2/ `save_pretrained` of the projection model (`text_model.*`,
                    `text_projection.weight`), as diffusers' SDXL `text_encoder_2/`.
* g_openclip.safetensors  the same weights in OpenCLIP layout as SDXL single files name them
                    (`conditioner.embedders.1.model.*`: `token_embedding.weight`,
                    `positional_embedding`, `transformer.resblocks.N.{ln_1, ln_2,
                    attn.in_proj_weight/bias (q, k, v stacked by rows), attn.out_proj,
                    mlp.c_fc, mlp.c_proj}`, `ln_final`, `text_projection` = transposed
                    [width, proj], used as x @ P).
* cases.safetensors inputs and reference outputs (f32, CPU), per model m in {l, g} and case c:
    m.c.ids      int32 [n]  token ids as the conditioner passes them (BOS 49406, EOS 49407)
    m.c.extra    f32 [k, hidden]  textual-inversion rows appended after the vocabulary (ti only)
    m.c.pos      int32 [1]  pooled position: upstream's rule, the first EOS, else n - 1
    m.c.h{k}     f32 [n, hidden]  hidden state after k layers, no final LayerNorm
    m.c.h{k}_ln  the same through the final LayerNorm
                 (k = L and L - 1 for every case; every k in 0..=L for `short`)
    m.c.pooled   f32 [hidden]  final-LN hidden state of the last layer at `pos`
    g.c.pooled_proj  f32 [proj]  `pooled` through text_projection (transformers' text_embeds)
"""
import os
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

OUT = "tests/fixtures/clip"
VOCAB = 49408  # the CLIP tokenizer's vocabulary
V = 256  # token-table rows stored in the fixture files
BOS, EOS = 49406, 49407
torch.manual_seed(11)


def configs():
    common = dict(
        vocab_size=VOCAB,
        max_position_embeddings=77,
        layer_norm_eps=1e-5,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=1,
        attention_dropout=0.0,
    )
    l = CLIPTextConfig(
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=3,
        num_attention_heads=4,
        hidden_act="quick_gelu",
        projection_dim=48,
        **common,
    )
    g = CLIPTextConfig(
        hidden_size=96,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,
        hidden_act="gelu",
        projection_dim=72,
        **common,
    )
    return l, g


def randomize(model, hidden):
    """Weights with activations of a few units: CLIP's own init makes every layer a near no-op."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "token_embedding" in name:
                base = torch.randn(V, hidden)
                p.copy_(base.repeat(VOCAB // V, 1))
            elif "position_embedding" in name:
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                p.copy_(torch.randn_like(p) * (0.6 / hidden**0.5))
            else:
                p.copy_(torch.randn_like(p) * (1.0 / p.shape[1] ** 0.5))


def small_state(model):
    """The state dict with the token table cut to its V distinct rows."""
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    for k in sd:
        if k.endswith("token_embedding.weight"):
            assert torch.equal(sd[k][V : 2 * V], sd[k][:V])
            sd[k] = sd[k][:V].contiguous()
    return sd


def save_folder(model, cls, config, folder):
    """`save_pretrained` of a copy whose config says vocab V (the rows it really holds)."""
    small_cfg = CLIPTextConfig(**{**config.to_dict(), "vocab_size": V})
    small = cls(small_cfg).eval()
    sd = small_state(model)
    missing, unexpected = small.load_state_dict(sd, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    small.save_pretrained(folder, safe_serialization=True)
    for f in os.listdir(folder):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(folder, f))
    return load_file(os.path.join(folder, "model.safetensors"))


def openclip_layout(hf, prefix):
    """HF `text_model.*` / `text_projection.weight` → OpenCLIP names under `prefix`."""
    out = {}
    layer_parts = {}
    for k, v in hf.items():
        if k == "text_projection.weight":
            out[prefix + "text_projection"] = v.t().contiguous()
            continue
        k = k.removeprefix("text_model.")
        if k == "embeddings.token_embedding.weight":
            out[prefix + "token_embedding.weight"] = v
        elif k == "embeddings.position_embedding.weight":
            out[prefix + "positional_embedding"] = v
        elif k.startswith("final_layer_norm."):
            out[prefix + "ln_final." + k.split(".")[-1]] = v
        elif k.startswith("encoder.layers."):
            i, rest = k.removeprefix("encoder.layers.").split(".", 1)
            base = f"{prefix}transformer.resblocks.{i}."
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                _, proj, leaf = rest.split(".")
                layer_parts.setdefault((base, leaf), {})[proj] = v
                continue
            rest = (
                rest.replace("layer_norm1", "ln_1")
                .replace("layer_norm2", "ln_2")
                .replace("self_attn.out_proj", "attn.out_proj")
                .replace("mlp.fc1", "mlp.c_fc")
                .replace("mlp.fc2", "mlp.c_proj")
            )
            out[base + rest] = v
        else:
            raise KeyError(k)
    for (base, leaf), parts in layer_parts.items():
        fused = torch.cat([parts["q_proj"], parts["k_proj"], parts["v_proj"]], dim=0)
        out[base + "attn.in_proj_" + leaf] = fused.contiguous()
    return out


def with_extra_rows(model, extra):
    """A copy whose token table has `extra` rows appended (textual-inversion ids ≥ VOCAB)."""
    cfg = CLIPTextConfig(**{**model.config.to_dict(), "vocab_size": VOCAB + extra.shape[0]})
    m = type(model)(cfg).eval()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    key = next(k for k in sd if k.endswith("token_embedding.weight"))
    sd[key] = torch.cat([sd[key], extra], dim=0)
    m.load_state_dict(sd)
    return m


def first_eos(ids):
    """stable-diffusion.cpp's pooled position: the first EOS, else the last token."""
    hits = (ids == EOS).nonzero()
    return int(hits[0]) if len(hits) else len(ids) - 1


gen = torch.Generator().manual_seed(3)


def words(n):
    return torch.randint(1, BOS - 1, (n,), generator=gen)


def case_ids(kind):
    if kind == "eos_pad":  # SD1 / CLIP-L chunk: padded with EOS to 77
        ids = torch.cat([torch.tensor([BOS]), words(13), torch.tensor([EOS])])
        return torch.cat([ids, torch.full((77 - len(ids),), EOS)])
    if kind == "zero_pad":  # SD2 / SDXL bigG chunk: 0 after the first EOS
        ids = torch.cat([torch.tensor([BOS]), words(17), torch.tensor([EOS])])
        return torch.cat([ids, torch.zeros(77 - len(ids), dtype=torch.long)])
    if kind == "short":
        return torch.cat([torch.tensor([BOS]), words(7), torch.tensor([EOS])])
    if kind == "ti":  # three textual-inversion vectors in the middle, EOS padding
        ids = torch.cat(
            [
                torch.tensor([BOS]),
                words(3),
                torch.tensor([VOCAB, VOCAB + 1, VOCAB + 2]),
                words(2),
                torch.tensor([EOS]),
            ]
        )
        return torch.cat([ids, torch.full((20 - len(ids),), EOS)])
    if kind == "no_eos":  # truncated: the pooled position falls back to the last token
        return torch.cat([torch.tensor([BOS]), words(11)])
    raise KeyError(kind)


def reference(model, tag, kinds, cases):
    L = model.config.num_hidden_layers
    hidden = model.config.hidden_size
    text = model.text_model if hasattr(model, "text_model") else model
    for kind in kinds:
        ids = case_ids(kind)
        run = model
        if kind == "ti":
            extra = torch.randn(3, hidden, generator=gen)
            cases[f"{tag}.{kind}.extra"] = extra.contiguous()
            run = with_extra_rows(model, extra)
        run_text = run.text_model if hasattr(run, "text_model") else run
        with torch.no_grad():
            out = run(input_ids=ids[None], output_hidden_states=True)
        states = out.hidden_states
        assert len(states) == L + 1
        pos = first_eos(ids)
        cases[f"{tag}.{kind}.ids"] = ids.to(torch.int32)
        cases[f"{tag}.{kind}.pos"] = torch.tensor([pos], dtype=torch.int32)
        layers = range(L + 1) if kind == "short" else (L - 1, L)
        with torch.no_grad():
            for k in layers:
                h = states[k][0]
                cases[f"{tag}.{kind}.h{k}"] = h.contiguous()
                cases[f"{tag}.{kind}.h{k}_ln"] = run_text.final_layer_norm(h).contiguous()
            last = out.last_hidden_state[0]
            assert torch.allclose(last, run_text.final_layer_norm(states[L][0]), atol=1e-6)
            pooled = last[pos]
            cases[f"{tag}.{kind}.pooled"] = pooled.contiguous()
            if hasattr(run, "text_projection"):
                proj = run.text_projection(pooled)
                cases[f"{tag}.{kind}.pooled_proj"] = proj.contiguous()
                if kind != "no_eos":  # transformers pools the first EOS too
                    assert torch.allclose(out.text_embeds[0], proj, atol=1e-6)
            elif kind != "no_eos":
                assert torch.allclose(out.pooler_output[0], pooled, atol=1e-6)
        # The committed V-row table on ids mod V selects the same rows.
        if kind != "ti":
            with torch.no_grad():
                small_ids = ids % V
                again = text.embeddings.token_embedding(small_ids)
                assert torch.equal(again, text.embeddings.token_embedding(ids))


def main():
    os.makedirs(OUT, exist_ok=True)
    cfg_l, cfg_g = configs()
    cases = {}

    l = CLIPTextModel(cfg_l).eval()
    randomize(l, cfg_l.hidden_size)
    hf_l = save_folder(l, CLIPTextModel, cfg_l, os.path.join(OUT, "l", "text_encoder"))
    assert "embeddings.token_embedding.weight" in hf_l, sorted(hf_l)
    sd1 = {"cond_stage_model.transformer.text_model." + k: v for k, v in hf_l.items()}
    save_file(sd1, os.path.join(OUT, "l_sd1.safetensors"))
    reference(l, "l", ["eos_pad", "short", "ti", "no_eos"], cases)

    g = CLIPTextModelWithProjection(cfg_g).eval()
    randomize(g, cfg_g.hidden_size)
    hf_g = save_folder(g, CLIPTextModelWithProjection, cfg_g, os.path.join(OUT, "g", "text_encoder_2"))
    assert "text_model.embeddings.token_embedding.weight" in hf_g and "text_projection.weight" in hf_g
    openclip = openclip_layout(hf_g, "conditioner.embedders.1.model.")
    save_file(openclip, os.path.join(OUT, "g_openclip.safetensors"))
    reference(g, "g", ["zero_pad", "short", "ti", "no_eos"], cases)

    save_file(cases, os.path.join(OUT, "cases.safetensors"))
    for root, _, files in os.walk(OUT):
        for f in files:
            p = os.path.join(root, f)
            print(f"{os.path.getsize(p):>9}  {p}")


if __name__ == "__main__":
    main()
