"""Golden fixtures for conditioned MiniMax-H3 runs: I2VA (a first keyframe), FL2VA (first + last
keyframes) and Ref2VA (one reference image + one reference soundtrack), on the tiny components of
minimax_h3_pipeline_fixtures.py.

Run from the repository root, after qwen_tokenizer_fixtures.py, minimax_h3_vae_fixtures.py,
minimax_h3_audio_vae_fixtures.py and minimax_h3_pipeline_fixtures.py (its transformer is reused):
    python3 tests/reference/minimax_h3_i2va_fixtures.py

Components, tiny and random, with the real diffusers / transformers classes:
- text encoder: the Qwen3-VL of qwen3_te_mm_fixtures.py (the language model of
  qwen3_te_fixtures.py, 3 layers, hidden 32, plus a random vision tower: depth 2, deepstack
  [0, 1], out_hidden 32), exported as MiniMax-H3's is: the language model truncated before its
  last layer and without the final norm (the run reads `hidden_states[2]`), plus the whole vision
  tower (`model.visual.*`) and a `config.json` with the vision hyper-parameters;
- the transformer of tests/fixtures/minimax_h3_pipeline/transformer, the video VAE of
  tests/fixtures/minimax_h3_vae/vae (4x space, has an encoder) and audio VAE "b" of
  tests/fixtures/minimax_h3_audio_vae/b.

Geometry: 64x64 pixels (16x16 latents), 22 frames (7 latent frames), 37 audio latents, 3 steps,
CFG 3 with the negative prompt "blurry", seed 42, video shift 12 / audio shift 3 on sd-cli's
`discrete` flow sigmas, Euler, CFG on both outputs -- the loop of minimax_h3_pipeline_fixtures.py
with the noised keyframe / reference-image rows in front of the generated video rows, and the
reference soundtrack rows in front of the generated audio rows, on every call (constant over the
steps; only the generated rows of both transformer outputs are kept).

The recipe is upstream stable-diffusion.cpp's (the spec of sd-cli), which differs from diffusers'
modular MiniMax-H3 pipeline in these places:
- keyframe latents are the posterior MEAN (`latent_dist.mode()`) of the ImageNet-normalised
  uint8 pixels, in float32; diffusers samples the posterior under a fixed generator and rounds
  the sample to float16 (`encode_vae_condition`);
- the keyframe noise augmentation (`z * 0.999 + eps * (1 - 0.999)`, float32) draws eps from
  stable-diffusion.cpp's Philox normal generator (sampling_fixtures.philox_sdcpp) with the
  request seed and offset 0, a FRESH generator per keyframe (both keyframes get the same eps),
  in torch's contiguous order of the (1, 24, 1, 16, 16) latent; diffusers draws it from the
  request generator (`randn_tensor`), one draw per keyframe. The start noise of the generated
  latent is sd-cli's torch-CPU randn (seed 42) as in the T2VA fixtures, not consumed by the
  keyframe noise;
- there is a negative prompt (diffusers' checkpoint is guidance-distilled and has none), and it
  carries the same "<Picture i>: " labels and vision blocks as the prompt;
- the vision processor uses upstream's pixel bounds (min_pixels 3136, max_pixels 12845056); the
  64x64 keyframes are not resized either way (image_grid_thw [1, 4, 4] -> 4 merged tokens each);
- Ref2VA reference image: upstream sizes it from its own size, area-capped at the target canvas and
  never upscaled (scale = min(1, sqrt(W*H / (sw*sh))), w = max(32, std::round(sw*scale/32)*32),
  likewise h: 80x80 -> 64x64) and resizes with NEAREST, output (x, y) reading input
  (x*sw//w, y*sh//h), no antialias; diffusers resizes it to a 2048 short edge (upscaling included,
  no area cap) with LANCZOS (`MiniMaxH3Ref2VASetupStep`). The resized image feeds both the VAE and
  the vision tower. Its VAE latent and visual noise are the keyframes' (posterior mean, Philox eps of
  a fresh generator -- the same eps as the keyframes);
- Ref2VA reference soundtrack: upstream clamps it to [-1, 1] and zero-pads it to a multiple of 800
  samples before the audio VAE (posterior mean, as diffusers; the tiny VAE's hop is 2*2*3 = 12, so
  L = 2400 / 12 = 200 latents per channel); diffusers does not clamp, pads only to the VAE's own hop
  (800 for the real one), and truncates the soundtrack to the generated duration (moot here: 2400
  samples = 0.075 s);
- Ref2VA order: upstream presents and packs every image reference first, then the standalone audio
  references; diffusers keeps the request order. The request here is [image, audio], for which the
  two agree (asserted against diffusers' `_build_presentation`).

Presentation (both prompts): for keyframe i (first, then last) `tok("<Picture {i+1}>: ")` (tag 1)
+ <|vision_start|> <|image_pad|> x4 <|vision_end|> (tag 0), then `tok(prompt)` (tag 1); no
special tokens, no chat template. Layout: diffusers' `build_packed_sequence` with
keyframe_anchors ("first",) or ("first", "last") -> [text | keyframe rows | audio | video]; the
keyframe rows run at max(t, 0.999), the video output keeps only the generated rows.

Ref2VA (case "ref2va", no keyframes): ref.png (80x80 RGB) and ref.wav (2400 samples of 32 kHz
stereo int16 PCM, read back as int16 / 32768) are reloaded from disk. Presentation (both prompts):
`tok("<Picture 1>: ")` (tag 1) + <|vision_start|> <|image_pad|> x4 <|vision_end|> (tag 0) +
`tok("<Audio 1>: ")` (tag 1) + `tok(prompt)` (tag 1), the vision input being the 64x64 resized
reference. Layout: diffusers' `build_ref2va_packed_sequence` with references [image, audio] ->
[text | 64 reference-image rows | 2L reference-audio rows | target audio | target video], the image
at rotary time n_text, the soundtrack from n_text + 1, the targets from n_text + 1 + L. Rows are fed
as hidden_states = [noised patchified reference latent | generated video] and audio_hidden_states =
[reference audio rows (channel 0's L latents, then channel 1's; never noised) | generated audio];
`build_row_timesteps` pins the image rows at max(t_v, 0.999) and the reference audio rows at 1.0.
The start noise only covers the generated latents (the same draw as the other cases).

Writes tests/fixtures/minimax_h3_i2va/:
  first.png, last.png      the 64x64 keyframes (blurred random images; the PNG pixels are the truth)
  ref.png, ref.wav         the Ref2VA reference image (80x80, blurred random) and soundtrack (stereo
                           sine mixes + a little noise, 32 kHz int16); the file contents are the truth
  text_encoder/model.safetensors  model.language_model.* (layers 0-1, no norm) + model.visual.*
  text_encoder/config.json, tokenizer.json
  reference.safetensors, per case c in {i2va, fl2va, ref2va}:
    {c}.cond / {c}.uncond   text states [L, 32] / [L_neg, 32]
    {c}.tags / {c}.uncond_tags   modality tags of the text rows (f32 0/1) [L] / [L_neg]
    {c}.ids / {c}.uncond_ids     the presentation token ids (f32) [L] / [L_neg]
    {c}.keyframe_rows       (i2va, fl2va) the noised, normalised keyframe latents [K, 24, 16, 16]
                            (K = 1 / 2, packed order; unpatchified, i.e. the (1, 24, 1, 16, 16) latents stacked)
    ref2va.ref_latent       the unnoised normalised latent of the resized reference image [24, 16, 16]
    ref2va.ref_audio_rows   the normalised reference soundtrack rows [2 * 200, 4] (channel-major)
    {c}.video               frames [F, 3, H, W] in [0, 1]
    {c}.audio               waveform [2, samples]
  and eps (the first 16 Philox(seed 42, offset 0) normals), first_latent / last_latent (the
  unnoised normalised keyframe latents [24, 16, 16]).

Diagnostics (printed, not saved): the same run with last.png as the first keyframe and with no
keyframe at all (T2VA at this geometry, which is also the Ref2VA run without its references: the
two layouts coincide, asserted), compared as video PSNR / audio SNR. With these tiny random models
the keyframes / references move the decoded frames only slightly (video PSNR ~49-64 dB between
cases) but the soundtrack clearly (audio SNR ~26-38 dB; ref2va vs t2va: 49.2 dB / 26.5 dB).
"""
import importlib.util
import json
import math
import os
import shutil
import wave

