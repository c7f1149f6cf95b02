"""Golden fixtures for tests/sd_extras.rs: textual inversion, prompt emphasis / long prompts /
BREAK through the whole SD conditioner, the SD2 v-prediction probe, and a Lightning .ckpt.

Run from the repository root:  python3 tests/reference/sd_extras_fixtures.py

Reuses the tiny pipelines of tests/reference/sd_pipeline_fixtures.py (read back from
tests/fixtures/sd_pipeline/, never copied) and writes, under tests/fixtures/sd_extras/:

  embd_sd1/mystyle.safetensors   A1111/diffusers-style `{"emb_params": [2, 8]}`
  embd_sd1/ptstyle.pt            A1111 `torch.save` dict (`string_to_param: {"*": [2, 8]}`,
                                 `string_to_token`, `name`, `step`, ...), the ZIP format
  embd_sd1/oldstyle.pt           the same with one vector [1, 8], torch's legacy (pre-1.6) format
  embd_sdxl/xlstyle.safetensors  SDXL `{"clip_l": [2, 8], "clip_g": [2, 8]}`
  reference.safetensors          conditionings (cond_*), token ids / weights (ids_*, w_*) and the
                                 SD1 textual-inversion image (ti_image [3, H, W] in [0, 1])
  probe.json                     upstream's SD2 probe on the sd2 UNet, as is and with its output
                                 bias shifted
  sd1.ckpt.pkl + sd1.ckpt.json   the sd1 single file as a Lightning `.ckpt` (`{"state_dict": ...,
                                 "global_step": 0}`): torch.save's own pickle and the list of the
                                 ZIP's records; the test writes the ZIP with each storage's bytes
                                 taken from the assembled single file (git stores no weights twice)

References:
- textual inversion: diffusers `load_textual_inversion` + `encode_prompt` / the whole pipeline
  (SD1: Euler, 4 steps, CFG 5, 24x16, seed 42, as sd_pipeline). SDXL's pooled embedding is read
  at the first EOS as upstream does: the fixture's bigG config has the legacy eos_token_id=2, for
  which transformers pools at the highest id, which is the embedding's token, not EOS.
- emphasis / chunks: upstream's rules transcribed below (parse_prompt_attention, BREAK padding,
  77-token chunks), each chunk through the transformers encoders, the token weights and mean
  rescale of `apply_token_weights` in numpy, chunks concatenated.
- SD2 probe: upstream's `is_using_v_parameterization_for_sd2` on the diffusers UNet.
"""
import io
import json
import os
import re
import sys
import zipfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sd_pipeline_fixtures as spf  # noqa: E402
from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline, UNet2DConditionModel  # noqa: E402

SDP = "tests/fixtures/sd_pipeline"
OUT = "tests/fixtures/sd_extras"
BOS, EOS = 49406, 49407

TI_PROMPT = "a photo of mystyle cat"
TI_PT_PROMPT = "ptstyle, a dog by MyStyle in oldstyle"
TI_XL_PROMPT = "a xlstyle cat holding a sign"
EMPHASIS = "a (lovely:1.3) cat, [holding] a sign"
LONG = "a lovely cat holding a sign in the garden, " * 9 + "(bright sun:1.2)"
BREAK = "a lovely cat BREAK holding a (sign:1.2)"
XL_BREAK = "a (lovely:1.3) cat BREAK [holding] a sign"


# --- upstream's prompt rules (src/core/util.cpp parse_prompt_attention; conditioner.hpp tokenize;
# tokenizer.cpp pad_tokens), in f32 as upstream computes the weights ---

RE_ATTENTION = re.compile(r"\\\(|\\\)|\\\[|\\\]|\\\\|\\|\(|\[|:([+-]?[.\d]+)\)|\)|\]|\bBREAK\b|[^\\()\[\]:B]+|:|\bB")
RE_BREAK = re.compile(r"\s*\bBREAK\b\s*")


