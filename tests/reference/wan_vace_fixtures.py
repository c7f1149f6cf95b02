"""Golden fixtures for Wan 2.1 VACE (tests/wan_vace.rs).

Run from the repository root, after wan_pipeline_fixtures.py (whose tiny umT5 and Wan VAE this
reuses):
    python3 tests/reference/wan_vace_fixtures.py

Writes tests/fixtures/wan_vace/:
  dit/                 a tiny diffusers WanVACETransformer3DModel (4 blocks, 2 heads x 16, 6 in / 4 out
                       channels, text width 24, FFN 48, VACE blocks after main blocks [0, 2] (upstream's
                       every-second-block rule would give the same), 10 control channels)
  dit.single.*         the same weights under the Wan repository's names (`vace_blocks.N.before_proj` /
                       `after_proj`, `self_attn.q`, ...; checked against diffusers' converter), prefixed
                       `model.diffusion_model.`, as a borrow recipe (see wan_dit_fixtures.py)
  dit_cfg/             5 blocks with VACE blocks after [0, 3]: only config.json's `vace_layers` says so
  cases.safetensors    per case `<case>.latent` [C, T, H, W], `.control` [10, T, H, W], `.text`
                       [L, 24], `.t`, `.strength` and `.out`: `vace` (T=3, 8x12, strength 1),
                       `vace_weak` (strength 0.6), `vace_odd` (T=2, 7x11: latent and control zero-padded
                       to whole patches, the output cropped, as stable-diffusion.cpp), `cfg` (dit_cfg)
  transformer/         a tiny VACE model for the pipeline: 2 blocks, 2 heads x 12, 16 channels, text width
                       16, 2 VACE blocks, 96 control channels (2 x 16 latents + 64 mask channels)
  control/             6 control frames (64x48 PNG) for 9 output frames: upstream pads the rest with grey
  ref.png              a 64x48 reference image (`--init-img` of a VACE model)
  reference.safetensors
    `video_vace`       [F, 3, H, W] in [0, 1]: WanVACEPipeline's conditioning (its `prepare_video_latents`
                       and `prepare_masks`: mask all ones, the reference latent in front) with the control
                       video as upstream builds it (the frames, then grey), then the denoising loop on
                       sd-cli's sigmas (shift 5, 4 euler steps, CFG 5, empty negative prompt, noise seed 42
                       over the reference frame too, --vace-strength 0.8); the reference frame dropped
                       before the decode
    `video_t2v`        the same without control frames or reference (a grey control video), strength 1
"""
import json
import os
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from diffusers import AutoencoderKLWan, WanVACEPipeline, WanVACETransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from transformers import T5TokenizerFast, UMT5EncoderModel

sys.path.insert(0, os.path.dirname(__file__))
from sd3_fixtures import sdcli_sigmas  # noqa: E402
from wan_dit_fixtures import BLOCK_RULES, PREFIX, TOP_RULES  # noqa: E402
from wan_pipeline_fixtures import CFG, FRAMES, H, PROMPT, SEED, SHIFT, STEPS, TOKENIZER, W, states  # noqa: E402

OUT = "tests/fixtures/wan_vace"
WAN = "tests/fixtures/wan"


def init_weights(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale_shift_table"):
                p.copy_(0.5 * torch.randn_like(p))
            elif p.ndim >= 2:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    return model


def dit(seed, layers, vace_layers):
    torch.manual_seed(seed)
    model = WanVACETransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=6, out_channels=4,
                                      text_dim=24, freq_dim=64, ffn_dim=48, num_layers=layers,
                                      vace_layers=vace_layers, vace_in_channels=10).eval()
    return init_weights(model)


