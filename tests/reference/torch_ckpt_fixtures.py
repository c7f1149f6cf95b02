#!/usr/bin/env python3
"""Writes the PyTorch checkpoint fixtures for tests/torch_ckpt.rs into tests/fixtures/torch_ckpt/.

Good files are real `torch.save` output (ZIP and legacy formats) of one tiny state dict, each
with a safetensors twin holding the same tensors, so the Rust reader is checked against what
torch wrote and what the safetensors package wrote for the same data:

- plain.pt / plain_legacy.pt: a bare state dict (an OrderedDict with `_metadata`, as
  nn.Module.state_dict() returns; f32, f16, bf16, f64, int64/32/16/8, uint8,
  bool, float8_e4m3fn, a 5-D weight, an empty tensor, a tied weight, two tensors viewing one storage at
  different offsets, a 0-d tensor);
- lightning.ckpt / lightning_legacy.ckpt: a Lightning-style checkpoint
  {"state_dict": ..., "epoch": 3, "global_step": 10, "callbacks": {...}, "optimizer_states":
  [...], "hyper_parameters": Namespace(...)} with a pickled ModelCheckpoint object, numpy
  scalars and a set next to the weights;
- twin.safetensors: the state dict's tensors (copies of the shared views; no 0-d tensor, which
  the checkpoint reader skips).

Hostile files are made by hand or by pickling objects whose __reduce__ would run code. Nothing
here ever loads a hostile file; building them only pickles. The payloads would create
MARKER if they ever ran; the Rust test asserts it does not exist.

Re-runnable: python3 tests/reference/torch_ckpt_fixtures.py
"""
import argparse
import collections
import io
import os
import struct
import subprocess
import sys
import types
import zipfile

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "torch_ckpt")
MARKER = "/tmp/sd-cli-torch-ckpt-pwned"


def state_dict():
    g = torch.Generator().manual_seed(7)
    shared = torch.randn(10, generator=g)
    tied = torch.randn(3, 4, generator=g)
    sd = {
        "model.diffusion_model.input_blocks.0.0.weight": torch.randn(4, 3, 3, 3, generator=g),
        "model.diffusion_model.input_blocks.0.0.bias": torch.randn(4, generator=g),
        "first_stage_model.decoder.conv_in.weight": torch.randn(5, 2, generator=g).half(),
        "first_stage_model.decoder.conv_in.bias": torch.randn(5, generator=g).bfloat16(),
        "cond_stage_model.transformer.text_model.embeddings.position_ids":
            torch.arange(7, dtype=torch.int64).reshape(1, 7),
        "cond_stage_model.transformer.text_model.embeddings.token_embedding.weight": tied,
        "cond_stage_model.transformer.text_model.tied.weight": tied,
        "shared.a": shared[:4],
        "shared.b": shared[4:].view(2, 3),
        "f64.weight": torch.randn(2, 2, generator=g).double(),
        "i32.buf": torch.tensor([1, -2, 3], dtype=torch.int32),
        "i16.buf": torch.tensor([-4, 5], dtype=torch.int16),
        "i8.buf": torch.tensor([-6, 7, 8], dtype=torch.int8),
        "u8.buf": torch.tensor([1, 2, 250], dtype=torch.uint8),
        "bool.mask": torch.tensor([True, False, True]),
        "f8.weight": torch.randn(2, 4, generator=g).to(torch.float8_e4m3fn),
        "conv3d.weight": torch.randn(2, 1, 1, 2, 3, generator=g),
        "empty.buf": torch.zeros(0, 3),
        "model_ema.decay": torch.tensor(0.9999),
    }
    # As nn.Module.state_dict() returns it: an OrderedDict with a `_metadata` attribute (pickled
    # as REDUCE OrderedDict, SETITEMS, then BUILD with the attribute).
    sd = collections.OrderedDict(sd)
    sd._metadata = collections.OrderedDict({"": {"version": 1}})
    return sd


def twin(sd):
    # safetensors keeps no shared storage and no scalars (the checkpoint reader skips 0-d).
    return {k: v.clone().contiguous() for k, v in sd.items() if v.dim() > 0}


