#!/usr/bin/env python3
"""Reference fixtures for the Qwen3-VL text encoder with images (tests/qwen3_te_mm_parity.rs).

The tiny language model of qwen3_te_fixtures.py (same weights: the Rust test loads
tests/fixtures/qwen3_te/text_encoder) inside a `Qwen3VLForConditionalGeneration` whose random
vision tower has depth 2 and deepstack_visual_indexes [0, 1] (so two deepstack features are
added after decoder layers 0 and 1). The processor uses the tiny Qwen tokenizer and a
`Qwen2VLImageProcessorPil` (patch 16, temporal patch 2, merge 2, mean/std 0.5) and diffusers'
`QwenImage21Pipeline.encode_prompt(prompt, image=[...])` runs the edit template.

The vision tower's outputs are captured with a forward hook on `te.model.visual` and saved so the
Rust encoder can be fed exactly what the language model received.

Writes tests/fixtures/qwen3_te_mm/cases.safetensors, per case c:
  {c}.ids        templated, pad-expanded input ids (f32) [n]
  {c}.drop       [drop_idx]
  {c}.grids      merged (h, w) per image, f32 [images, 2]
  {c}.pos        get_rope_index position ids (t, h, w), f32 [3, n]
  {c}.vision     merged vision embeddings of all images, [n_pads_total, 32]
  {c}.deepstack  deepstack features, [2, n_pads_total, 32]
  {c}.embeds     pipeline prompt_embeds [n - drop, 32]
  {c}.pad_mask   pipeline image_pad_mask (f32 0/1) [n - drop]

Needs: torch, transformers >= 5, diffusers with QwenImage21Pipeline, safetensors, pillow, numpy.
Re-run (after qwen3_te_fixtures.py's inputs exist): python3 tests/reference/qwen3_te_mm_fixtures.py
"""
import os
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2Tokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as qwen2_vl_pil
from diffusers import QwenImage21Pipeline

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_te_fixtures as base  # noqa: E402

OUT = os.path.join(base.CRATE, "tests", "fixtures", "qwen3_te_mm")

# (prompt, image sizes (w, h))
CASES = {
    "one": ("make the cat wear a red hat", [(96, 64)]),
    "one_empty": ("", [(96, 64)]),
    "two": ("put the dog from picture 2 next to the cat", [(96, 64), (64, 96)]),
    "two_empty": ("", [(96, 64), (64, 96)]),
}


def processor():
    tok = Qwen2Tokenizer.from_pretrained(base.TOK)
    orig = Qwen3VLProcessor.check_argument_for_proper_class

    def check(self, name, arg):
        return None if arg is None else orig(self, name, arg)

    Qwen3VLProcessor.check_argument_for_proper_class = check
    image_processor = qwen2_vl_pil.Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        min_pixels=1024, max_pixels=16384)
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tok, video_processor=None,
                            chat_template=base.CHAT_TEMPLATE), tok


def model(tok):
    text = base.model(len(tok))
    torch.manual_seed(1)
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    cfg = Qwen3VLConfig(
        text_config=text.config.text_config.to_dict(),
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                           num_position_embeddings=64, deepstack_visual_indexes=[0, 1]),
        **ids,
    )
    m = Qwen3VLForConditionalGeneration(cfg).eval()
    missing = m.model.language_model.load_state_dict(text.model.language_model.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys
    with torch.no_grad():
        for name, p in m.model.visual.named_parameters():
            p.copy_((1.0 + 0.3 * torch.randn_like(p)) if "norm" in name and name.endswith("weight")
                    else 0.15 * torch.randn_like(p))
    return m


def image(w, h, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), "RGB")


def main():
    os.makedirs(OUT, exist_ok=True)
    proc, tok = processor()
    te = model(tok)
    pipe = QwenImage21Pipeline(scheduler=None, vae=None, text_encoder=te, processor=proc, transformer=None)
    pad_id = tok.convert_tokens_to_ids("<|image_pad|>")

    captured = {}

    def vis_hook(mod, args, output):
        captured["vision"] = output.pooler_output.detach().clone()
        captured["deepstack"] = torch.stack([f.detach().clone() for f in output.deepstack_features])

    def lm_hook(mod, args, kwargs):
        captured["position_ids"] = kwargs["position_ids"].detach().clone()

    out = {}
    for name, (prompt, sizes) in CASES.items():
        images = [image(w, h, 10 + i) for i, (w, h) in enumerate(sizes)]
        captured.clear()
        h1 = te.model.visual.register_forward_hook(vis_hook)
        h2 = te.model.language_model.register_forward_pre_hook(lm_hook, with_kwargs=True)
        try:
            with torch.no_grad():
                embeds, mask, pad_mask = pipe.encode_prompt(prompt, image=images, device="cpu")
        finally:
            h1.remove()
            h2.remove()
        # The same inputs the pipeline built, for ids and an independent get_rope_index.
        text = pipe.prompt_template_ti2i.replace(
            "<image1><|vision_start|><|image_pad|><|vision_end|>",
            "<image1><|vision_start|><|image_pad|><|vision_end|>" + "".join(
                f" <image{i}><|vision_start|><|image_pad|><|vision_end|>" for i in range(2, len(images) + 1)),
        ).format(prompt if prompt else " ")
        inputs = proc(text=[text], images=images, return_tensors="pt")
        ids = inputs.input_ids
        pos, _ = te.model.get_rope_index(ids, inputs.mm_token_type_ids, image_grid_thw=inputs.image_grid_thw)
        cap = captured["position_ids"]
        if cap.shape[0] == 4:  # text positions first, then (t, h, w)
            cap = cap[1:]
        assert torch.equal(cap, pos), (cap.shape, pos.shape)
        drop = pipe._drop_idx
        assert mask is None or bool(mask.all())
        assert pad_mask[0].sum().item() == (ids[0] == pad_id).sum().item() == captured["vision"].shape[0]
        assert torch.equal(pad_mask[0], ids[0, drop:] == pad_id)
        grids = inputs.image_grid_thw[:, 1:] // 2
        out[f"{name}.ids"] = ids[0].float()
        out[f"{name}.drop"] = torch.tensor([float(drop)])
        out[f"{name}.grids"] = grids.float().contiguous()
        out[f"{name}.pos"] = pos[:, 0].float().contiguous()
        out[f"{name}.vision"] = captured["vision"].contiguous()
        out[f"{name}.deepstack"] = captured["deepstack"].contiguous()
        out[f"{name}.embeds"] = embeds[0].contiguous()
        out[f"{name}.pad_mask"] = pad_mask[0].float()
        print(name, "tokens", ids.shape[1], "drop", drop, "grids", grids.tolist(),
              "max|embeds|", embeds.abs().max().item(), "max|vision|", captured["vision"].abs().max().item())
    save_file(out, os.path.join(OUT, "cases.safetensors"))


if __name__ == "__main__":
    main()