def to_original(sd):
    """diffusers names -> the Wan repository's names, VACE blocks included."""
    out = {}
    for k, v in sd.items():
        nk = k
        for blocks in ("blocks.", "vace_blocks."):
            if k.startswith(blocks):
                index, rest = k[len(blocks):].split(".", 1)
                for a, b in BLOCK_RULES + [("proj_in.", "before_proj."), ("proj_out.", "after_proj.")]:
                    rest = rest.replace(a, b)
                nk = f"{blocks}{index}.{rest}"
                break
        else:
            for a, b in TOP_RULES.items():
                if k.startswith(a):
                    nk = b + k[len(a):]
                    break
        out[nk] = v.contiguous()
    return out


def save_single(model, name):
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    original = to_original(sd)
    back = convert_wan_transformer_to_diffusers({PREFIX + k: v for k, v in original.items()})
    assert set(back) == set(sd), set(back) ^ set(sd)
    for k in sd:
        assert torch.equal(back[k], sd[k]), k
    source = dict(zip(original, sd))
    weights = f"{name}/diffusion_pytorch_model.safetensors"
    borrow = {PREFIX + k: [weights, source[k], list(v.shape)] for k, v in original.items()}
    save_file({}, os.path.join(OUT, f"{name}.single.safetensors"))
    with open(os.path.join(OUT, f"{name}.single.borrow.json"), "w") as f:
        json.dump(borrow, f, indent=0, sort_keys=True)


def run_dit(model, latent, control, text, t, strength):
    n = len(model.config.vace_layers)
    with torch.no_grad():
        return model(hidden_states=latent, timestep=t, encoder_hidden_states=text, control_hidden_states=control,
                     control_hidden_states_scale=torch.full((n,), strength), return_dict=False)[0]


def dit_cases():
    g = torch.Generator().manual_seed(11)
    cases = {}
    model = dit(21, 4, [0, 2])
    model.save_pretrained(f"{OUT}/dit", safe_serialization=True)
    save_single(model, "dit")
    latent = torch.randn(1, 6, 3, 8, 12, generator=g)
    control = torch.randn(1, 10, 3, 8, 12, generator=g)
    text = torch.randn(1, 7, 24, generator=g)
    for name, strength in [("vace", 1.0), ("vace_weak", 0.6)]:
        cases[f"{name}.latent"], cases[f"{name}.control"], cases[f"{name}.text"] = latent[0], control[0], text[0]
        cases[f"{name}.t"] = torch.tensor([700.0])
        cases[f"{name}.strength"] = torch.tensor([strength])
        cases[f"{name}.out"] = run_dit(model, latent, control, text, torch.tensor([700.0]), strength)[0]

    odd = torch.randn(1, 6, 2, 7, 11, generator=g)
    odd_control = torch.randn(1, 10, 2, 7, 11, generator=g)
    pad = lambda x: torch.nn.functional.pad(x, (0, 1, 0, 1))  # noqa: E731
    cases["vace_odd.latent"], cases["vace_odd.control"], cases["vace_odd.text"] = odd[0], odd_control[0], text[0]
    cases["vace_odd.t"] = torch.tensor([400.0])
    cases["vace_odd.strength"] = torch.tensor([1.0])
    out = run_dit(model, pad(odd), pad(odd_control), text, torch.tensor([400.0]), 1.0)
    cases["vace_odd.out"] = out[0][:, :, :7, :11].contiguous()

    other = dit(22, 5, [0, 3])
    other.save_pretrained(f"{OUT}/dit_cfg", safe_serialization=True)
    cases["cfg.latent"], cases["cfg.control"], cases["cfg.text"] = latent[0], control[0], text[0]
    cases["cfg.t"] = torch.tensor([300.0])
    cases["cfg.strength"] = torch.tensor([1.0])
    cases["cfg.out"] = run_dit(other, latent, control, text, torch.tensor([300.0]), 1.0)[0]
    return cases


def pipeline_transformer():
    torch.manual_seed(31)
    model = WanVACETransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                      in_channels=16, out_channels=16, text_dim=16, freq_dim=256, ffn_dim=48,
                                      num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                                      vace_layers=[0, 1], vace_in_channels=96).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(f"{OUT}/transformer", safe_serialization=True)
    return model


