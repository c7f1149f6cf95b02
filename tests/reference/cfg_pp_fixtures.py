#!/usr/bin/env python3
"""Golden fixtures for the CFG++ samplers `euler_cfg_pp` and `euler_a_cfg_pp` (tests/cfg_pp.rs).

Run from the repository root (after pixart_pipeline_fixtures.py and
qwen_image_pipeline_fixtures.py):
    python3 tests/reference/cfg_pp_fixtures.py

Neither diffusers nor k-diffusion has these samplers, so this is a transcription of upstream's
(stable-diffusion.cpp `runtime/denoiser.hpp`, `sample_euler_cfg_pp` and
`sample_euler_ancestral_cfg_pp`) running on the diffusers pipelines: a scheduler subclass
replaces the Euler step with

    d = (x - uncond_denoised) / sigma
    x = denoised + d * sigma_next                          (euler_cfg_pp)
    x = denoised + d * sigma_down; x += randn * sigma_up   (euler_a_cfg_pp, eta 1, k-diffusion's
                                                            ancestral split, also for flow models)

where `denoised` is the guided prediction and `uncond_denoised` the unconditional one, both
turned into x0 estimates (eps: x - sigma * eps; flow: x - sigma * v). The unconditional
prediction is recorded by a wrapper around the transformer. The pipelines and their components
are those of the two pipeline fixtures, loaded from tests/fixtures/; the runs are as there
(4 steps, seed 42 on a CPU generator) with CFG 1.5; the ancestral noise comes from a
second CPU generator seeded 42, drawn with the latent's own shape ([1, C, H, W]).

Writes tests/fixtures/cfg_pp/{pixart,qwen}.safetensors: the final latents (PixArt: divided by
the scaling factor, [4, h, w]; Qwen: transformer space, [64, h, w]) under the sampler names.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(CRATE, "tests", "fixtures")
OUT = os.path.join(FIX, "cfg_pp")
SEED = 42
# CFG++ renoises along the unconditional prediction, so it is used with small scales (the
# CFG++ paper: 0 < lambda <= 1; upstream takes --cfg-scale as given); any scale other than 1
# runs both predictions.
CFG = 1.5


def cfg_pp_scheduler(base, to_x0):
    """`base` (a diffusers Euler scheduler class) with upstream's CFG++ step."""

    class CfgPP(base):
        ancestral = False
        uncond = None
        gen = None

        def step(self, model_output, timestep, sample, *args, return_dict=True, **kwargs):
            if self.step_index is None:
                self._init_step_index(timestep)
            sigma = float(self.sigmas[self.step_index])
            nxt = float(self.sigmas[self.step_index + 1])
            denoised = to_x0(sample, model_output, sigma)
            uncond_denoised = to_x0(sample, self.uncond.to(sample.dtype), sigma)
            d = (sample - uncond_denoised) / sigma
            if self.ancestral:
                up = min(nxt, (nxt * nxt * (sigma * sigma - nxt * nxt) / (sigma * sigma)) ** 0.5)
                down = (nxt * nxt - up * up) ** 0.5
                x = denoised + d * down
                if nxt > 0:
                    x = x + self.noise(sample) * up
            else:
                x = denoised + d * nxt
            self._step_index += 1
            return (x,) if not return_dict else type("Out", (), {"prev_sample": x})()

        def noise(self, sample):
            return torch.randn(sample.shape, generator=self.gen)

    return CfgPP