class ModelCheckpoint:
    """Stands in for pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint."""

    def __init__(self):
        self.monitor = "val/loss"
        self.best_model_score = torch.tensor(0.25)
        self.save_top_k = 3


def lightning_module():
    # Register the class under Lightning's module path so pickle writes that global.
    for name in ["pytorch_lightning", "pytorch_lightning.callbacks",
                 "pytorch_lightning.callbacks.model_checkpoint"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    mod = sys.modules["pytorch_lightning.callbacks.model_checkpoint"]
    ModelCheckpoint.__module__ = mod.__name__
    mod.ModelCheckpoint = ModelCheckpoint


def lightning(sd):
    lightning_module()
    # Without the empty tensor: the test converts this file to GGUF, which holds no empty ones.
    sd = collections.OrderedDict((k, v) for k, v in sd.items() if v.numel() > 0)
    return {
        "epoch": 3,
        "global_step": 10,
        "pytorch-lightning_version": "1.4.2",
        "state_dict": sd,
        "callbacks": {
            "ModelCheckpoint{'monitor': 'val/loss'}": {
                "best_model_score": torch.tensor(0.5),
                "best_model_path": "/ckpt/last.ckpt",
            },
            "object": ModelCheckpoint(),
        },
        "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(3)}},
                              "param_groups": [{"lr": 1e-4, "params": [0]}]}],
        "lr_schedulers": [],
        "hyper_parameters": argparse.Namespace(lr=1e-4, name="tiny"),
        "numpy_things": [np.float64(0.5), np.int64(3), np.dtype("float32")],
        "a_set": {1, 2, 3},
    }


# --- hostile payloads ---------------------------------------------------------------------

class OsSystem:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


class Eval:
    def __reduce__(self):
        return (eval, (f"__import__('os').system('touch {MARKER}')",))


class GetAttr:
    def __reduce__(self):
        return (getattr, ("pwned", "upper"))


class Popen:
    def __reduce__(self):
        return (subprocess.Popen, (["touch", MARKER],))


def evil_module():
    mod = types.ModuleType("evilmod")

    def run(arg):
        raise RuntimeError("never called")

    run.__module__ = "evilmod"
    run.__qualname__ = "run"
    mod.run = run
    sys.modules["evilmod"] = mod

    class Payload:
        def __reduce__(self):
            return (mod.run, ("x",))

    return Payload


def save_hostile(name, obj, protocol=2):
    # torch.save only pickles: nothing in `obj` runs here.
    path = os.path.join(OUT, name)
    torch.save({"w": torch.zeros(2), "evil": obj}, path, pickle_protocol=protocol)
    return path


def save_hostile_legacy(name, obj):
    path = os.path.join(OUT, name)
    torch.save({"w": torch.zeros(2), "evil": obj}, path, _use_new_zipfile_serialization=False)


