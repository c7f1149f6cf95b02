#!/usr/bin/env python3
"""Reference fixtures for the Qwen3-VL text encoder (tests/qwen3_te_parity.rs).

A tiny random transformers `Qwen3VLForConditionalGeneration` (text: hidden 32, 3 layers, 4 heads,
2 KV heads, head_dim 16 != 32/4, intermediate 48, rope theta 5e6, interleaved mRoPE sections
[4, 2, 2]; a 1-block vision tower that text prompts never use) with the tiny Qwen tokenizer of
tests/fixtures/qwen_tokenizer/tiny (run qwen_tokenizer_fixtures.py first) is run through diffusers'
`QwenImage21Pipeline.encode_prompt` (the pipeline is built with the real processor class; its
transformer, VAE and scheduler are not needed for encoding).

Writes tests/fixtures/qwen3_te/:
  text_encoder/model.safetensors, config.json   the language model weights as transformers 5
                                                saves them (`model.language_model.*`) + config
  qwen3_plain.safetensors                       the same weights under plain Qwen3 names
                                                (`model.layers.N...`, `model.embed_tokens`, ...)
  cases.safetensors   per case: `{c}.ids` (templated ids, f32), `{c}.drop` ([drop_idx]),
                      `{c}.embeds` (pipeline prompt_embeds [n - drop_idx, 32]), `{c}.full`
                      (pre-norm last layer, all tokens), `{c}.normed` (after the final norm),
                      `{c}.layer1` (output of decoder layer 1 of 3); `theta1000.y` (pre-norm output
                      of case 0 with rope theta 1000)

Needs: torch, transformers >= 5, diffusers with QwenImage21Pipeline, safetensors.
Re-run: python3 tests/reference/qwen3_te_fixtures.py
"""
import copy
import json
import os

import torch
from safetensors.torch import save_file
from transformers import Qwen2Tokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as qwen2_vl_pil
from diffusers import QwenImage21Pipeline

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "qwen3_te")
TOK = os.path.join(CRATE, "tests", "fixtures", "qwen_tokenizer", "tiny")

PROMPTS = {
    "cat": "a lovely cat holding a sign says 'qwen2.1.cpp'",
    "empty": "",
    "mixed": "A neon sign reading \"OPEN 24/7\"\nabove a rainy street, 夜景 🐱, cinematic",
}

# Minimal Qwen3-VL chat template for the system turn the pipeline tokenizes to find drop_idx
# (the real template renders a system message with list content the same way).
CHAT_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string %}{{- m.content }}{%- else %}{%- for c in m.content %}"
    "{%- if 'text' in c %}{{- c.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
)


def processor():
    tok = Qwen2Tokenizer.from_pretrained(TOK)
    # Without torchvision there is no video processor class to check against; text-only prompts
    # never use it.
    orig = Qwen3VLProcessor.check_argument_for_proper_class

    def check(self, name, arg):
        return None if arg is None else orig(self, name, arg)

    Qwen3VLProcessor.check_argument_for_proper_class = check
    return Qwen3VLProcessor(image_processor=qwen2_vl_pil.Qwen2VLImageProcessorPil(), tokenizer=tok,
                            video_processor=None, chat_template=CHAT_TEMPLATE), len(tok)


def model(vocab, theta=5e6):
    torch.manual_seed(0)
    cfg = Qwen3VLConfig(
        text_config=dict(
            vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": theta,
                             "mrope_section": [4, 2, 2], "mrope_interleaved": True},
            max_position_embeddings=4096,
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           num_position_embeddings=64, deepstack_visual_indexes=[]),
    )
    m = Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        # Norm weights away from 1 so a missing or misplaced norm shows.
        for name, p in m.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "language_model" in name:
                p.copy_(0.15 * torch.randn_like(p))
    return m


def main():
    os.makedirs(os.path.join(OUT, "text_encoder"), exist_ok=True)
    proc, vocab = processor()
    te = model(vocab)
    pipe = QwenImage21Pipeline(scheduler=None, vae=None, text_encoder=te, processor=proc, transformer=None)
    lm = te.model.language_model

    sd = {k: v.contiguous() for k, v in te.state_dict().items() if k.startswith("model.language_model.")}
    assert "model.language_model.layers.0.self_attn.q_norm.weight" in sd
    save_file(sd, os.path.join(OUT, "text_encoder", "model.safetensors"))
    cfg = te.config.to_dict()
    with open(os.path.join(OUT, "text_encoder", "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, default=str)
    plain = {k.replace("model.language_model.", "model."): v for k, v in sd.items()}
    save_file(plain, os.path.join(OUT, "qwen3_plain.safetensors"))

    out = {}
    for name, prompt in PROMPTS.items():
        with torch.no_grad():
            embeds, mask, _ = pipe.encode_prompt(prompt, device="cpu")
        assert mask is None
        text = pipe.prompt_template_t2i.format(prompt if prompt else " ")
        ids = proc(text=[text], return_tensors="pt").input_ids
        with torch.no_grad():
            hs = lm(input_ids=ids, output_hidden_states=True)
            handle = lm.norm.register_forward_hook(lambda mod, args, output: args[0])
            try:
                pre = lm(input_ids=ids).last_hidden_state
            finally:
                handle.remove()
        drop = pipe._drop_idx
        assert torch.allclose(pre[0, drop:], embeds[0], atol=1e-6)
        out[f"{name}.ids"] = ids[0].float()
        out[f"{name}.drop"] = torch.tensor([float(drop)])
        out[f"{name}.embeds"] = embeds[0].contiguous()
        out[f"{name}.full"] = pre[0].contiguous()
        out[f"{name}.normed"] = hs.last_hidden_state[0].contiguous()
        # hidden_states[k] is the output of decoder layer k (index 0 = embeddings).
        out[f"{name}.layer1"] = hs.hidden_states[2][0].contiguous()
        print(name, "tokens", ids.shape[1], "drop", drop, "max|embeds|", embeds.abs().max().item())

    te2 = model(vocab, theta=1000.0)
    te2.load_state_dict(te.state_dict())
    lm2 = te2.model.language_model
    ids = out["cat.ids"].long()[None]
    with torch.no_grad():
        handle = lm2.norm.register_forward_hook(lambda mod, args, output: args[0])
        out["theta1000.y"] = lm2(input_ids=ids).last_hidden_state[0].contiguous()
        handle.remove()
    assert (out["theta1000.y"] - out["cat.full"]).abs().max() > 1e-3
    save_file(out, os.path.join(OUT, "cases.safetensors"))


if __name__ == "__main__":
    main()