def run_pixart():
    from transformers import T5EncoderModel, T5TokenizerFast
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    fx = os.path.join(FIX, "pixart_pipeline")
    tok = T5TokenizerFast(tokenizer_file=os.path.join(CRATE, "..", "shared", "tokenizers", "t5-v1_1.tokenizer.json"))
    t5 = T5EncoderModel.from_pretrained(os.path.join(fx, "text_encoder")).eval()
    transformer = PixArtTransformer2DModel.from_pretrained(os.path.join(fx, "transformer")).eval()
    vae = AutoencoderKL.from_pretrained(os.path.join(fx, "vae")).eval()
    Sched = cfg_pp_scheduler(EulerDiscreteScheduler, lambda x, eps, s: x - s * eps)
    sched = Sched(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
                  prediction_type="epsilon", timestep_spacing="linspace", interpolation_type="linear")
    pipe = PixArtSigmaPipeline(tokenizer=tok, text_encoder=t5, vae=vae, transformer=transformer, scheduler=sched)
    latent_c = transformer.config.in_channels

    forward = transformer.forward

    def record(*a, **k):
        out = forward(*a, **k)
        # The batch is [uncond, cond]; the learned-sigma half is dropped as the pipeline does.
        sched.uncond = out[0][:1, :latent_c].detach().clone()
        return out

    transformer.forward = record
    captured = {}
    decode = vae.decode

    def decode_hook(z, *a, **k):
        captured["latent"] = z.detach().clone()
        return decode(z, *a, **k)

    vae.decode = decode_hook
    out = {}
    for name, ancestral in [("euler_cfg_pp", False), ("euler_a_cfg_pp", True)]:
        sched.ancestral = ancestral
        sched.gen = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            pipe("A Lovely cat, holding a sign!  ", negative_prompt="blurry", num_inference_steps=4,
                 guidance_scale=CFG, height=16, width=24, generator=torch.Generator().manual_seed(SEED),
                 output_type="np", use_resolution_binning=False, clean_caption=False, max_sequence_length=300)
        out[name] = captured["latent"][0].float().contiguous()
        print("pixart", name, tuple(out[name].shape), float(out[name].abs().max()))
    return out


def run_qwen():
    import qwen3_te_fixtures as te_fx
    import qwen_image_pipeline_fixtures as t2i_fx
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    fx = os.path.join(FIX, "qwen_image_pipeline")
    proc, vocab = te_fx.processor()
    te = te_fx.model(vocab)
    dit = t2i_fx.transformer(te.config.text_config.hidden_size)
    ae = t2i_fx.vae()
    # The components exactly as committed.
    dit.load_state_dict(load_file(os.path.join(fx, "diffusion_model.safetensors")))
    ae.load_state_dict(load_file(os.path.join(fx, "vae.safetensors")))
    te.load_state_dict(load_file(os.path.join(fx, "llm.safetensors")), strict=False)
    Sched = cfg_pp_scheduler(FlowMatchEulerDiscreteScheduler, lambda x, v, s: x - s * v)
    sched = Sched(num_train_timesteps=1000, use_dynamic_shifting=True, base_image_seq_len=256,
                  max_image_seq_len=8192, base_shift=0.5, max_shift=0.9, shift_terminal=0.02,
                  time_shift_type="exponential")
    pipe = QwenImage21Pipeline(scheduler=sched, vae=ae, text_encoder=te, processor=proc, transformer=dit)
    h, w = 64 // 16, 96 // 16

    forward = dit.forward
    calls = []

    def record(*a, **k):
        out = forward(*a, **k)
        calls.append(out[0].detach().clone())
        # The pipeline calls cond, then uncond: keep the uncond one's target tokens.
        if len(calls) % 2 == 0:
            sched.uncond = calls[-1][:, -(h * w):]
        return out

    dit.forward = record
    captured = {}
    decode = ae.decode

    def decode_hook(z, *a, **k):
        captured["raw"] = z.detach().clone()
        return decode(z, *a, **k)

    ae.decode = decode_hook

    def noise(sample):
        # Drawn in the latent's own layout [1, C, H, W], then packed like the latents.
        n = torch.randn((1, 64, h, w), generator=sched.gen)
        return n.view(1, 64, h * w).transpose(1, 2)

    sched.noise = noise
    out = {}
    m = torch.tensor(ae.config.latents_mean).view(64, 1, 1)
    s = torch.tensor(ae.config.latents_std).view(64, 1, 1)
    for name, ancestral in [("euler_cfg_pp", False), ("euler_a_cfg_pp", True)]:
        sched.ancestral = ancestral
        sched.gen = torch.Generator().manual_seed(SEED)
        calls.clear()
        with torch.no_grad():
            pipe("a lovely cat holding a sign says 'qwen2.1.cpp'", negative_prompt="blurry, low quality",
                 true_cfg_scale=CFG, height=64, width=96, num_inference_steps=4,
                 generator=torch.Generator().manual_seed(SEED), output_type="np", use_kv_cache=False)
        raw = captured["raw"][0, :, 0]
        out[name] = ((raw - m) / s).float().contiguous()
        print("qwen", name, tuple(out[name].shape), float(out[name].abs().max()))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    save_file(run_pixart(), os.path.join(OUT, "pixart.safetensors"))
    save_file(run_qwen(), os.path.join(OUT, "qwen.safetensors"))


if __name__ == "__main__":
    main()