import numpy as np
import torch
from PIL import Image, ImageFilter
from safetensors.torch import save_file
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3Ref2VAPrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)
from diffusers.modular_pipelines.minimax_h3.encoders import (
    MiniMaxH3Ref2VATextEncoderStep,
    get_qwen3vl_prompt_embeds,
)
from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3AudioReference, MiniMaxH3ImageReference
import transformers.models.qwen2_vl.image_processing_pil_qwen2_vl as qwen2_vl_pil

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = "tests/fixtures/minimax_h3_i2va"
DIT_DIR = "tests/fixtures/minimax_h3_pipeline/transformer"
VAE_DIR = "tests/fixtures/minimax_h3_vae/vae"
AUDIO_VAE_DIR = "tests/fixtures/minimax_h3_audio_vae/b"
PROMPT = "a cat surfs a wave, with surf rock"
NEGATIVE = "blurry"
W, H, FRAMES, STEPS, CFG, SEED, SHIFT, AUDIO_SHIFT = 64, 64, 22, 3, 3.0, 42, 12.0, 3.0
PIXEL_MEAN = [0.485, 0.456, 0.406]
PIXEL_STD = [0.229, 0.224, 0.225]
NOISE_AUG = 0.999
PATCH = (1, 2, 2)
REF_SIZE = 80  # ref.png is REF_SIZE x REF_SIZE
REF_RATE, REF_SAMPLES = 32000, 2400  # ref.wav: stereo 16-bit PCM
REF_AUDIO_BLOCK = 800  # upstream zero-pads a reference soundtrack to a multiple of the real audio VAE's hop


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"{name}.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


