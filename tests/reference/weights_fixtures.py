#!/usr/bin/env python3
"""Writes the reference fixtures for tests/weights.rs into tests/fixtures/weights/.

Files are made by the reference implementations (the `safetensors` package via torch, and the
`gguf` package, pip install gguf), so the Rust readers are checked against bytes they did not
write. Each data file has an `*.expected.json` describing what a correct reader must return:
names, dtypes, shapes, the raw bytes (hex) and, for element types, the values as torch decodes
them to float32 (this is the reference for our F8/BF16/F16/int -> f32 conversion).

Re-runnable: python3 tests/reference/weights_fixtures.py
"""
import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

import gguf
from gguf.quants import quantize

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "weights")

ST_NAMES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def raw_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def json_float(x):
    # JSON has no NaN/inf literals: spell them as strings.
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def describe_st(tensors):
    out = {}
    for name, t in tensors.items():
        out[name] = {
            "dtype": ST_NAMES[t.dtype],
            "shape": list(t.shape),
            "hex": raw_bytes(t.reshape(-1)).hex(),
            "f32": [json_float(x) for x in t.to(torch.float32).reshape(-1).tolist()],
        }
    return out


def safetensors_fixtures():
    g = torch.Generator().manual_seed(0)
    all_e4m3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    all_e5m2 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e5m2)
    tensors = {
        "model.diffusion_model.x_embedder.proj.weight": torch.randn(2, 3, generator=g),
        "f16": torch.randn(4, generator=g).half(),
        "bf16": torch.randn(2, 2, generator=g).bfloat16(),
        "f64": torch.randn(3, generator=g).double(),
        "i8": torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
        "i16": torch.tensor([-32768, 5, 32767], dtype=torch.int16),
        "i32": torch.tensor([[-7, 8], [2**31 - 1, -(2**31)]], dtype=torch.int32),
        "i64": torch.tensor([0, -3, 2**40], dtype=torch.int64),
        "u8": torch.tensor([0, 200, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "f8_e4m3": all_e4m3,
        "f8_e5m2": all_e5m2,
        "scalar": torch.tensor(1.5),
        "five_dims": torch.randn(1, 2, 3, 1, 2, generator=g),
        "empty": torch.zeros(0, 3),
    }
    path = os.path.join(OUT, "ref.safetensors")
    save_file(tensors, path, metadata={"format": "pt", "note": "weights fixture"})
    with open(path + ".expected.json", "w") as f:
        json.dump({"metadata": {"format": "pt", "note": "weights fixture"}, "tensors": describe_st(tensors)}, f, indent=0)

    # Sharded: two shards and an index.
    shard_dir = os.path.join(OUT, "sharded")
    os.makedirs(shard_dir, exist_ok=True)
    a = {"encoder.block.0.layer.0.SelfAttention.q.weight": torch.randn(4, 4, generator=g).half()}
    b = {"shared.weight": torch.randn(8, 4, generator=g).half(), "encoder.final_layer_norm.weight": torch.ones(4).half()}
    save_file(a, os.path.join(shard_dir, "model-00001-of-00002.safetensors"))
    save_file(b, os.path.join(shard_dir, "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in a}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in b})
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 112}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(shard_dir, "expected.json"), "w") as f:
        json.dump({"tensors": describe_st({**a, **b})}, f, indent=0)

    # A diffusers component folder (AutoencoderKL-like names) with config.json.
    folder = os.path.join(OUT, "vae_folder")
    os.makedirs(folder, exist_ok=True)
    v = {
        "decoder.conv_in.weight": torch.randn(4, 2, 3, 3, generator=g),
        "decoder.up_blocks.0.resnets.0.conv1.weight": torch.randn(2, 4, 1, 1, generator=g),
    }
    save_file(v, os.path.join(folder, "diffusion_pytorch_model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"_class_name": "AutoencoderKL", "latent_channels": 4, "scaling_factor": 0.13025}, f)
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump({"tensors": describe_st(v)}, f, indent=0)


def gguf_fixture(name, alignment=None):
    path = os.path.join(OUT, name)
    w = gguf.GGUFWriter(path, arch="pixart")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 1.0 / 3.0)
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, -1.5])

    rng = np.random.default_rng(0)
    expected = []

    def add(name, arr, raw_dtype=None, elem_shape=None):
        if raw_dtype is None:
            w.add_tensor(name, arr)
            ggml_type = {np.float32: 0, np.float16: 1, np.int32: 26}[arr.dtype.type]
            ne = list(reversed(arr.shape))
        else:
            # gguf-py takes the byte shape of quantized data and derives the element shape.
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=raw_dtype)
            ggml_type = int(raw_dtype)
            ne = list(reversed(elem_shape))
        expected.append({"name": name, "type": ggml_type, "ne": ne, "hex": arr.tobytes().hex()})

    add("x_embedder.proj.weight", rng.standard_normal((3, 5)).astype(np.float32))
    add("t_block.1.weight", rng.standard_normal((2, 7)).astype(np.float16))
    add("ids", np.array([1, -2, 3], dtype=np.int32))
    q8_src = rng.standard_normal((2, 64)).astype(np.float32)
    q8 = quantize(q8_src, gguf.GGMLQuantizationType.Q8_0)
    add("blocks.0.mlp.fc1.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0, elem_shape=(2, 64))
    # A K-quant given as opaque bytes: the reader must size it with QK_K=256 / 144 bytes.
    q4k = rng.integers(0, 256, size=(1, 2 * 144), dtype=np.uint8)
    add("blocks.0.mlp.fc2.weight", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K, elem_shape=(1, 512))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    kv = {
        "t.u8": 200, "t.i8": -5, "t.u16": 65000, "t.i16": -30000, "t.u32": 4000000000,
        "t.i32": -2000000000, "t.f32": 0.25, "t.bool": True, "t.str": "héllo", "t.u64": 2**63 + 5,
        "t.i64": -(2**40), "t.f64": 1.0 / 3.0, "t.arr_str": ["a", "bc", ""], "t.arr_i32": [1, -2, 3],
        "t.arr_f32": [0.5, -1.5], "general.architecture": "pixart",
    }
    with open(path + ".expected.json", "w") as f:
        json.dump({"alignment": alignment or 32, "kv": kv, "tensors": expected}, f, indent=0)


def main():
    os.makedirs(OUT, exist_ok=True)
    safetensors_fixtures()
    gguf_fixture("ref.gguf")
    gguf_fixture("ref_align64.gguf", alignment=64)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote fixtures to {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
