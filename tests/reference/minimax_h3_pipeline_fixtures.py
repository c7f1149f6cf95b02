"""Golden fixtures for a whole MiniMax-H3 text-to-audio-video run (tests/minimax_h3_pipeline.rs).

Run from the repository root, after qwen_tokenizer_fixtures.py (the tiny tokenizer),
minimax_h3_vae_fixtures.py and minimax_h3_audio_vae_fixtures.py (the VAEs):
    python3 tests/reference/minimax_h3_pipeline_fixtures.py

Components, tiny and random, built with the real diffusers / transformers classes:
- text encoder: the tiny Qwen3-VL of qwen3_te_fixtures.py (3 layers, hidden 32) exported as
  MiniMax-H3's is, truncated before its last layer and without the final norm: the run reads
  `hidden_states[2]` as diffusers' `get_qwen3vl_prompt_embeds(..., text_encoder_layer=2)`;
- `MiniMaxH3Transformer3DModel`: 2 heads x 32 (24 channels rotated), hidden 48, 2 blocks,
  1 refiner block, 24 video / 4 audio latent channels, text dim 32;
- the video VAE of minimax_h3_vae_fixtures.py (4x space, 4x time, 24 channels, its own
  latents_mean / latents_std) and audio VAE model "b" of minimax_h3_audio_vae_fixtures.py,
  read from those fixtures (tests/fixtures/minimax_h3_vae/vae, .../minimax_h3_audio_vae/b).

The loop is diffusers' (the transformer on the packed layout of `MiniMaxH3PrepareLayoutStep`,
row timesteps of `MiniMaxH3SetTimestepsStep`, one Euler schedule per modality as
`MiniMaxH3Scheduler`) on sd-cli's sigmas: the `discrete` flow schedule with shift 12 for video
and the same points moved to shift 3 for audio; CFG 3 with a negative prompt on both outputs.
The start noise is sd-cli's: one `randn` (torch CPU generator, seed 42) over the packed latent
[24 + 1, 7, 8, 12], video first, then the audio values (t fastest, then the stereo stream, then
the channel). 48x32 pixels, 22 frames (7 latent frames), 37 audio latents, 4 steps.

Writes tests/fixtures/minimax_h3_pipeline/:
  transformer/            config.json + diffusion_pytorch_model.safetensors
  text_encoder/model.safetensors   (model.language_model.*, 2 layers, no norm) + tokenizer.json
  reference.safetensors   cond / uncond states [L, 32], the final video latent (normalised,
                          [24, T, h, w]) and audio latent (([2, 37, 4]: stream, t, channel)), the
                          frames [F, 3, H, W] in [0, 1] and the waveform [2, samples]
"""
import importlib.util
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = "tests/fixtures/minimax_h3_pipeline"
VAE_DIR = "tests/fixtures/minimax_h3_vae/vae"
AUDIO_VAE_DIR = "tests/fixtures/minimax_h3_audio_vae/b"
PROMPT = "a cat surfs a wave, with surf rock"
NEGATIVE = "blurry"
W, H, FRAMES, STEPS, CFG, SEED, SHIFT, AUDIO_SHIFT = 48, 32, 22, 4, 3.0, 42, 12.0, 3.0
PIXEL_MEAN = [0.485, 0.456, 0.406]
PIXEL_STD = [0.229, 0.224, 0.225]


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"{name}.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def sdcli_sigmas(n, shift):
    ts = [999 - 999 / (n - 1) * i for i in range(n)]
    return [shift * ((t + 1) / 1000) / (1 + (shift - 1) * ((t + 1) / 1000)) for t in ts]


def remap(sigma, f, t):
    base = sigma / (f + sigma * (1 - f))
    return t * base / (1 + (t - 1) * base)


def transformer(text_dim, audio_channels):
    torch.manual_seed(3)
    m = MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=32, hidden_size=48, num_layers=2,
        num_refiner_layers=1, ffn_dim=40, in_channels=24, audio_in_channels=audio_channels,
        patch_size=(1, 2, 2), text_dim=text_dim, freq_dim=64, time_embed_hidden_dim=40,
        time_embed_dim=20, rope_freq_dim=4).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.6 / max(1, p.shape[-1]) ** 0.5 if p.ndim > 1 else 0.1))
    return m


