"""Golden fixtures for the T5 v1.1 text encoder (tests/t5_parity.rs).

Run from the repository root:  python3 tests/reference/t5_fixtures.py
Builds a tiny random-weight transformers `T5EncoderModel` (gated-gelu, v1.1 style, eager
attention) and writes under tests/fixtures/t5/:

* text_encoder/               `save_pretrained` output (config.json + model.safetensors): the
                              HF / diffusers `text_encoder/` layout (`shared.weight`, `encoder.block...`).
* t5_sdcpp.safetensors        the same weights under the ComfyUI / sd.cpp prefix
                              `text_encoders.t5xxl.transformer.`, with the embedding stored as
                              `encoder.embed_tokens.weight` instead of `shared.weight`.
* t5_f16.safetensors          the same weights cast to float16 (HF names).
* cases.safetensors           inputs and reference outputs (f32, CPU):
    <case>.ids  int32 [n] token ids; <case>.valid  int32 [1] number of real tokens;
    <case>.y    f32 [n, d_model] last_hidden_state (with attention mask 1 for the first `valid`
                tokens and 0 after; padded rows are stored but not meaningful);
    <case>.y_f16w  the same computed in f32 with the weights rounded to float16;
  plus `buckets.rel` / `buckets.bucket` (int32): torch's bidirectional relative-position buckets
  for relative positions -400..400 with 32 buckets / max distance 128.

The GGUF (llama.cpp naming) variant is written by the Rust test itself from text_encoder/.
Tensors keep PyTorch's row-major layout; the Rust side reads shapes reversed (ggml order).
"""
import os
import shutil

import torch
from safetensors.torch import save_file, load_file
from transformers import T5Config, T5EncoderModel
from transformers.models.t5.modeling_t5 import T5Attention

OUT = "tests/fixtures/t5"
torch.manual_seed(5)

config = T5Config(
    vocab_size=100,
    d_model=32,
    d_kv=10,  # inner dim 40 != d_model, so the test notices a d_kv/d_model mix-up
    num_heads=4,
    d_ff=48,
    num_layers=3,
    feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    layer_norm_epsilon=1e-6,
    dropout_rate=0.0,
    attn_implementation="eager",
)
model = T5EncoderModel(config).eval()
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("layer_norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        elif "relative_attention_bias" in name:
            p.copy_(torch.randn_like(p))
        elif name.endswith((".q.weight", ".k.weight")):
            # attention logits of a few units (T5 has no 1/sqrt(d) scaling): sharp but not
            # so peaked that rounding flips the argmax
            p.copy_(torch.randn_like(p) * 0.12)
        else:
            p.copy_(torch.randn_like(p) * 0.3)
    model.shared.weight.mul_(3.0)

os.makedirs(OUT, exist_ok=True)
te_dir = os.path.join(OUT, "text_encoder")
if os.path.isdir(te_dir):
    shutil.rmtree(te_dir)
model.save_pretrained(te_dir, safe_serialization=True)
for f in os.listdir(te_dir):
    if f not in ("config.json", "model.safetensors"):
        os.remove(os.path.join(te_dir, f))
hf = load_file(os.path.join(te_dir, "model.safetensors"))
assert "shared.weight" in hf, sorted(hf)

sd = {}
for k, v in hf.items():
    if k == "shared.weight":
        k = "encoder.embed_tokens.weight"
    sd["text_encoders.t5xxl.transformer." + k] = v.contiguous()
save_file(sd, os.path.join(OUT, "t5_sdcpp.safetensors"))

f16 = {k: v.to(torch.float16).contiguous() for k, v in hf.items()}
save_file(f16, os.path.join(OUT, "t5_f16.safetensors"))

model_f16w = T5EncoderModel(config).eval()
model_f16w.load_state_dict({k: v.float() for k, v in f16.items()}, strict=False)
model_f16w.encoder.embed_tokens = model_f16w.shared

cases = {}
gen = torch.Generator().manual_seed(7)


def case(name, n, valid):
    ids = torch.randint(2, config.vocab_size, (1, n), generator=gen)
    ids[0, valid - 1] = 1  # </s>
    ids[0, valid:] = 0  # <pad>
    mask = torch.zeros(1, n, dtype=torch.long)
    mask[0, :valid] = 1
    with torch.no_grad():
        y = model(input_ids=ids, attention_mask=mask).last_hidden_state[0]
        y16 = model_f16w(input_ids=ids, attention_mask=mask).last_hidden_state[0]
    cases[f"{name}.ids"] = ids[0].to(torch.int32)
    cases[f"{name}.valid"] = torch.tensor([valid], dtype=torch.int32)
    cases[f"{name}.y"] = y.contiguous()
    cases[f"{name}.y_f16w"] = y16.contiguous()
    return ids, mask, y


ids, mask, y_pad = case("pad", 20, 14)
# Trimming to the real tokens must give the same real-token states (REFERENCE-NOTES §PixArt 2).
with torch.no_grad():
    y_trim = model(input_ids=ids[:, :14]).last_hidden_state[0]
assert (y_trim - y_pad[:14]).abs().max() < 1e-5
case("full", 20, 20)
case("long", 160, 150)  # relative distances beyond max_distance

rel = torch.arange(-400, 401)
cases["buckets.rel"] = rel.to(torch.int32)
cases["buckets.bucket"] = T5Attention._relative_position_bucket(
    rel, bidirectional=True, num_buckets=32, max_distance=128
).to(torch.int32)
save_file(cases, os.path.join(OUT, "cases.safetensors"))
print("wrote", OUT, {k: tuple(v.shape) for k, v in cases.items()})