def parse_prompt_attention(text):
    res, round_b, square_b = [], [], []
    f32 = np.float32

    def multiply(start, m):
        for p in range(start, len(res)):
            res[p][1] = f32(res[p][1] * f32(m))

    for m in RE_ATTENTION.finditer(text):
        t, w = m.group(0), m.group(1)
        if t == "(":
            round_b.append(len(res))
        elif t == "[":
            square_b.append(len(res))
        elif w:
            if round_b:
                multiply(round_b.pop(), f32(float(w)))
        elif t == ")" and round_b:
            multiply(round_b.pop(), f32(1.1))
        elif t == "]" and square_b:
            multiply(square_b.pop(), f32(1) / f32(1.1))
        elif t == "\\(":
            res.append([t[1:], f32(1)])
        elif RE_BREAK.search(t):
            res.append(["BREAK", f32(-1)])
        else:
            res.append([t, f32(1)])
    for p in round_b:
        multiply(p, f32(1.1))
    for p in square_b:
        multiply(p, f32(1) / f32(1.1))
    if not res:
        res.append(["", f32(1)])
    i = 0
    while i + 1 < len(res):
        if res[i][1] == res[i + 1][1]:
            res[i][0] += res[i + 1][0]
            del res[i + 1]
        else:
            i += 1
    return res


def upstream_chunks(tok, prompt, pad):
    """(ids [n, 77], weights [n, 77]) as upstream's FrozenCLIPEmbedderWithCustomWords::tokenize."""
    ids, weights = [], []
    for text, w in parse_prompt_attention(prompt):
        if text == "BREAK" and w == -1:
            n = (75 - len(ids) % 75) % 75
            ids += [EOS] * n
            weights += [1.0] * n
            continue
        part = tok(text, add_special_tokens=False).input_ids
        ids += part
        weights += [float(w)] * len(part)
    chunks, wchunks, start = [], [], 0
    while True:
        end = min(start + 75, len(ids))
        c = [BOS] + ids[start:end] + [EOS]
        cw = [1.0] + weights[start:end] + [1.0]
        chunks.append(c + [pad] * (77 - len(c)))
        wchunks.append(cw + [1.0] * (77 - len(cw)))
        start = end
        if start >= len(ids):
            break
    return np.array(chunks, dtype=np.int64), np.array(wchunks, dtype=np.float32)


def apply_token_weights(hidden, weights):
    """upstream apply_token_weights: hidden [77, width], weights [77]."""
    if np.all(weights == 1.0):
        return hidden
    before = hidden.astype(np.float64).mean()
    h = hidden * weights[:, None]
    after = h.astype(np.float64).mean()
    if np.isfinite(before) and np.isfinite(after) and after != 0:
        h = h * np.float32(before / after)
    return h.astype(np.float32)


def sd1_condition(te, ids, weights):
    """SD1: each chunk's last hidden state (final LayerNorm, --clip-skip 1), weighted, concatenated."""
    out = []
    with torch.no_grad():
        for c, w in zip(ids, weights):
            h = te(torch.from_numpy(c)[None]).last_hidden_state[0].numpy()
            out.append(apply_token_weights(h, w))
    return np.concatenate(out, 0)


def first_eos(c):
    hits = np.nonzero(c == EOS)[0]
    return int(hits[0]) if len(hits) else len(c) - 1


def sdxl_condition(te, te2, ids, weights):
    """SDXL: CLIP-L and bigG penultimate layers (no final norm) on features; bigG reads the chunk
    with 0 after its first EOS; pooled = bigG's final-LN state at the first EOS of chunk 0,
    projected."""
    out, pooled = [], None
    with torch.no_grad():
        for k, (c, w) in enumerate(zip(ids, weights)):
            c2 = c.copy()
            e = first_eos(c2)
            c2[e + 1:] = 0
            o1 = te(torch.from_numpy(c)[None], output_hidden_states=True)
            o2 = te2(torch.from_numpy(c2)[None], output_hidden_states=True)
            h = torch.cat([o1.hidden_states[-2][0], o2.hidden_states[-2][0]], -1).numpy()
            out.append(apply_token_weights(h, w))
            if k == 0:
                pooled = te2.text_projection(o2.last_hidden_state[0, e])
    return np.concatenate(out, 0), pooled.numpy()


