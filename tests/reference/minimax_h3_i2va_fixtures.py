"""Golden fixtures for conditioned MiniMax-H3 runs: I2VA (a first keyframe), FL2VA (first + last
keyframes), Ref2VA (one reference image + one reference soundtrack) and Ref2VA with a reference video
(one reference image + one reference video with its soundtrack + one standalone reference soundtrack), on
the tiny components of minimax_h3_pipeline_fixtures.py.

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
  two agree (asserted against diffusers' `_build_presentation`);
- Ref2VA reference video (case "ref2va_video"): upstream normalises it to 24 fps by whole-frame
  drop/duplicate (`lround(count * 24 / fps)` frames, frame f reading source frame floor(f * fps / 24);
  the CLI passes a frame directory at fps 24), caps the count at the request's frames and decrements
  it until n % 17 == 5, and sizes it at a 768 short edge (area-capped at 768 * 1344) unless the
  source is smaller, in which case the source size snapped to multiples of 32 (never upscaled; a
  64x64 source stays 64x64); diffusers resamples with its video processor. Its VAE latent is the
  keyframes' recipe over the whole clip (posterior mean; visual noise from a fresh Philox(seed, 0)
  over the whole latent in C order, so its first 6144 eps are the keyframes'). The conditioner sees
  every 12th normalised frame (2 fps) at timestamp f / 24 (f32), paired over Qwen3-VL's temporal
  patch of 2 (an odd last frame pairs with itself), each pair labelled "<t seconds>" with
  t = (t0 + t1) * 0.5f printed `std::fixed << setprecision(1)` ("<0.2 seconds>" for (0, 0.5)), and
  -- unlike diffusers, which uses <|video_pad|> and `pixel_values_videos` from its video processor --
  upstream fills the block with <|image_pad|> and feeds the pair through the image path (the two
  frames as the two temporal slots of each patch, image grid [1, h, w], image mRoPE). Here the pair's
  patches are built by hand in the image processor's layout and passed with the picture as IMAGES
  (`pixel_values`, `image_grid_thw` [[1, 4, 4], [1, 4, 4]]). The video's soundtrack is encoded like a
  standalone reference soundtrack and is labelled "<Audio j>: " right before "<Video k>: ".
- Ref2VA tokenization: upstream concatenates the whole presentation into ONE string and tokenizes it
  whole (special tokens split it, the BPE pre-tokenizer runs over each span between them), so a
  label's trailing space merges with the next piece (": a" -> ':' ' a', ": <" -> ':' ' <'). sd-cli
  does the same, and so do these fixtures (`upstream_tokens`); diffusers tokenizes per piece (the
  script prints both counts). For the keyframe presentations the two agree.

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

Ref2VA with a reference video (case "ref2va_video", no keyframes): ref.png and ref.wav as in "ref2va",
plus ref_video/frame_000.png .. frame_029.png (30 64x64 RGB frames: a blurred random image rolled one
pixel right and down per frame with a brightness ramp, passed at fps 24) and its soundtrack
ref_video.wav (2400 samples of 32 kHz stereo int16 PCM, other tones), all reloaded from disk. The clip
is 22 frames (min(30, 22), 22 % 17 == 5), 64x64, frame f = source frame f -> latent (1, 24, 7, 16, 16);
the conditioner pairs frames (0, 12) -> one block "<0.2 seconds>". Presentation (both prompts):
`tok("<Picture 1>: ")` + vision block (4 pads) + `tok("<Audio 1>: ")` + `tok("<Video 1>: ")` +
`tok("<0.2 seconds>")` + <|vision_start|> <|image_pad|> x4 <|vision_end|> + `tok("<Audio 2>: ")` +
`tok(prompt)` (vision block rows tag 0, all else 1; asserted equal to diffusers' `_build_presentation`
of [image, video with audio, audio] with its <|video_pad|> ids read as <|image_pad|>). Layout: diffusers'
`build_ref2va_packed_sequence` with references [image, video (has_audio), audio] ->
[text | 64 image rows | 2L video-soundtrack rows | 7 * 64 video rows | 2L standalone rows | target audio |
target video]; hidden_states = [noised image rows | noised patchified video rows | generated video] and
audio_hidden_states = [video soundtrack rows | standalone rows | generated audio], the order of the
layout's video_indices / audio_indices (asserted); `build_row_timesteps` pins the image and video rows at
max(t_v, 0.999) and both soundtracks at 1.0. Start noise, loop and decoding as the other cases.

Writes tests/fixtures/minimax_h3_i2va/:
  first.png, last.png      the 64x64 keyframes (blurred random images; the PNG pixels are the truth)
  ref.png, ref.wav         the Ref2VA reference image (80x80, blurred random) and soundtrack (stereo
                           sine mixes + a little noise, 32 kHz int16); the file contents are the truth
  ref_video/frame_NNN.png, ref_video.wav   the reference video (30 frames, 64x64) and its soundtrack
  text_encoder/model.safetensors  model.language_model.* (layers 0-1, no norm) + model.visual.*
  text_encoder/config.json, tokenizer.json
  reference.safetensors, per case c in {i2va, fl2va, ref2va, ref2va_video}:
    {c}.cond / {c}.uncond   text states [L, 32] / [L_neg, 32]
    {c}.tags / {c}.uncond_tags   modality tags of the text rows (f32 0/1) [L] / [L_neg]
    {c}.ids / {c}.uncond_ids     the presentation token ids (f32) [L] / [L_neg]
    {c}.keyframe_rows       (i2va, fl2va) the noised, normalised keyframe latents [K, 24, 16, 16]
                            (K = 1 / 2, packed order; unpatchified, i.e. the (1, 24, 1, 16, 16) latents stacked)
    ref2va.ref_latent       the unnoised normalised latent of the resized reference image [24, 16, 16]
    ref2va.ref_audio_rows   the normalised reference soundtrack rows [2 * 200, 4] (channel-major)
    ref2va_video.video_latent   the unnoised normalised reference-video latent [24, 7, 16, 16]
    ref2va_video.audio_rows     every reference audio row in packed order: the video's soundtrack, then
                                ref.wav [4 * 200, 4] (channel-major per clip)
    ref2va_video.positions      position_ids of the whole (cond) layout [S, 3] as f32, for debugging
    {c}.video               frames [F, 3, H, W] in [0, 1]
    {c}.audio               waveform [2, samples]
  and eps (the first 16 Philox(seed 42, offset 0) normals), first_latent / last_latent (the
  unnoised normalised keyframe latents [24, 16, 16]).

Diagnostics (printed, not saved): the same run with last.png as the first keyframe and with no
keyframe at all (T2VA at this geometry, which is also the Ref2VA run without its references: the
two layouts coincide, asserted), compared as video PSNR / audio SNR. With these tiny random models
the keyframes / references move the decoded frames only slightly (video PSNR ~45-64 dB between
cases) but the soundtrack clearly (audio SNR ~23-38 dB; ref2va vs t2va: 49.2 dB / 26.5 dB;
ref2va_video vs t2va: 45.2 dB / 22.8 dB, vs ref2va: 49.9 dB / 27.8 dB).
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
from diffusers.modular_pipelines.minimax_h3.references import (
    MiniMaxH3AudioReference,
    MiniMaxH3ImageReference,
    MiniMaxH3VideoReference,
)
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
REF_VIDEO_FRAMES, REF_VIDEO_FPS = 30, 24.0  # ref_video/: 30 PNG frames, passed at the CLI's default 24 fps
REF_VIDEO_STRIDE = 12  # upstream's conditioner reads every 12th normalised 24 fps frame (2 fps)


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


def presentation_pieces(tok, n_pads, text):
    vs, pad, ve = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    ids, tags = [], []
    for i, n in enumerate(n_pads):
        label = tok(f"<Picture {i + 1}>: ", add_special_tokens=False)["input_ids"]
        vision = [vs] + [pad] * n + [ve]
        ids += label + vision
        tags += [1] * len(label) + [0] * len(vision)
    p = tok(text, add_special_tokens=False)["input_ids"]
    return ids + p, tags + [1] * len(p)


def presentation(tok, n_pads, text):
    """The keyframe presentation; the per-piece and whole-string tokenizations agree for it."""
    ids, tags = presentation_pieces(tok, n_pads, text)
    whole = "".join(f"<Picture {i + 1}>: " + vision_block(n) for i, n in enumerate(n_pads)) + text
    assert upstream_tokens(tok, whole) == (ids, tags)
    return ids, tags


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


def upstream_tokens(tok, presentation):
    """Upstream tokenizes the whole presentation string at once (a label's trailing space merges into
    what follows, e.g. ': a' -> ':', ' a'); tags are 0 from each <|vision_start|> through its
    <|vision_end|>, 1 elsewhere."""
    vs, ve = (tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    ids = tok(presentation, add_special_tokens=False)["input_ids"]
    tags, inside = [], False
    for i in ids:
        if i == vs:
            inside = True
        tags.append(0 if inside else 1)
        if i == ve:
            inside = False
    return ids, tags


def vision_block(n):
    return "<|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|>"


def ref2va_presentation(tok, n_pad, text):
    """Upstream: every image reference first ("<Picture i>: " + vision block), then the standalone audios
    ("<Audio j>: "), then the prompt. One image and one audio here."""
    return upstream_tokens(tok, "<Picture 1>: " + vision_block(n_pad) + "<Audio 1>: " + text)


def reference_video_media():
    """ref_video/frame_000.png ... frame_029.png (64x64 RGB: a blurred random image rolled one pixel right and one
    down per frame, with a brightness ramp) and ref_video.wav (its soundtrack: 2400 samples of 32 kHz stereo int16 PCM,
    other tones than ref.wav), written and reloaded: the files are what the Rust test passes."""
    os.makedirs(f"{OUT}/ref_video", exist_ok=True)
    base = np.array(mm_fx.image(W, H, seed=11).filter(ImageFilter.GaussianBlur(radius=2)), dtype=np.float64)
    for k in range(REF_VIDEO_FRAMES):
        px = np.roll(base, (k, k), axis=(0, 1)) + (-40.0 + 80.0 * k / (REF_VIDEO_FRAMES - 1))
        frame = np.clip(np.round(px), 0, 255).astype(np.uint8)
        Image.fromarray(frame, "RGB").save(f"{OUT}/ref_video/frame_{k:03d}.png")
    t = np.arange(REF_SAMPLES, dtype=np.float64) / REF_RATE
    rng = np.random.default_rng(12)
    left = 0.35 * np.sin(2 * np.pi * 330.0 * t) + 0.15 * np.sin(2 * np.pi * 990.0 * t + 0.3)
    right = 0.3 * np.sin(2 * np.pi * 523.25 * t + 1.2) + 0.2 * np.sin(2 * np.pi * 1760.0 * t + 2.0)
    x = np.stack([left, right]) + 0.01 * rng.standard_normal((2, REF_SAMPLES))
    pcm = np.clip(np.round(x * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(f"{OUT}/ref_video.wav", "wb") as fh:
        fh.setnchannels(2)
        fh.setsampwidth(2)
        fh.setframerate(REF_RATE)
        fh.writeframes(pcm.T.tobytes())  # interleaved L R L R ...

    names = sorted(os.listdir(f"{OUT}/ref_video"))
    assert names == [f"frame_{k:03d}.png" for k in range(REF_VIDEO_FRAMES)], names
    frames = [Image.open(f"{OUT}/ref_video/{n}").convert("RGB") for n in names]
    with wave.open(f"{OUT}/ref_video.wav", "rb") as fh:
        assert (fh.getnchannels(), fh.getsampwidth(), fh.getframerate()) == (2, 2, REF_RATE)
        n = fh.getnframes()
        data = np.frombuffer(fh.readframes(n), dtype="<i2").reshape(n, 2)
    audio = (data.T.astype(np.float32) / np.float32(32768.0)).copy()  # (2, samples)
    assert audio.shape == (2, REF_SAMPLES)
    return frames, audio


def upstream_reference_video(frames, fps):
    """Upstream's reference-video normalisation: lround(count * 24 / fps) frames at 24 fps, capped at the request's
    frame count and decremented until n % 17 == 5; the canvas is the 768-short-edge nominal size (area-capped at
    768 * 1344) unless the source is smaller, then the source size snapped to multiples of 32; frame f reads source
    frame min(count - 1, floor(f * fps / 24)). Then the conditioner's frames: every 12th (2 fps) with timestamp f / 24
    (f32), paired (an odd last one with itself), each pair labelled with its mean timestamp."""
    count = len(frames)
    n = min(cpp_round(count * 24.0 / fps), FRAMES)
    assert n >= 5
    while n % 17 != 5:
        n -= 1
    sw, sh = frames[0].size
    ratio = sw / sh
    nw, nh = (768.0 * ratio, 768.0) if ratio >= 1.0 else (768.0, 768.0 / ratio)
    if nw * nh > 768.0 * 1344.0:
        s = math.sqrt((768.0 * 1344.0) / (nw * nh))
        nw, nh = nw * s, nh * s
    w, h = max(32, cpp_round(nw / 32.0) * 32), max(32, cpp_round(nh / 32.0) * 32)
    if sw * sh < w * h:
        w, h = max(32, cpp_round(sw / 32.0) * 32), max(32, cpp_round(sh / 32.0) * 32)
    # The fixture's 64x64 source is its own normalised size: upstream's resize is then the identity.
    assert (w, h) == (sw, sh) == (W, H), ((w, h), (sw, sh))
    clip = [frames[min(count - 1, math.floor(f * fps / 24.0))] for f in range(n)]
    sampled = list(range(0, n, REF_VIDEO_STRIDE))
    stamps = [np.float32(f) / np.float32(24.0) for f in sampled]
    pairs = []
    for i in range(0, len(sampled), 2):
        j = min(i + 1, len(sampled) - 1)
        mid = np.float32((stamps[i] + stamps[j]) * np.float32(0.5))
        pairs.append((sampled[i], sampled[j], "<%.1f seconds>" % float(mid)))  # std::fixed << setprecision(1)
    return clip, pairs


def encode_reference_video(vae, clip):
    """As a keyframe, over the whole clip: ImageNet-normalised pixels (1, 3, n, H, W) -> posterior mean (f32) ->
    (z - mean) / std."""
    pixels = torch.from_numpy(np.stack([np.array(f) for f in clip])).permute(3, 0, 1, 2)[None].float().div(255.0)
    pm = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
    ps = torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        z = vae.encode((pixels - pm) / ps).latent_dist.mode().float()
    lm = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    ls = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return (z - lm) / ls


def vision_pixels(ip, img):
    """The image processor's own per-frame arithmetic (its rescale by 1/255, then its normalize with mean 0.5,
    std 0.5), on the (C, H, W) uint8 pixels; no resize (64x64 needs none)."""
    x = ip.rescale(np.ascontiguousarray(np.array(img).transpose(2, 0, 1)), ip.rescale_factor)
    return np.asarray(ip.normalize(x, ip.image_mean, ip.image_std), dtype=np.float32)


def patchify_vision_pair(ip, first, second):
    """A video block's pixel_values by hand, in Qwen2-VL's image-patch layout: patches in merge-block order (gh, gw,
    mh, mw), each flattened over (C, T, ph, pw) with `first` in temporal slot 0 and `second` in slot 1 -- upstream's
    process_video_block_tensor."""
    patch, merge = ip.patch_size, ip.merge_size
    x = np.stack([vision_pixels(ip, first), vision_pixels(ip, second)])  # (T, C, H, W)
    t, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    x = x.reshape(t, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(2, 5, 3, 6, 1, 0, 4, 7)  # (gh/m, gw/m, mh, mw, C, T, ph, pw)
    return torch.from_numpy(np.ascontiguousarray(x.reshape(gh * gw, c * t * patch * patch))), [1, gh, gw]


def ref2va_video_presentation(tok, n_image_pad, video_blocks, text):
    """Upstream's order: every image ("<Picture i>: " + vision block), then every video -- its soundtrack's
    "<Audio j>: " label first, then "<Video k>: " and per frame pair "<t seconds>" + a vision block of
    <|image_pad|> -- then the standalone audios ("<Audio j>: "), then the prompt. One image, one video with a
    soundtrack and one standalone audio here; tokenized as one string, as upstream."""
    s = "<Picture 1>: " + vision_block(n_image_pad) + "<Audio 1>: " + "<Video 1>: "
    for label, n in video_blocks:
        s += label + vision_block(n)
    return upstream_tokens(tok, s + "<Audio 2>: " + text)


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
            # diffusers tokenizes piece by piece; upstream the whole string (one token fewer here).
            d_ids, _ = MiniMaxH3Ref2VATextEncoderStep._build_presentation(tok, text, refs, [n_pad], [], [])
            print("ref2va tokens: upstream", len(i_), "diffusers", len(d_ids))
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

    video_frames, video_wave = reference_video_media()
    video_clip, video_pairs = upstream_reference_video(video_frames, REF_VIDEO_FPS)
    video_latent = encode_reference_video(vae, video_clip)
    assert video_latent.shape == (1, 24, t_lat, lh, lw), video_latent.shape
    video_noised, video_eps = noise_keyframe(video_latent)  # a fresh Philox(seed, 0) over the whole latent
    assert torch.equal(video_eps.flatten()[:eps.numel()], eps.flatten())
    video_audio_rows = encode_reference_audio(avae, video_wave)

    def run_ref2va_video():
        """One reference image, one reference video with its soundtrack, one standalone soundtrack (upstream's
        images, videos, audios order, which is also the request order here)."""
        refs = [MiniMaxH3ImageReference(image=ref_image),
                MiniMaxH3VideoReference(frames=np.stack([np.array(f) for f in video_clip]), fps=24.0,
                                        audio=torch.from_numpy(video_wave), sample_rate=REF_RATE),
                MiniMaxH3AudioReference(audio=torch.from_numpy(ref_wave), sample_rate=REF_RATE)]
        assert [r.kind for r in refs] == ["image", "video", "audio"] and refs[1].has_audio
        ip = proc.image_processor
        vision = ip(images=[ref_image], return_tensors="pt")
        assert vision["image_grid_thw"].tolist() == [[1, 4, 4]], vision["image_grid_thw"]
        n_pad = int(vision["image_grid_thw"][0].prod()) // ip.merge_size ** 2
        # The hand patchify is the processor's when both temporal slots hold the same frame.
        same, _ = patchify_vision_pair(ip, ref_image, ref_image)
        assert torch.equal(same, vision["pixel_values"]), float((same - vision["pixel_values"]).abs().max())
        pixel_values, grids, blocks = [vision["pixel_values"]], [[1, 4, 4]], []
        for f0, f1, label in video_pairs:
            pv, grid = patchify_vision_pair(ip, video_clip[f0], video_clip[f1])
            pixel_values.append(pv)
            grids.append(grid)
            blocks.append((label, grid[1] * grid[2] // ip.merge_size ** 2))
        vin = {"pixel_values": torch.cat(pixel_values), "image_grid_thw": torch.tensor(grids, dtype=torch.long)}

        ids, tags = ref2va_video_presentation(tok, n_pad, blocks, PROMPT)
        uids, utags = ref2va_video_presentation(tok, n_pad, blocks, NEGATIVE)
        # diffusers' presentation of the same request (labels, order, tags), but with <|video_pad|> video blocks.
        sampled, stamps = MiniMaxH3Ref2VATextEncoderStep._sample_video_condition_frames(
            refs[1].frames, 24.0, 24.0 / REF_VIDEO_STRIDE, ip.temporal_patch_size)
        assert ["<%.1f seconds>" % s for s in stamps] == [b[0] for b in blocks], (stamps, blocks)
        assert len(sampled) == len(range(0, len(video_clip), REF_VIDEO_STRIDE))
        vpad, ipad = tok.convert_tokens_to_ids("<|video_pad|>"), tok.convert_tokens_to_ids("<|image_pad|>")
        for text, i_, t_ in ((PROMPT, ids, tags), (NEGATIVE, uids, utags)):
            d_ids, d_tags = MiniMaxH3Ref2VATextEncoderStep._build_presentation(
                tok, text, refs, [n_pad], [blocks[0][1]], [stamps])
            print("ref2va_video tokens: upstream", len(i_), "diffusers", len(d_ids))
        cond, uncond = states(ids, vin), states(uids, vin)
        tags, utags = torch.tensor(tags, dtype=torch.long), torch.tensor(utags, dtype=torch.long)

        cond_latents = [ref_noised, video_noised]
        audio_cond = [video_audio_rows, ref_audio_rows]

        def layout(ttags):
            return MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence(
                ttags, refs, cond_latents, audio_cond, t_lat, lh, lw, audio_len, PATCH, 2, 2, 0)

        # The transformer reads its i-th video / audio input row at video_indices[i] / audio_indices[i]: check that
        # [image rows | video rows | target] and [video soundtrack | standalone soundtrack | target] are the layout's
        # order (per reference: soundtrack rows, then video rows, in sequence order).
        pos, _, vid, aud, txt, ncv, nca = layout(tags)
        n_text, n_img, n_vid = txt.numel(), lh // 2 * lw // 2, t_lat * (lh // 2) * (lw // 2)
        n_va, n_sa = video_audio_rows.shape[0], ref_audio_rows.shape[0]
        s = n_text
        expect_v = [torch.arange(s, s + n_img)]
        expect_a = [torch.arange(s + n_img, s + n_img + n_va)]
        expect_v.append(torch.arange(s + n_img + n_va, s + n_img + n_va + n_vid))
        s += n_img + n_va + n_vid
        expect_a.append(torch.arange(s, s + n_sa))
        s += n_sa
        expect_a.append(torch.arange(s, s + 2 * audio_len))
        expect_v.append(torch.arange(s + 2 * audio_len, s + 2 * audio_len + t_lat * (lh // 2) * (lw // 2)))
        assert torch.equal(vid, torch.cat(expect_v)) and torch.equal(aud, torch.cat(expect_a))
        assert (ncv, nca) == (n_img + n_vid, n_va + n_sa) and pos.shape[0] == vid.numel() + aud.numel() + n_text

        cond_rows = torch.cat([patchify_video_latents(ref_noised, PATCH), patchify_video_latents(video_noised, PATCH)])
        video, wave_ = sample(cond, tags, uncond, utags, layout, cond_rows, torch.cat(audio_cond))
        out = text_outputs(cond, tags, uncond, utags, ids, uids)
        out.update({"video_latent": video_latent[0].contiguous(), "audio_rows": torch.cat(audio_cond).contiguous(),
                    "positions": pos.float().contiguous(), "video": video, "audio": wave_})
        return out

    cases = {"i2va": (("first",), ("first",)), "fl2va": (("first", "last"), ("first", "last"))}
    results = {c: run(*args) for c, args in cases.items()}
    results["ref2va"] = run_ref2va()
    results["ref2va_video"] = run_ref2va_video()
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
                         ("ref2va", "i2va", results["ref2va"], results["i2va"]),
                         ("ref2va_video", "t2va (no reference)", results["ref2va_video"], t2va),
                         ("ref2va_video", "ref2va", results["ref2va_video"], results["ref2va"])):
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
    assert not torch.equal(results["ref2va_video"]["video"], results["ref2va"]["video"])
    assert not torch.equal(results["ref2va_video"]["audio"], results["ref2va"]["audio"])
    r = results["ref2va_video"]
    n_text = r["cond"].shape[0]
    vf0 = torch.from_numpy(np.array(video_clip[0])).permute(2, 0, 1).float() / 255
    print(f"ref2va_video: {len(video_frames)} frames @ {REF_VIDEO_FPS:g} fps -> {len(video_clip)} normalised frames,"
          f" video latent {tuple(r['video_latent'].shape)} |z| {float(r['video_latent'].abs().mean()):.4f};"
          f" conditioner pairs {video_pairs}; L per clip: video soundtrack {video_audio_rows.shape[0] // 2},"
          f" standalone {ref_audio_rows.shape[0] // 2}; audio_rows {tuple(r['audio_rows'].shape)};"
          f" tokens cond {n_text} (vision tags {int((r['tags'] == 0).sum())}) uncond {r['uncond'].shape[0]};"
          f" sequence {r['positions'].shape[0]} rows = {n_text} text + 64 image + {video_audio_rows.shape[0]} video"
          f" soundtrack + {t_lat * 64} video + {ref_audio_rows.shape[0]} standalone + {2 * audio_len} target audio"
          f" + {t_lat * 64} target video; frame0 vs reference frame 0 PSNR {psnr(r['video'][0], vf0):.2f} dB"
          f" (t2va {psnr(t2va['video'][0], vf0):.2f})")
    # Upstream builds the presentation as ONE string and tokenizes it whole (special tokens split it; the BPE
    # pre-tokenizer runs over each span between them), so a label's trailing space merges into what follows
    # ("<Audio 1>: a" -> ... ':' ' a'), and so do these fixtures: the saved ids re-tokenize to themselves.
    for c, txt_ in (("ref2va", PROMPT), ("ref2va", NEGATIVE), ("ref2va_video", PROMPT), ("ref2va_video", NEGATIVE)):
        got = results[c]["ids" if txt_ == PROMPT else "uncond_ids"].long().tolist()
        s_ = tok.decode(got, skip_special_tokens=False)
        whole = tok(s_, add_special_tokens=False)["input_ids"]
        assert whole == got, (c, txt_)
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