def main():
    te_fx = load("qwen3_te_fixtures")
    proc, vocab = te_fx.processor()
    te = te_fx.model(vocab)
    layers = te.config.text_config.num_hidden_layers - 1
    tok = proc.tokenizer

    # The VAEs are those of their own parity fixtures (run those scripts first).
    vae = AutoencoderKLMiniMaxH3.from_pretrained(VAE_DIR).eval()
    avae = AutoencoderKLMiniMaxH3Audio.from_pretrained(AUDIO_VAE_DIR).eval()
    ca = avae.config.latent_channels
    dit = transformer(te.config.text_config.hidden_size, ca)

    def states(text):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return get_qwen3vl_prompt_embeds(te, proc, ids, {}, text_encoder_layer=layers)[0].float()

    cond, uncond = states(PROMPT), states(NEGATIVE)

    f = 4  # the tiny VAE's spatial factor
    lh, lw = H // f, W // f
    t_lat = 7
    audio_len = round(FRAMES / 24 * 40)
    plane = t_lat * lh * lw
    extra = -(-audio_len * 2 * ca // plane)
    noise = torch.randn((1, 24 + extra, t_lat, lh, lw), generator=torch.Generator().manual_seed(SEED))
    flat = noise.flatten()
    x_v = noise[:, :24].clone()
    x_a = flat[24 * plane: 24 * plane + audio_len * 2 * ca].reshape(ca, 2, audio_len).permute(1, 2, 0).clone()

    sig_v = sdcli_sigmas(STEPS, SHIFT) + [0.0]
    sig_a = [remap(s, SHIFT, AUDIO_SHIFT) for s in sig_v]
    sig_a[0] = 1.0

    def predict(text, video_rows, audio_rows, t_v, t_a):
        tags = torch.ones(text.shape[0], dtype=torch.long)
        pos, token_tags, vid, aud, txt, ncv, nca = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
            tags, t_lat, lh, lw, audio_len, (1, 2, 2), 2, 2, 0, ())
        uniq, inv = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            vid, aud, ncv, nca, txt.numel(), t_v, t_a, max(t_v, 0.999), 1.0)
        with torch.no_grad():
            v, a = dit(hidden_states=video_rows[None], audio_hidden_states=audio_rows[None],
                       encoder_hidden_states=text[None], timestep=uniq, timestep_indices=inv,
                       token_tags=token_tags, position_ids=pos, video_indices=vid,
                       audio_indices=aud, text_indices=txt, return_dict=False)
        return v[0], a[0]

    for i in range(STEPS):
        sv, sv1, sa, sa1 = sig_v[i], sig_v[i + 1], sig_a[i], sig_a[i + 1]
        rows = patchify_video_latents(x_v, (1, 2, 2))
        arows = x_a.reshape(2 * audio_len, ca)
        t_v, t_a = 1.0 - float(torch.tensor(sv).clamp(1e-6, 1.0)), 1.0 - sa
        cv, ca_ = predict(cond, rows, arows, t_v, t_a)
        uv, ua = predict(uncond, rows, arows, t_v, t_a)
        gv, ga = uv + CFG * (cv - uv), ua + CFG * (ca_ - ua)
        # Data-ward velocities: x_next = x + (sigma - sigma_next) * v.
        gv = gv.reshape(1, t_lat, lh // 2, lw // 2, 24, 1, 2, 2).permute(0, 4, 1, 5, 2, 6, 3, 7)
        gv = gv.reshape(1, 24, t_lat, lh, lw)
        x_v = x_v + (sv - sv1) * gv
        x_a = x_a + (sa - sa1) * ga.reshape(2, audio_len, ca)

    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        video = vae.decode(x_v * std + mean, return_dict=False)[0]
    pm = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
    ps = torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
    video = (video.float() * ps + pm).clamp(0, 1)[0].permute(1, 0, 2, 3).contiguous()
    am = torch.tensor(avae.config.latents_mean).view(1, -1, 1)
    ast = torch.tensor(avae.config.latents_std).view(1, -1, 1)
    with torch.no_grad():
        wave = avae.decode(x_a.permute(0, 2, 1) * ast + am, return_dict=False)[0]
    wave = wave.float().reshape(2, -1).contiguous()

    os.makedirs(OUT, exist_ok=True)
    dit.save_pretrained(f"{OUT}/transformer", safe_serialization=True)
    os.makedirs(f"{OUT}/text_encoder", exist_ok=True)
    keep = {}
    for k, v in te.state_dict().items():
        if not k.startswith("model.language_model."):
            continue
        rest = k[len("model.language_model."):]
        if rest.startswith("norm."):
            continue
        if rest.startswith("layers.") and int(rest.split(".")[1]) >= layers:
            continue
        keep[k] = v.contiguous()
    save_file(keep, f"{OUT}/text_encoder/model.safetensors")
    shutil.copy(os.path.join(te_fx.TOK, "tokenizer.json"), f"{OUT}/text_encoder/tokenizer.json")
    save_file({
        "cond": cond.contiguous(),
        "uncond": uncond.contiguous(),
        "video_latent": x_v[0].contiguous(),
        "audio_latent": x_a.contiguous(),
        "video": video,
        "audio": wave,
    }, f"{OUT}/reference.safetensors")
    print("video", tuple(video.shape), float(video.min()), float(video.max()),
          "saturated", float(((video <= 0) | (video >= 1)).float().mean()),
          "audio", tuple(wave.shape), float(wave.abs().max()), "cond", tuple(cond.shape),
          "uncond", tuple(uncond.shape), "sigmas", sig_v, sig_a)


if __name__ == "__main__":
    main()