# --- pipelines read back from the sd_pipeline fixtures ---

def sd1_pipeline():
    pipe = StableDiffusionPipeline.from_pretrained(f"{SDP}/sd1", tokenizer=spf.tokenizer("<|endoftext|>"),
                                                   safety_checker=None, feature_extractor=None,
                                                   requires_safety_checker=False)
    pipe.to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sdxl_pipeline():
    pipe = StableDiffusionXLPipeline.from_pretrained(f"{SDP}/sdxl", tokenizer=spf.tokenizer("<|endoftext|>"),
                                                     tokenizer_2=spf.tokenizer("!"), add_watermarker=False)
    pipe.to(torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_sd1(pipe, prompt):
    return pipe(prompt, negative_prompt=spf.NEGATIVE, num_inference_steps=spf.STEPS, guidance_scale=spf.CFG,
                height=spf.H, width=spf.W, generator=torch.Generator().manual_seed(spf.SEED),
                output_type="np").images[0]


def image_chw(image):
    return torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()


def check_reload(pipe):
    """The pipeline read back gives sd_pipeline's image (guards the reload, dtypes included)."""
    want = load_file(f"{SDP}/sd1/reference.safetensors")["image"]
    got = image_chw(run_sd1(pipe, spf.PROMPT))
    err = float((got - want).abs().max())
    assert err < 1e-5, err


def emphasis(refs):
    pipe = sd1_pipeline()
    check_reload(pipe)
    tok, te = pipe.tokenizer, pipe.text_encoder.eval()
    for key, prompt in (("emphasis", EMPHASIS), ("long", LONG), ("break", BREAK)):
        ids, w = upstream_chunks(tok, prompt, EOS)
        refs[f"ids_{key}"] = torch.from_numpy(ids.astype(np.int32))
        refs[f"w_{key}"] = torch.from_numpy(w)
        refs[f"cond_{key}"] = torch.from_numpy(sd1_condition(te, ids, w))
        print(key, "chunks", len(ids), "weights", sorted(set(w.flatten().tolist())))
    # The per-chunk encoding spelled out once more: with all weights 1 and one chunk, the
    # conditioner is diffusers' encode_prompt.
    with torch.no_grad():
        cond, _ = pipe.encode_prompt("a lovely cat", "cpu", 1, False)
    ids, w = upstream_chunks(tok, "a lovely cat", EOS)
    assert np.abs(sd1_condition(te, ids, w) - cond[0].numpy()).max() < 1e-6

    xl = sdxl_pipeline()
    ids, w = upstream_chunks(xl.tokenizer, XL_BREAK, EOS)
    cond, pooled = sdxl_condition(xl.text_encoder, xl.text_encoder_2, ids, w)
    refs["ids_xl_break"] = torch.from_numpy(ids.astype(np.int32))
    refs["w_xl_break"] = torch.from_numpy(w)
    refs["cond_xl_break"] = torch.from_numpy(cond)
    refs["pooled_xl_break"] = torch.from_numpy(pooled)


def textual_inversion(refs):
    os.makedirs(f"{OUT}/embd_sd1", exist_ok=True)
    os.makedirs(f"{OUT}/embd_sdxl", exist_ok=True)
    g = torch.Generator().manual_seed(21)
    mystyle = torch.randn(2, 8, generator=g) * 0.5
    ptstyle = (torch.randn(2, 8, generator=g) * 0.5).requires_grad_(True)
    save_file({"emb_params": mystyle}, f"{OUT}/embd_sd1/mystyle.safetensors")
    # What A1111's Embedding.save writes (the checkpoint hash/name of the model it was trained on).
    torch.save({"string_to_token": {"*": 265}, "string_to_param": {"*": ptstyle}, "name": "ptstyle",
                "step": 500, "sd_checkpoint": "0123abcd", "sd_checkpoint_name": "tiny"},
               f"{OUT}/embd_sd1/ptstyle.pt")
    oldstyle = torch.randn(1, 8, generator=g) * 0.5
    torch.save({"string_to_token": {"*": 265}, "string_to_param": {"*": oldstyle}, "name": "oldstyle",
                "step": 100}, f"{OUT}/embd_sd1/oldstyle.pt", _use_new_zipfile_serialization=False)

    pipe = sd1_pipeline()
    pipe.load_textual_inversion({"emb_params": mystyle}, token="mystyle")
    # Loaded in byte order of the names, so diffusers' ids are sd-cli's.
    for name in ("oldstyle", "ptstyle"):  # the token is the file's own `name`
        pipe.load_textual_inversion(torch.load(f"{OUT}/embd_sd1/{name}.pt", weights_only=True))
    with torch.no_grad():
        cond, _ = pipe.encode_prompt(TI_PROMPT, "cpu", 1, False)
        # upstream matches the names case-insensitively ("MyStyle" is both rows); diffusers'
        # tokenizer finds the added token in "MyStyle" but maybe_convert_prompt does not expand
        # it to its two rows, so diffusers reads the lowercased prompt (CLIP lowercases anyway).
        cond_pt, _ = pipe.encode_prompt(TI_PT_PROMPT.lower(), "cpu", 1, False)
        image = run_sd1(pipe, TI_PROMPT)
    refs["cond_ti"] = cond[0]
    refs["cond_ti_pt"] = cond_pt[0]
    refs["ti_image"] = image_chw(image)
    refs["ids_ti"] = pipe.tokenizer(pipe.maybe_convert_prompt(TI_PROMPT, pipe.tokenizer), padding="max_length",
                                    max_length=77, return_tensors="pt").input_ids[0].int()
    refs["ids_ti_pt"] = pipe.tokenizer(pipe.maybe_convert_prompt(TI_PT_PROMPT.lower(), pipe.tokenizer),
                                       padding="max_length", max_length=77, return_tensors="pt").input_ids[0].int()
    print("ti ids", refs["ids_ti"][:9].tolist(), refs["ids_ti_pt"][:11].tolist(), "image", float(image.min()),
          float(image.max()))

    clip_l = torch.randn(2, 8, generator=g) * 0.5
    clip_g = torch.randn(2, 8, generator=g) * 0.5
    save_file({"clip_g": clip_g, "clip_l": clip_l}, f"{OUT}/embd_sdxl/xlstyle.safetensors")
    xl = sdxl_pipeline()
    xl.load_textual_inversion(clip_l, token="xlstyle", text_encoder=xl.text_encoder, tokenizer=xl.tokenizer)
    xl.load_textual_inversion(clip_g, token="xlstyle", text_encoder=xl.text_encoder_2, tokenizer=xl.tokenizer_2)
    with torch.no_grad():
        cond, _, _, _ = xl.encode_prompt(TI_XL_PROMPT, None, "cpu", 1, False)
        prompt = xl.maybe_convert_prompt(TI_XL_PROMPT, xl.tokenizer)
        ids = xl.tokenizer(prompt, padding="max_length", max_length=77, return_tensors="pt").input_ids
        ids2 = xl.tokenizer_2(prompt, padding="max_length", max_length=77, return_tensors="pt").input_ids
        assert ids2[0, first_eos(ids2[0].numpy()) + 1:].eq(0).all()  # "!" pads: upstream's zeroing
        out = xl.text_encoder_2(ids2, output_hidden_states=True)
        pooled = xl.text_encoder_2.text_projection(out.last_hidden_state[0, first_eos(ids2[0].numpy())])
    refs["cond_ti_xl"] = cond[0]
    refs["pooled_ti_xl"] = pooled
    print("ti xl ids", ids[0, :10].tolist())


def probe():
    """upstream is_using_v_parameterization_for_sd2: x = 0.5 [1, 4, 8, 8], context 0.5 [1, 2, ctx],
    t = 999; v when mean(out - x) < -1. Then the same UNet with conv_out's bias shifted."""
    unet = UNet2DConditionModel.from_pretrained(f"{SDP}/sd2/unet").float().eval()
    ctx_dim = unet.config.cross_attention_dim

    def mean():
        x = torch.full((1, 4, 8, 8), 0.5)
        with torch.no_grad():
            out = unet(x, torch.tensor([999.0]), torch.full((1, 2, ctx_dim), 0.5)).sample
        return float((out - x).double().mean())

    m0 = mean()
    shift = -3.0 if m0 >= -1 else 3.0
    with torch.no_grad():
        unet.conv_out.bias.add_(shift)
    m1 = mean()
    assert (m0 < -1) != (m1 < -1) and min(abs(m0 + 1), abs(m1 + 1)) > 0.25, (m0, m1)
    with open(f"{OUT}/probe.json", "w") as f:
        json.dump({"tensor": "model.diffusion_model.out.2.bias", "shift": shift, "mean": m0, "v": m0 < -1,
                   "shifted_mean": m1, "shifted_v": m1 < -1}, f, indent=1)
    print("probe", m0, "shifted", m1)


def assemble(stem):
    """tests/common/mod.rs assemble_checkpoint in Python: own tensors + borrowed ones."""
    sd = dict(load_file(f"{SDP}/{stem}.safetensors"))
    cache = {}
    for name, (f, src, shape) in json.load(open(f"{SDP}/{stem}.borrow.json")).items():
        cache.setdefault(f, None)
        if cache[f] is None:
            cache[f] = load_file(f"{SDP}/{f}")
        sd[name] = cache[f][src].reshape(shape).clone()
    return sd


def ckpt():
    """torch.save of the sd1 single file as a Lightning checkpoint; keeps its pickle and record list.
    Every tensor has its own storage, numbered in the order the pickle meets them."""
    sd = assemble("sd1.single")
    buf = io.BytesIO()
    torch.save({"state_dict": sd, "global_step": 0, "epoch": 0}, buf)
    zf = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    names = zf.namelist()
    prefix = names[0].split("/")[0]
    storages = {}
    for i, (name, t) in enumerate(sd.items()):
        key = str(i)
        raw = zf.read(f"{prefix}/data/{key}")
        assert raw == t.contiguous().numpy().tobytes(), name  # storage i holds tensor i
        storages[key] = name
    records = []
    for n in names:
        rel = n[len(prefix) + 1:]
        if rel == "data.pkl":
            records.append([rel, {"pickle": True}])
        elif rel.startswith("data/"):
            records.append([rel, {"storage": rel[5:]}])
        else:
            records.append([rel, {"text": zf.read(n).decode("latin-1")}])
    pkl = zf.read(f"{prefix}/data.pkl")
    with open(f"{OUT}/sd1.ckpt.pkl", "wb") as f:
        f.write(pkl)
    with open(f"{OUT}/sd1.ckpt.json", "w") as f:
        json.dump({"archive": prefix, "records": records, "storages": storages}, f, separators=(",", ":"))
    # The recipe rebuilds a file torch itself loads with equal tensors (what the Rust test writes).
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for rel, what in records:
            if "pickle" in what:
                data = pkl
            elif "storage" in what:
                data = sd[storages[what["storage"]]].contiguous().numpy().tobytes()
            else:
                data = what["text"].encode("latin-1")
            z.writestr(f"{prefix}/{rel}", data)
    back = torch.load(io.BytesIO(out.getvalue()), weights_only=True)
    assert back["global_step"] == 0 and all(torch.equal(back["state_dict"][k], v) for k, v in sd.items())
    print("ckpt:", len(storages), "storages, pickle", len(pkl), "bytes, records", [r[0] for r in records
                                                                                  if "storage" not in r[1]])


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    refs = {}
    emphasis(refs)
    textual_inversion(refs)
    save_file({k: v.detach().contiguous() for k, v in refs.items()}, f"{OUT}/reference.safetensors")
    probe()
    ckpt()