pipe_fx = load("minimax_h3_pipeline_fixtures")
mm_fx = load("qwen3_te_mm_fixtures")
rng_fx = load("sampling_fixtures")
sdcli_sigmas, remap = pipe_fx.sdcli_sigmas, pipe_fx.remap


def image_processor():
    # Upstream's constants; 64x64 needs no resize (a multiple of patch 16 x merge 2, >= min_pixels).
    return qwen2_vl_pil.Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        min_pixels=3136, max_pixels=12845056)


def keyframe_pngs():
    os.makedirs(OUT, exist_ok=True)
    for name, seed in (("first", 7), ("last", 8)):
        mm_fx.image(W, H, seed=seed).filter(ImageFilter.GaussianBlur(radius=2)).save(f"{OUT}/{name}.png")
    # Reload: the PNG pixels are what the Rust test passes with --init-img / --end-img.
    return {name: Image.open(f"{OUT}/{name}.png").convert("RGB") for name in ("first", "last")}


def encode_keyframe(vae, img):
    """Upstream: ImageNet-normalised pixels -> posterior mean (f32) -> (z - mean) / std."""
    pixels = torch.from_numpy(np.array(img)).permute(2, 0, 1)[None, :, None].float().div(255.0)
    pm = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
    ps = torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        z = vae.encode((pixels - pm) / ps).latent_dist.mode().float()
    assert z.shape == (1, 24, 1, H // 4, W // 4), z.shape
    lm = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    ls = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (z - lm) / ls


def noise_keyframe(z):
    """Upstream: a fresh Philox(seed) per keyframe, z * 0.999 + eps * (1 - 0.999) in f32."""
    eps = torch.from_numpy(rng_fx.philox_sdcpp(SEED, 0, z.numel()).astype(np.float32)).reshape(z.shape)
    a = torch.tensor(np.float32(NOISE_AUG))
    b = torch.tensor(np.float32(1.0) - np.float32(NOISE_AUG))
    return (z * a + eps * b).float(), eps


def presentation(tok, n_pads, text):
    vs, pad, ve = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    ids, tags = [], []
    for i, n in enumerate(n_pads):
        label = tok(f"<Picture {i + 1}>: ", add_special_tokens=False)["input_ids"]
        vision = [vs] + [pad] * n + [ve]
        ids += label + vision
        tags += [1] * len(label) + [0] * len(vision)
    p = tok(text, add_special_tokens=False)["input_ids"]
    return ids + p, tags + [1] * len(p)


def reference_media():
    """ref.png (80x80, a blurred random image) and ref.wav (2400 samples of 32 kHz stereo int16 PCM), written and
    reloaded: the files are what the Rust test passes."""
    os.makedirs(OUT, exist_ok=True)
    mm_fx.image(REF_SIZE, REF_SIZE, seed=9).filter(ImageFilter.GaussianBlur(radius=2)).save(f"{OUT}/ref.png")
    t = np.arange(REF_SAMPLES, dtype=np.float64) / REF_RATE
    rng = np.random.default_rng(10)
    left = 0.3 * np.sin(2 * np.pi * 440.0 * t) + 0.2 * np.sin(2 * np.pi * 1330.0 * t)
    right = 0.25 * np.sin(2 * np.pi * 587.0 * t + 0.5) + 0.25 * np.sin(2 * np.pi * 2750.0 * t + 1.0)
    x = np.stack([left, right]) + 0.01 * rng.standard_normal((2, REF_SAMPLES))
    pcm = np.clip(np.round(x * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(f"{OUT}/ref.wav", "wb") as fh:
        fh.setnchannels(2)
        fh.setsampwidth(2)
        fh.setframerate(REF_RATE)
        fh.writeframes(pcm.T.tobytes())  # interleaved L R L R ...

    img = Image.open(f"{OUT}/ref.png").convert("RGB")
    with wave.open(f"{OUT}/ref.wav", "rb") as fh:
        assert (fh.getnchannels(), fh.getsampwidth(), fh.getframerate()) == (2, 2, REF_RATE)
        n = fh.getnframes()
        data = np.frombuffer(fh.readframes(n), dtype="<i2").reshape(n, 2)
    audio = (data.T.astype(np.float32) / np.float32(32768.0)).copy()  # (2, samples)
    assert audio.shape == (2, REF_SAMPLES)
    return img, audio


def cpp_round(v):
    """C++ std::round for v >= 0: halves away from zero."""
    f = math.floor(v)
    return int(f + (1 if v - f >= 0.5 else 0))


def upstream_reference_image(img):
    """Upstream: the reference's own size, area-capped at the target canvas (never upscaled), snapped to multiples of
    32, then a NEAREST resize: output (x, y) reads input (x * sw // w, y * sh // h), no antialias."""
    sw, sh = img.size
    scale = min(1.0, math.sqrt(W * H / (sw * sh)))
    w = max(32, cpp_round(sw * scale / 32) * 32)
    h = max(32, cpp_round(sh * scale / 32) * 32)
    a = np.array(img)
    ys = (np.arange(h) * sh) // h
    xs = (np.arange(w) * sw) // w
    return Image.fromarray(np.ascontiguousarray(a[ys][:, xs]), "RGB"), scale


def encode_reference_audio(avae, waveform):
    """Upstream: clamp to [-1, 1], zero-pad to a multiple of 800 samples, each channel through the audio VAE encoder
    (posterior MEAN, the two channels as two batch items, as diffusers' Ref2VA reference encoder), normalised with the
    audio VAE's latents_mean / latents_std; rows channel-major (2 * L, C). Never noised."""
    x = torch.from_numpy(waveform).float().clamp(-1.0, 1.0)
    pad = -x.shape[1] % REF_AUDIO_BLOCK
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    with torch.no_grad():
        posterior = avae.encode(x[:, None], return_dict=False)[0]
    z = posterior.mode().float().transpose(1, 2)  # (2, L, C)
    hop = int(np.prod(avae.config.encoder_rates))
    assert z.shape[0] == 2 and z.shape[1] * hop == x.shape[1], (z.shape, hop, x.shape)
    am = torch.tensor(avae.config.latents_mean).view(1, 1, -1)
    ast = torch.tensor(avae.config.latents_std).view(1, 1, -1)
    return ((z - am) / ast).reshape(-1, avae.config.latent_channels).contiguous()


def ref2va_presentation(tok, n_pad, text):
    """Upstream: every image reference first ("<Picture i>: " + vision block), then the standalone audios
    ("<Audio j>: "), then the prompt. One image and one audio here."""
    vs, pad, ve = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    label = tok("<Picture 1>: ", add_special_tokens=False)["input_ids"]
    vision = [vs] + [pad] * n_pad + [ve]
    audio = tok("<Audio 1>: ", add_special_tokens=False)["input_ids"]
    p = tok(text, add_special_tokens=False)["input_ids"]
    ids = label + vision + audio + p
    tags = [1] * len(label) + [0] * len(vision) + [1] * len(audio) + [1] * len(p)
    return ids, tags


def main():
    proc, tok = mm_fx.processor()
    proc.image_processor = image_processor()
    te = mm_fx.model(tok)
    layers = te.config.text_config.num_hidden_layers - 1
    vae = AutoencoderKLMiniMaxH3.from_pretrained(VAE_DIR).eval()
    avae = AutoencoderKLMiniMaxH3Audio.from_pretrained(AUDIO_VAE_DIR).eval()
    dit = MiniMaxH3Transformer3DModel.from_pretrained(DIT_DIR).eval()
    ca = avae.config.latent_channels

    images = keyframe_pngs()
    latents = {k: encode_keyframe(vae, v) for k, v in images.items()}
    noised = {}
    for k, z in latents.items():
        noised[k], eps = noise_keyframe(z)

    ref_source, ref_wave = reference_media()
    ref_image, ref_scale = upstream_reference_image(ref_source)
    assert ref_image.size == (W, H), ref_image.size
    ref_latent = encode_keyframe(vae, ref_image)
    ref_noised, ref_eps = noise_keyframe(ref_latent)
    assert torch.equal(ref_eps, eps)  # the same fresh Philox(seed, 0) as the keyframes
    ref_audio_rows = encode_reference_audio(avae, ref_wave)

    f = 4  # the tiny VAE's spatial factor
    lh, lw = H // f, W // f
    t_lat = 7
    audio_len = round(FRAMES / 24 * 40)
    plane = t_lat * lh * lw
    extra = -(-audio_len * 2 * ca // plane)
    sig_v = sdcli_sigmas(STEPS, SHIFT) + [0.0]
    sig_a = [remap(s, SHIFT, AUDIO_SHIFT) for s in sig_v]
    sig_a[0] = 1.0
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    pm = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
    ps = torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
    am = torch.tensor(avae.config.latents_mean).view(1, -1, 1)
    ast = torch.tensor(avae.config.latents_std).view(1, -1, 1)

    def states(ids, vin):
        with torch.no_grad():
            return get_qwen3vl_prompt_embeds(te, proc, ids, vin, text_encoder_layer=layers)[0].float()

    def sample(cond, tags, uncond, utags, layout, cond_rows, cond_audio_rows):
        """The Euler / CFG loop. `layout(text_tags)` builds the packed sequence; `cond_rows` (patchified video
        conditioning) and `cond_audio_rows` (reference soundtrack rows) lead the transformer's two inputs on every
        call, constant over the steps; only the generated rows are stepped and decoded."""
        noise = torch.randn((1, 24 + extra, t_lat, lh, lw), generator=torch.Generator().manual_seed(SEED))
        flat = noise.flatten()
        x_v = noise[:, :24].clone()
        x_a = flat[24 * plane: 24 * plane + audio_len * 2 * ca].reshape(ca, 2, audio_len).permute(1, 2, 0).clone()

        def predict(text, ttags, video_rows, audio_rows, t_v, t_a):
            pos, token_tags, vid, aud, txt, ncv, nca = layout(ttags)
            assert ncv == cond_rows.shape[0] and nca == cond_audio_rows.shape[0], (ncv, nca)
            uniq, inv = MiniMaxH3SetTimestepsStep.build_row_timesteps(
                vid, aud, ncv, nca, txt.numel(), t_v, t_a, max(t_v, NOISE_AUG), 1.0)
            rows = torch.cat([cond_rows, video_rows])
            arows = torch.cat([cond_audio_rows, audio_rows])
            with torch.no_grad():
                v, a = dit(hidden_states=rows[None], audio_hidden_states=arows[None],
                           encoder_hidden_states=text[None], timestep=uniq, timestep_indices=inv,
                           token_tags=token_tags, position_ids=pos, video_indices=vid,
                           audio_indices=aud, text_indices=txt, return_dict=False)
            # The transformer returns every video / audio row, the conditioning / reference ones first.
            assert v.shape[1] == ncv + video_rows.shape[0], v.shape
            assert a.shape[1] == nca + audio_rows.shape[0], a.shape
            return v[0, ncv:], a[0, nca:]

        for i in range(STEPS):
            sv, sv1, sa, sa1 = sig_v[i], sig_v[i + 1], sig_a[i], sig_a[i + 1]
            rows = patchify_video_latents(x_v, PATCH)
            arows = x_a.reshape(2 * audio_len, ca)
            t_v, t_a = 1.0 - float(torch.tensor(sv).clamp(1e-6, 1.0)), 1.0 - sa
            cv, ca_ = predict(cond, tags, rows, arows, t_v, t_a)
            uv, ua = predict(uncond, utags, rows, arows, t_v, t_a)
            gv, ga = uv + CFG * (cv - uv), ua + CFG * (ca_ - ua)
            gv = gv.reshape(1, t_lat, lh // 2, lw // 2, 24, 1, 2, 2).permute(0, 4, 1, 5, 2, 6, 3, 7)
            gv = gv.reshape(1, 24, t_lat, lh, lw)
            x_v = x_v + (sv - sv1) * gv
            x_a = x_a + (sa - sa1) * ga.reshape(2, audio_len, ca)

        with torch.no_grad():
            video = vae.decode(x_v * std + mean, return_dict=False)[0]
            wave_ = avae.decode(x_a.permute(0, 2, 1) * ast + am, return_dict=False)[0]
        video = (video.float() * ps + pm).clamp(0, 1)[0].permute(1, 0, 2, 3).contiguous()
        return video, wave_.float().reshape(2, -1).contiguous()

    def text_outputs(cond, tags, uncond, utags, ids, uids):
        return {
            "cond": cond.contiguous(), "uncond": uncond.contiguous(),
            "tags": tags.float(), "uncond_tags": utags.float(),
            "ids": torch.tensor(ids, dtype=torch.float32), "uncond_ids": torch.tensor(uids, dtype=torch.float32),
        }

    def run(names, anchors):
        kfs = [images[n] for n in names]
        n_pads, vin = [], {}
        if kfs:  # (no keyframes: the T2VA baseline of the diagnostics)
            vision = proc.image_processor(images=kfs, return_tensors="pt")
            grid = vision["image_grid_thw"]
            assert grid.tolist() == [[1, 4, 4]] * len(kfs), grid
            n_pads = [int(g.prod()) // proc.image_processor.merge_size ** 2 for g in grid]
            vin = {"pixel_values": vision["pixel_values"], "image_grid_thw": grid}

        ids, tags = presentation(tok, n_pads, PROMPT)
        uids, utags = presentation(tok, n_pads, NEGATIVE)
        cond, uncond = states(ids, vin), states(uids, vin)
        tags, utags = torch.tensor(tags, dtype=torch.long), torch.tensor(utags, dtype=torch.long)
        kf_rows = torch.cat([patchify_video_latents(noised[n], PATCH) for n in names] + [torch.zeros(0, 96)])

        def layout(ttags):
            return MiniMaxH3PrepareLayoutStep.build_packed_sequence(
                ttags, t_lat, lh, lw, audio_len, PATCH, 2, 2, 0, anchors)

        video, wave_ = sample(cond, tags, uncond, utags, layout, kf_rows, torch.zeros(0, ca))
        keyframes = torch.cat([noised[n][:, :, 0] for n in names] + [torch.zeros(0, 24, lh, lw)]).contiguous()
        out = text_outputs(cond, tags, uncond, utags, ids, uids)
        out.update({"keyframe_rows": keyframes, "video": video, "audio": wave_})
        return out

    def run_ref2va():
        """One reference image, then one reference soundtrack (upstream's images-then-audio order)."""
        refs = [MiniMaxH3ImageReference(image=ref_image), MiniMaxH3AudioReference(audio=torch.from_numpy(ref_wave),
                                                                                    sample_rate=REF_RATE)]
        vision = proc.image_processor(images=[ref_image], return_tensors="pt")
        grid = vision["image_grid_thw"]
        assert grid.tolist() == [[1, 4, 4]], grid
        n_pad = int(grid[0].prod()) // proc.image_processor.merge_size ** 2
        vin = {"pixel_values": vision["pixel_values"], "image_grid_thw": grid}

        ids, tags = ref2va_presentation(tok, n_pad, PROMPT)
        uids, utags = ref2va_presentation(tok, n_pad, NEGATIVE)
        for text, i_, t_ in ((PROMPT, ids, tags), (NEGATIVE, uids, utags)):
            # For this order (images first) upstream's presentation is diffusers' request-order one.
            assert (i_, t_) == MiniMaxH3Ref2VATextEncoderStep._build_presentation(tok, text, refs, [n_pad], [], [])
        cond, uncond = states(ids, vin), states(uids, vin)
        tags, utags = torch.tensor(tags, dtype=torch.long), torch.tensor(utags, dtype=torch.long)

        def layout(ttags):
            return MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
                ttags, refs, [ref_noised], [ref_audio_rows], t_lat, lh, lw, audio_len, PATCH, 2, 2, 0)

        video, wave_ = sample(cond, tags, uncond, utags, layout, patchify_video_latents(ref_noised, PATCH),
                              ref_audio_rows)
        out = text_outputs(cond, tags, uncond, utags, ids, uids)
        out.update({"ref_latent": ref_latent[0, :, 0].contiguous(), "ref_audio_rows": ref_audio_rows,
                    "video": video, "audio": wave_})
        return out

    cases = {"i2va": (("first",), ("first",)), "fl2va": (("first", "last"), ("first", "last"))}
    results = {c: run(*args) for c, args in cases.items()}
    results["ref2va"] = run_ref2va()
    # Diagnostics only: the first keyframe swapped for last.png, and no keyframe at all (T2VA).
    swapped = run(("last",), ("first",))
    t2va = run((), ())

    # Text encoder: the truncated language model + the whole vision tower, config, tokenizer.
    os.makedirs(f"{OUT}/text_encoder", exist_ok=True)
    keep = {}
    for k, v in te.state_dict().items():
        if k.startswith("model.visual."):
            keep[k] = v.contiguous()
            continue
        if not k.startswith("model.language_model."):
            continue
        rest = k[len("model.language_model."):]
        if rest.startswith("norm."):
            continue
        if rest.startswith("layers.") and int(rest.split(".")[1]) >= layers:
            continue
        keep[k] = v.contiguous()
    save_file(keep, f"{OUT}/text_encoder/model.safetensors")
    shutil.copy(os.path.join(mm_fx.base.TOK, "tokenizer.json"), f"{OUT}/text_encoder/tokenizer.json")
    with open(f"{OUT}/text_encoder/config.json", "w") as fh:
        json.dump(te.config.to_dict(), fh, indent=2, default=str)

    out = {f"{c}.{k}": v for c, r in results.items() for k, v in r.items()}
    out["eps"] = eps.flatten()[:16].contiguous()
    out["first_latent"] = latents["first"][0, :, 0].contiguous()
    out["last_latent"] = latents["last"][0, :, 0].contiguous()
    save_file(out, f"{OUT}/reference.safetensors")

    def mse(a, b):
        return float(((a - b) ** 2).mean())

    def psnr(a, b):
        return 10 * np.log10(1.0 / max(mse(a, b), 1e-12))

    px = {k: torch.from_numpy(np.array(v)).permute(2, 0, 1).float() / 255 for k, v in images.items()}
    for c, r in results.items():
        v = r["video"]
        print(c, "tokens cond", r["cond"].shape[0], "uncond", r["uncond"].shape[0],
              "video", tuple(v.shape), "audio", tuple(r["audio"].shape), "max|audio|", float(r["audio"].abs().max()),
              "keyframe_rows", tuple(r["keyframe_rows"].shape) if "keyframe_rows" in r else None)
        print(f"  frame0 vs first.png PSNR {psnr(v[0], px['first']):.2f} dB, vs last.png {psnr(v[0], px['last']):.2f};"
              f" last frame vs last.png {psnr(v[-1], px['last']):.2f}, vs first.png {psnr(v[-1], px['first']):.2f}")
    def snr(got, want):
        return 10 * np.log10(float((want ** 2).sum()) / max(float(((got - want) ** 2).sum()), 1e-30))

    # In the terms of the Rust pipeline test: video PSNR (dB, [0, 1] frames), audio SNR (dB).
    for a, b, r1, r2 in (("i2va", "fl2va", results["i2va"], results["fl2va"]),
                         ("i2va", "i2va(last.png as first)", results["i2va"], swapped),
                         ("i2va", "t2va (no keyframe)", results["i2va"], t2va),
                         ("fl2va", "t2va (no keyframe)", results["fl2va"], t2va),
                         ("ref2va", "t2va (no reference)", results["ref2va"], t2va),
                         ("ref2va", "i2va", results["ref2va"], results["i2va"])):
        print(f"{a} vs {b}: video MSE {mse(r1['video'], r2['video']):.3g} (PSNR {psnr(r1['video'], r2['video']):.1f} dB),"
              f" audio SNR {snr(r2['audio'], r1['audio']):.1f} dB")
    print("i2va(last.png as first) frame0 PSNR vs last.png", f"{psnr(swapped['video'][0], px['last']):.2f}")
    assert not torch.equal(results["i2va"]["video"], results["fl2va"]["video"])
    assert not torch.equal(results["i2va"]["video"], swapped["video"])
    assert not torch.equal(results["ref2va"]["video"], t2va["video"])
    assert not torch.equal(results["ref2va"]["audio"], t2va["audio"])
    r = results["ref2va"]
    ref_px = torch.from_numpy(np.array(ref_image)).permute(2, 0, 1).float() / 255
    print(f"ref2va: ref.png {ref_source.size} -> scale {ref_scale:.6f} -> {ref_image.size} (nearest);"
          f" frame0 vs resized ref PSNR {psnr(r['video'][0], ref_px):.2f} dB (t2va {psnr(t2va['video'][0], ref_px):.2f});"
          f" reference audio latents per channel L = {r['ref_audio_rows'].shape[0] // 2},"
          f" rows {tuple(r['ref_audio_rows'].shape)}, |rows| mean {float(r['ref_audio_rows'].abs().mean()):.4f};"
          f" ref |z| {float(r['ref_latent'].abs().mean()):.4f}")
    # With no references, the ref2va layout is the T2VA one, so t2va above is the ref2va run minus its references.
    tt = torch.tensor(presentation(tok, [], PROMPT)[1], dtype=torch.long)
    a_ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(tt, t_lat, lh, lw, audio_len, PATCH, 2, 2, 0, ())
    b_ = MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
        tt, [], [], [], t_lat, lh, lw, audio_len, PATCH, 2, 2, 0)
    assert all(torch.equal(x, y) if torch.is_tensor(x) else x == y for x, y in zip(a_, b_))
    print("keyframe |z| first", float(latents["first"].abs().mean()), "last", float(latents["last"].abs().mean()),
          "eps[:4]", eps.flatten()[:4].tolist(), "sigmas", sig_v, sig_a)
    total = 0
    for root, _, files in os.walk(OUT):
        for name in sorted(files):
            p = os.path.join(root, name)
            total += os.path.getsize(p)
            print(f"  {p} {os.path.getsize(p)}")
    print("total bytes", total)
    for k, v in out.items():
        print(f"  {k} {tuple(v.shape)} {v.dtype}")


if __name__ == "__main__":
    main()
