"""Golden fixtures for the umT5 text encoder (tests/umt5_parity.rs).

Run from the repository root:  python3 tests/reference/umt5_fixtures.py
Builds a tiny random-weight transformers `UMT5EncoderModel` (d_model 32, 4 heads x 8, d_ff 48,
3 layers, every block with its own relative position table; 32 buckets / max distance 128;
gated GELU, eager attention) and a tiny umT5-shaped unigram tokenizer, and writes under
tests/fixtures/umt5/:

* text_encoder/                  `save_pretrained` output (config.json + model.safetensors, f32):
                                 transformers / ComfyUI names (`shared.weight`, `encoder.block.N...`).
* umt5_fp8_scaled.safetensors    ComfyUI "scaled fp8" layout: q/k/v/o/wi_0/wi_1/wo as F8_E4M3
                                 with a `<name>.scale_weight` f32 scalar beside each, the rest
                                 bf16, and the empty `scaled_fp8` marker.
* models_t5_umt5-enc-bf16.pth    the original Wan checkpoint layout (torch.save of a bf16 state
                                 dict named as wan/modules/t5.py: `token_embedding`, `blocks.N.
                                 {norm1,attn.{q,k,v,o},norm2,ffn.{gate.0,fc1,fc2},
                                 pos_embedding.embedding}`, `norm`).
* tokenizer.json                 a unigram tokenizer shaped like google/umt5-xxl's (<pad> 0,
                                 </s> 1, <s> 2, <unk> 3, Metaspace, `$A </s>`, 300 <extra_id_N>
                                 at the end of the vocabulary) over a few dozen pieces.
* cases.safetensors              inputs and reference outputs (f32, CPU):
    <case>.ids int32 [n]; <case>.valid int32 [1]; <case>.y f32 [n, d_model] last_hidden_state
    (attention mask 1 for the first `valid` tokens); cases `en` and `zh` are tokenized prompts
    (`en` unpadded, `zh` padded to 24), `long` is 160 random ids with 150 real (distances past
    max_distance); plus `buckets.rel` / `buckets.bucket`: UMT5's bidirectional buckets for
    relative positions -400..400.

Every layout holds exactly the same values: matrices are fp8 values times a power of two per
tensor (exact in fp8-scaled, bf16 and f32), the other tensors are bf16-representable. So one
set of goldens serves all of them.
Tensors keep PyTorch's row-major layout; the Rust side reads shapes reversed (ggml order).
"""
import json
import math
import os
import shutil

import torch
from safetensors.torch import save_file, load_file
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import UMT5Config, UMT5EncoderModel

OUT = "tests/fixtures/umt5"
VOCAB_ROWS = 384
EXTRA_IDS = 300
PROMPTS = {
    "en": "A cat walks on the  grass, realistic style.",
    "zh": "一只猫在草地上走，写实风格",
}
torch.manual_seed(11)

# ---- tokenizer -------------------------------------------------------------------------
specials = ["<pad>", "</s>", "<s>", "<unk>"]
words = ["▁A", "▁cat", "▁walk", "s", "▁on", "▁the", "▁grass", ",", "▁real", "istic",
         "▁style", ".", "▁一只", "猫", "在", "草地", "上", "走", "，", "写实", "风格", "▁"]
chars = sorted({c for p in PROMPTS.values() for c in p.replace(" ", "")} | set("abcdefghijklmnopqrstuvwxyz"))
pieces = [(w, -2.0 - 0.1 * i) for i, w in enumerate(words)]
seen = {w for w, _ in pieces}
pieces += [(c, -8.0 - 0.01 * i) for i, c in enumerate(chars) if c not in seen]
vocab = [(s, 0.0) for s in specials] + pieces
vocab += [(f"<extra_id_{i}>", 0.0) for i in reversed(range(EXTRA_IDS))]
assert len(vocab) <= VOCAB_ROWS, len(vocab)

tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
tok.normalizer = normalizers.Sequence([normalizers.Replace(Regex(" {2,}"), " ")])
tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
tok.add_special_tokens(["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(EXTRA_IDS)])

if os.path.isdir(OUT):
    shutil.rmtree(OUT)
os.makedirs(OUT)
tok.save(os.path.join(OUT, "tokenizer.json"), pretty=False)

# ---- model -------------------------------------------------------------------------------
config = UMT5Config(
    vocab_size=VOCAB_ROWS,
    d_model=32,
    d_kv=8,
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
model = UMT5EncoderModel(config).eval()
MATRICES = (".q.weight", ".k.weight", ".v.weight", ".o.weight", ".wi_0.weight", ".wi_1.weight", ".wo.weight")
scales = {}
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("layer_norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        elif "relative_attention_bias" in name:
            p.copy_(torch.randn_like(p))
        elif name.endswith((".q.weight", ".k.weight")):
            p.copy_(torch.randn_like(p) * 0.12)  # logits of a few units (no 1/sqrt(d))
        else:
            p.copy_(torch.randn_like(p) * 0.3)
        if name == "shared.weight":
            p.mul_(3.0)
        if name.endswith(MATRICES):
            # fp8 values times a power of two: exact in every layout
            s = 2.0 ** math.ceil(math.log2(p.abs().max().item() / 448.0))
            q = (p / s).to(torch.float8_e4m3fn)
            p.copy_(q.float() * s)
            scales[name] = (q, s)
        else:
            p.copy_(p.bfloat16().float())

te_dir = os.path.join(OUT, "text_encoder")
model.save_pretrained(te_dir, safe_serialization=True)
for f in os.listdir(te_dir):
    if f not in ("config.json", "model.safetensors"):
        os.remove(os.path.join(te_dir, f))
hf = load_file(os.path.join(te_dir, "model.safetensors"))
assert "shared.weight" in hf and "encoder.block.2.layer.0.SelfAttention.relative_attention_bias.weight" in hf, sorted(hf)

# ComfyUI scaled fp8
fp8 = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
for k, v in hf.items():
    if k in scales:
        q, s = scales[k]
        fp8[k] = q.contiguous()
        fp8[k[: -len("weight")] + "scale_weight"] = torch.tensor(s, dtype=torch.float32)
    else:
        fp8[k] = v.bfloat16().contiguous()
save_file(fp8, os.path.join(OUT, "umt5_fp8_scaled.safetensors"))

# original Wan names
WAN_BLOCK = {
    "layer.0.layer_norm.weight": "norm1.weight",
    "layer.0.SelfAttention.q.weight": "attn.q.weight",
    "layer.0.SelfAttention.k.weight": "attn.k.weight",
    "layer.0.SelfAttention.v.weight": "attn.v.weight",
    "layer.0.SelfAttention.o.weight": "attn.o.weight",
    "layer.0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
    "layer.1.layer_norm.weight": "norm2.weight",
    "layer.1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight",
    "layer.1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",
    "layer.1.DenseReluDense.wo.weight": "ffn.fc2.weight",
}
wan = {}
for k, v in hf.items():
    if k == "shared.weight":
        w = "token_embedding.weight"
    elif k == "encoder.final_layer_norm.weight":
        w = "norm.weight"
    else:
        i, tail = k[len("encoder.block."):].split(".", 1)
        w = f"blocks.{i}.{WAN_BLOCK[tail]}"
    wan[w] = v.bfloat16().contiguous()
    assert torch.equal(wan[w].float(), v), k  # exact in bf16
torch.save(wan, os.path.join(OUT, "models_t5_umt5-enc-bf16.pth"))

# ---- cases -------------------------------------------------------------------------------
cases = {}


def run(name, ids, valid):
    n = len(ids)
    ids_t = torch.tensor([ids])
    mask = torch.zeros(1, n, dtype=torch.long)
    mask[0, :valid] = 1
    with torch.no_grad():
        y = model(input_ids=ids_t, attention_mask=mask).last_hidden_state[0]
    cases[f"{name}.ids"] = ids_t[0].to(torch.int32)
    cases[f"{name}.valid"] = torch.tensor([valid], dtype=torch.int32)
    cases[f"{name}.y"] = y.contiguous()
    return y


ids_en = tok.encode(PROMPTS["en"]).ids
assert 3 not in ids_en, ids_en  # every piece known
run("en", ids_en, len(ids_en))
ids_zh = tok.encode(PROMPTS["zh"]).ids
valid_zh = len(ids_zh)
y_zh = run("zh", ids_zh + [0] * (24 - valid_zh), valid_zh)
with torch.no_grad():  # trimming to the real tokens gives the same real-token states
    y_trim = model(input_ids=torch.tensor([ids_zh])).last_hidden_state[0]
assert (y_trim - y_zh[:valid_zh]).abs().max() < 1e-5
gen = torch.Generator().manual_seed(3)
long_ids = torch.randint(4, VOCAB_ROWS, (160,), generator=gen)
long_ids[149] = 1
long_ids[150:] = 0
run("long", long_ids.tolist(), 150)

rel = torch.arange(-400, 401)
attn = model.encoder.block[0].layer[0].SelfAttention
cases["buckets.rel"] = rel.to(torch.int32)
cases["buckets.bucket"] = attn._relative_position_bucket(rel).to(torch.int32)
save_file(cases, os.path.join(OUT, "cases.safetensors"))
print("ids en", ids_en, "zh", ids_zh)
print("wrote", OUT, {k: tuple(v.shape) for k, v in cases.items()})
