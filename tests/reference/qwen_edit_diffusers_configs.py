#!/usr/bin/env python3
"""The diffusers `config.json` of each component of the tiny Qwen Image 2.1 edit pipeline
(tests/qwen_edit_pipeline.rs, `diffusers_folders_edit_matches_diffusers_image`).

Run from the repository root (after qwen_edit_pipeline_fixtures.py):
    python3 tests/reference/qwen_edit_diffusers_configs.py

The components are built exactly as qwen_edit_pipeline_fixtures.py builds them (same classes
and arguments) and only their configs are saved, as `QwenImage21Pipeline.save_pretrained`
writes them: the test assembles the pipeline's diffusers folder from these configs and the
weight files already in tests/fixtures/qwen_edit_pipeline/ (the text encoder's folder holds the
language model and the vision tower in one `model.safetensors`, as transformers saves it).

Writes tests/fixtures/qwen_edit_pipeline/diffusers/:
  transformer/config.json    QwenImage21Transformer2DModel (patch_size 1)
  text_encoder/config.json   Qwen3VLConfig (text_config and vision_config, patch 16)
  vae/config.json            AutoencoderKLQwenImage21 (latents_mean / latents_std)
  processor/preprocessor_config.json
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen_edit_pipeline_fixtures as edit_fx  # noqa: E402
import qwen_image_pipeline_fixtures as t2i_fx  # noqa: E402

OUT = os.path.join(edit_fx.OUT, "diffusers")


def main():
    proc, vocab = edit_fx.processor()
    te = edit_fx.text_encoder(vocab, proc.tokenizer)
    dit = t2i_fx.transformer(te.config.text_config.hidden_size)
    ae = t2i_fx.vae()
    for sub in ["transformer", "text_encoder", "vae", "processor"]:
        os.makedirs(os.path.join(OUT, sub), exist_ok=True)
    dit.save_config(os.path.join(OUT, "transformer"))
    ae.save_config(os.path.join(OUT, "vae"))
    te.config.save_pretrained(os.path.join(OUT, "text_encoder"))
    shutil.copy(os.path.join(edit_fx.OUT, "preprocessor_config.json"),
                os.path.join(OUT, "processor", "preprocessor_config.json"))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