def pictures():
    """Six smooth control frames and a reference image, 8-bit, written as PNG files."""
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    os.makedirs(f"{OUT}/control", exist_ok=True)
    frames = []
    for i in range(6):
        r = 127 + 100 * np.sin(xx / 9.0 + i * 0.5)
        g = 127 + 100 * np.cos(yy / 7.0 - i * 0.3)
        b = 127 + 90 * np.sin((xx + yy) / 13.0 + i)
        img = np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(f"{OUT}/control/frame_{i:03d}.png")
        frames.append(img)
    ref = np.stack([200 - 2 * xx, 60 + 3 * yy, 128 + 50 * np.sin(xx / 5.0)], -1).clip(0, 255).astype(np.uint8)
    Image.fromarray(ref).save(f"{OUT}/ref.png")
    return frames, ref


def to_unit(img):
    """8-bit HWC -> [3, H, W] in [-1, 1]."""
    return torch.from_numpy(img).permute(2, 0, 1).float() / 255.0 * 2 - 1


def run_pipeline(pipe, model, ae, cond, uncond, frames, ref, strength):
    video = torch.zeros(1, 3, FRAMES, H, W)  # grey in [-1, 1]
    for i, f in enumerate(frames):
        video[0, :, i] = to_unit(f)
    mask = torch.ones_like(video)
    refs = [[to_unit(ref)]] if ref is not None else [[]]
    with torch.no_grad():
        control = pipe.prepare_video_latents(video, mask, refs, None, torch.device("cpu"))
        masks = pipe.prepare_masks(mask, refs, None)
    control = torch.cat([control, masks], dim=1)
    n_ref = len(refs[0])
    t = (FRAMES - 1) // 4 + 1 + n_ref
    x = torch.randn((1, 16, t, H // 8, W // 8), generator=torch.Generator().manual_seed(SEED))
    scale = torch.full((len(model.config.vace_layers),), strength)
    sigmas = sdcli_sigmas(STEPS, SHIFT) + [0.0]
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        ts = torch.tensor([s * 1000.0])
        with torch.no_grad():
            kw = dict(hidden_states=x, timestep=ts, control_hidden_states=control,
                      control_hidden_states_scale=scale, return_dict=False)
            c = model(encoder_hidden_states=cond[None], **kw)[0]
            u = model(encoder_hidden_states=uncond[None], **kw)[0]
        x = x + (s_next - s) * (u + CFG * (c - u))
    x = x[:, :, n_ref:]
    mean = torch.tensor(ae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(ae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        out = ae.decode(x * std + mean, return_dict=False)[0][0]
    return (out / 2 + 0.5).clamp(0, 1).permute(1, 0, 2, 3).contiguous()


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = dit_cases()
    for k, v in cases.items():
        if k.endswith(".out"):
            print(k, tuple(v.shape), "max |out|", v.abs().max().item())
    save_file({k: v.clone().contiguous() for k, v in cases.items()}, f"{OUT}/cases.safetensors")

    te = UMT5EncoderModel.from_pretrained(f"{WAN}/text_encoder").eval()
    tok = T5TokenizerFast(tokenizer_file=TOKENIZER)
    ae = AutoencoderKLWan.from_pretrained(f"{WAN}/vae").eval()
    model = pipeline_transformer()
    pipe = WanVACEPipeline(tokenizer=tok, text_encoder=te, vae=ae, scheduler=None, transformer=model)
    cond, uncond = states(te, tok, PROMPT), states(te, tok, "")
    frames, ref = pictures()
    refs = {
        "video_vace": run_pipeline(pipe, model, ae, cond, uncond, frames, ref, 0.8),
        "video_t2v": run_pipeline(pipe, model, ae, cond, uncond, [], None, 1.0),
    }
    for k, v in refs.items():
        print(k, tuple(v.shape), float(v.min()), float(v.max()),
              "saturated", float(((v <= 0) | (v >= 1)).float().mean()))
    save_file(refs, f"{OUT}/reference.safetensors")


if __name__ == "__main__":
    main()