def rewrite_zip(src, dst, edit):
    """Copies a ZIP checkpoint entry by entry (stored), letting `edit(name, data)` return new
    data, None to drop the entry, or (data, compress_type)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            res = edit(info.filename, data)
            if res is None:
                continue
            ctype = zipfile.ZIP_STORED
            if isinstance(res, tuple):
                res, ctype = res
            # Entry names keep the source's folder: it need not match the file name.
            zout.writestr(info.filename, res, compress_type=ctype)


def zip_with_pickle(name, pkl):
    """A minimal torch-like archive whose data.pkl is `pkl` (hand-made bytes)."""
    stem = name.rsplit(".", 1)[0]
    with zipfile.ZipFile(os.path.join(OUT, name), "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{stem}/data.pkl", pkl)
        z.writestr(f"{stem}/version", "3\n")


def patch_local_offset(src, dst, entry_suffix, new_offset):
    """Points the central directory record of the entry ending in `entry_suffix` at a local
    header offset past the end of the file."""
    data = bytearray(open(src, "rb").read())
    at = 0
    while True:
        at = data.index(b"PK\x01\x02", at)
        name_len, extra_len = struct.unpack_from("<HH", data, at + 28)
        name = bytes(data[at + 46: at + 46 + name_len]).decode()
        if name.endswith(entry_suffix):
            struct.pack_into("<I", data, at + 42, new_offset)
            break
        at += 4
    open(dst, "wb").write(bytes(data))


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    if os.path.exists(MARKER):
        os.remove(MARKER)

    sd = state_dict()
    torch.save(sd, os.path.join(OUT, "plain.pt"))
    torch.save(sd, os.path.join(OUT, "plain_legacy.pt"), _use_new_zipfile_serialization=False)
    ckpt = lightning(sd)
    torch.save(ckpt, os.path.join(OUT, "lightning.ckpt"))
    torch.save(ckpt, os.path.join(OUT, "lightning_legacy.ckpt"),
               _use_new_zipfile_serialization=False)
    save_file(twin(sd), os.path.join(OUT, "twin.safetensors"))

    # Code-running globals, next to a real tensor.
    save_hostile("os_system.pt", OsSystem())
    save_hostile_legacy("os_system_legacy.pt", OsSystem())
    save_hostile("eval.pt", Eval())
    save_hostile("getattr.pt", GetAttr())
    # Protocol 4 names it by STACK_GLOBAL as subprocess.Popen (protocol 2 says commands.Popen).
    save_hostile("popen.pt", Popen(), protocol=4)
    # A global that is not on the allowlist, applied by REDUCE.
    save_hostile("unknown_reduce.pt", evil_module()())
    # A whole module instead of its state dict (NEWOBJ of torch.nn.modules.linear.Linear).
    torch.save(torch.nn.Linear(2, 2), os.path.join(OUT, "whole_module.pt"))
    # A transposed view (not contiguous).
    torch.save({"t": torch.arange(6.0).reshape(2, 3).t()}, os.path.join(OUT, "transposed.pt"))

    plain = os.path.join(OUT, "plain.pt")
    raw = open(plain, "rb").read()
    # Truncated: half of the archive; and a legacy file cut inside its storages.
    open(os.path.join(OUT, "truncated.pt"), "wb").write(raw[: len(raw) // 2])
    legacy = open(os.path.join(OUT, "plain_legacy.pt"), "rb").read()
    open(os.path.join(OUT, "truncated_legacy.pt"), "wb").write(legacy[:-5])
    # A storage entry whose local header offset points past the end of the file.
    patch_local_offset(plain, os.path.join(OUT, "offset_past_end.pt"), "/data/0", 0xFFFFFF00)
    # A storage entry missing; a compressed data.pkl.
    rewrite_zip(plain, os.path.join(OUT, "missing_storage.pt"),
                lambda n, d: None if n.endswith("/data/1") else d)
    rewrite_zip(plain, os.path.join(OUT, "compressed.pt"),
                lambda n, d: (d, zipfile.ZIP_DEFLATED) if n.endswith("data.pkl") else d)
    rewrite_zip(plain, os.path.join(OUT, "big_endian.pt"),
                lambda n, d: b"big" if n.endswith("/byteorder") else d)
    # Hand-made pickles: nesting past the MARK limit, 20000 nested dicts (no tensors), a
    # string length prefix far past the end, an 8-byte length of 2^63.
    zip_with_pickle("deep_marks.pt", b"\x80\x02" + b"(" * 5000 + b".")
    # 'k' memoized, then d0 k d1 k d2 ... k dN on the stack, then N SETITEMs fold them up.
    nested = b"\x80\x04\x8c\x01k\x940}" + b"h\x00}" * 20000 + b"s" * 20000 + b"."
    zip_with_pickle("deep_dicts.pt", nested)
    zip_with_pickle("huge_length.pt", b"\x80\x02X\xf0\xff\xff\xffabc.")
    zip_with_pickle("huge_length8.pt", b"\x80\x04\x8d" + struct.pack("<Q", 1 << 63) + b"abc.")

    assert not os.path.exists(MARKER)
    for f in sorted(os.listdir(OUT)):
        print(f"{f}: {os.path.getsize(os.path.join(OUT, f))} bytes")


if __name__ == "__main__":
    main()
