"""Golden fixtures for LoRA runs (tests/lora.rs).

Run from the repository root (after sd_pipeline_fixtures.py, pixart_pipeline_fixtures.py and
qwen_image_pipeline_fixtures.py):
    python3 tests/reference/lora_fixtures.py

Random LoRA files in the formats users have, for the tiny pipelines of tests/fixtures/sd_pipeline
and tests/fixtures/pixart_pipeline, and the pictures diffusers makes with them (same prompt, seed,
sampler and size as those fixtures):

  sd1_kohya.safetensors   kohya/A1111 names (`lora_unet_*` in diffusers' block names, `lora_te_*`),
                          rank 4 with `.alpha` 2, on every attention/feed-forward linear, the 1x1
                          proj_in/proj_out convolutions, the resnets' 3x3 convolutions and time
                          projections, and every CLIP linear
  sd1_kohya_pt.pt         the same as a `torch.save` checkpoint
  sd1_kohya_ldm.safetensors  the same LoRA with the UNet modules in LDM names (as SDXL trainers
                          write them); must give the same picture
  sd1_peft.safetensors    diffusers/PEFT names (`unet.*.lora_A/lora_B`, `text_encoder.*`), rank 2,
                          lora_alpha = rank (PEFT's metadata alpha is not read by sd-cli: scale 1)
  sd1_lycoris.safetensors LyCORIS LoHa (`hada_*`, with alpha) and LoKr (`lokr_*`), a full `.diff`
                          and a `.diff_b`; diffusers does not load these: the reference adds the
                          LyCORIS differences to the weights itself
  sd1_dora.safetensors    PEFT DoRA (`lora_magnitude_vector`) on UNet linears and 3x3 convolutions
  sdxl_kohya.safetensors  kohya SDXL (`lora_unet_*`, `lora_te1_*`, `lora_te2_*`)
  pixart_peft.safetensors PEFT on the PixArt transformer (`transformer.*`), applied by PEFT
  pixart_original.safetensors  the PixArt transformer in the original repository's layout (fused
                          qkv / kv): the diffusers-named LoRA lands on row slices of it
  qwen_peft.safetensors   PEFT on the Qwen Image 2.1 transformer with ComfyUI's `diffusion_model.`
  qwen_fused.safetensors  that transformer as a single file with the fused `img_mlp.gate_up`
  reference.safetensors   images [3, H, W] in [0, 1]:
      sd1_kohya          <lora:sd1_kohya:0.8>
      sd1_kohya_neg      <lora:sd1_kohya:-0.5>
      sd1_two            <lora:sd1_kohya:0.8> and <lora:sd1_peft:0.6>
      sd1_lycoris        <lora:sd1_lycoris:0.7>
      sd1_dora           <lora:sd1_dora:0.8> (PEFT DoRA, applied by PEFT)
      sdxl_kohya         <lora:sdxl_kohya:1>
      pixart_peft        <lora:pixart_peft:0.9>
      qwen_peft          <lora:qwen_peft:0.7> ([4, H, W]: RGBA)
"""
import copy
import os
import sys

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file
from diffusers import (AutoencoderKL, EulerDiscreteScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel,
                       StableDiffusionPipeline, StableDiffusionXLPipeline)
from transformers import T5EncoderModel, T5TokenizerFast

sys.path.insert(0, os.path.dirname(__file__))
import ldm_layout  # noqa: E402
import pixart_fixtures  # noqa: E402
import sd_pipeline_fixtures as spf  # noqa: E402

OUT = "tests/fixtures/lora"
SD = spf.OUT
PIXART = "tests/fixtures/pixart_pipeline"
T5_TOKENIZER = os.path.join(os.path.dirname(__file__), "../../../shared/tokenizers/t5-v1_1.tokenizer.json")
PIXART_PROMPT, PIXART_NEGATIVE = "A Lovely cat, holding a sign!  ", "blurry"


def sd_pipe(variant):
    if variant == "sd1":
        return StableDiffusionPipeline.from_pretrained(f"{SD}/sd1", tokenizer=spf.tokenizer("<|endoftext|>"),
                                                       safety_checker=None, feature_extractor=None,
                                                       requires_safety_checker=False)
    return StableDiffusionXLPipeline.from_pretrained(f"{SD}/sdxl", tokenizer=spf.tokenizer("<|endoftext|>"),
                                                     tokenizer_2=spf.tokenizer("!"))


def sd_image(pipe):
    with torch.no_grad():
        return pipe(spf.PROMPT, negative_prompt=spf.NEGATIVE, num_inference_steps=spf.STEPS, guidance_scale=spf.CFG,
                    height=spf.H, width=spf.W, generator=torch.Generator().manual_seed(spf.SEED),
                    output_type="np").images[0]


def as_chw(image):
    return torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous()


def check_base(image, variant):
    want = load_file(f"{SD}/{variant}/reference.safetensors")["image"]
    err = float((as_chw(image) - want).abs().max())
    assert err < 1e-5, f"{variant}: the reloaded pipeline does not reproduce its fixture ({err})"


def adaptable(model, select):
    """(name, module) of the Linear / Conv2d modules `select` keeps."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d)) and select(n)]


def lora_pair(m, rank, gen, up_scale):
    if isinstance(m, nn.Linear):
        down = torch.randn(rank, m.in_features, generator=gen) / m.in_features ** 0.5
        up = torch.randn(m.out_features, rank, generator=gen) * up_scale / rank ** 0.5
    else:
        fan = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
        down = torch.randn(rank, m.in_channels, *m.kernel_size, generator=gen) / fan ** 0.5
        up = torch.randn(m.out_channels, rank, 1, 1, generator=gen) * up_scale / rank ** 0.5
    return down, up


def kohya(model, prefix, select, rank, alpha, gen, up_scale, rename=lambda n: n):
    out = {}
    for name, m in adaptable(model, select):
        down, up = lora_pair(m, rank, gen, up_scale)
        key = prefix + rename(name).replace(".", "_")
        out[f"{key}.lora_down.weight"] = down.half()  # LoRA files are mostly f16
        out[f"{key}.lora_up.weight"] = up.half()
        out[f"{key}.alpha"] = torch.tensor(float(alpha))
    return out


def te_name(name):
    """kohya names CLIP modules as transformers 4 did (`text_model.encoder...`)."""
    return name if name.startswith("text_model.") else "text_model." + name


def unet_select(n):
    return ("attentions" in n and (n.endswith(("to_q", "to_k", "to_v", "to_out.0", "proj", "net.2", "proj_in",
                                               "proj_out"))))\
        or ("resnets" in n and n.endswith(("conv1", "conv2", "time_emb_proj")))


def te_select(n):
    return n.endswith(("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"))


def peft(model, select, rank, gen, up_scale):
    """PEFT-named LoRA weights (diffusers' saved format, without the component prefix)."""
    out = {}
    for name, m in adaptable(model, select):
        down, up = lora_pair(m, rank, gen, up_scale)
        out[f"{name}.lora_A.weight"] = down
        out[f"{name}.lora_B.weight"] = up
    return out


def load(pipe, path, name):
    pipe.load_lora_weights(path, adapter_name=name)


def count_adapted(pipe):
    comps = [pipe.unet, pipe.text_encoder] + ([pipe.text_encoder_2] if hasattr(pipe, "text_encoder_2") else [])
    return sum(sum(1 for n, _ in c.named_modules() if n.endswith("lora_A")) for c in comps)


def loha_lokr(unet, te, gen):
    """LyCORIS LoHa on attention linears, LoKr on a linear and a 3x3 conv, a .diff and a .diff_b;
    returns the file's tensors and {module: delta} in diffusers names per component."""
    tensors, deltas = {}, {}

    def add(comp, prefix, name, d, bias=None):
        deltas.setdefault(comp, {})[name] = (d, bias)

    # LoHa: (w1a @ w1b) * (w2a @ w2b) * alpha / rank
    for name, m in adaptable(unet, lambda n: "attn1" in n and n.endswith(("to_q", "to_v"))):
        r, alpha = 3, 1.5
        w1a = torch.randn(m.out_features, r, generator=gen) * 0.5
        w1b = torch.randn(r, m.in_features, generator=gen) * 0.5
        w2a = torch.randn(m.out_features, r, generator=gen) * 0.5
        w2b = torch.randn(r, m.in_features, generator=gen) * 0.5
        key = "lora_unet_" + name.replace(".", "_")
        tensors.update({f"{key}.hada_w1_a": w1a, f"{key}.hada_w1_b": w1b, f"{key}.hada_w2_a": w2a,
                        f"{key}.hada_w2_b": w2b, f"{key}.alpha": torch.tensor(alpha)})
        add("unet", key, name, (w1a @ w1b) * (w2a @ w2b) * (alpha / r))
    # LoKr on a linear: kron(w1, w2_a @ w2_b) * alpha / rank(w2)
    for name, m in adaptable(unet, lambda n: n.endswith("ff.net.2")):
        f = 2
        w1 = torch.randn(f, f, generator=gen) * 0.5
        r, alpha = 2, 1.0
        w2a = torch.randn(m.out_features // f, r, generator=gen) * 0.3
        w2b = torch.randn(r, m.in_features // f, generator=gen) * 0.3
        key = "lora_unet_" + name.replace(".", "_")
        tensors.update({f"{key}.lokr_w1": w1, f"{key}.lokr_w2_a": w2a, f"{key}.lokr_w2_b": w2b,
                        f"{key}.alpha": torch.tensor(alpha)})
        add("unet", key, name, torch.kron(w1, w2a @ w2b) * (alpha / r))
    # LoKr on a 3x3 conv, both factors whole (scale 1).
    for name, m in adaptable(unet, lambda n: n == "down_blocks.0.resnets.0.conv2"):
        f = 2
        w1 = torch.randn(f, f, generator=gen) * 0.3
        w2 = torch.randn(m.out_channels // f, m.in_channels // f, 3, 3, generator=gen) * 0.1
        key = "lora_unet_" + name.replace(".", "_")
        tensors.update({f"{key}.lokr_w1": w1, f"{key}.lokr_w2": w2})
        add("unet", key, name, torch.kron(w1[:, :, None, None], w2))
    # A full difference with a bias difference on a CLIP linear.
    for name, m in adaptable(te, lambda n: n.endswith("layers.0.mlp.fc1")):
        d = torch.randn(m.weight.shape, generator=gen) * 0.2
        b = torch.randn(m.bias.shape, generator=gen) * 0.2
        key = "lora_te_" + te_name(name).replace(".", "_")
        tensors.update({f"{key}.diff": d, f"{key}.diff_b": b})
        add("te", key, name, d, b)
    return tensors, deltas


def apply_deltas(model, deltas, weight):
    mods = dict(model.named_modules())
    with torch.no_grad():
        for name, (d, b) in deltas.items():
            mods[name].weight.add_(d.reshape(mods[name].weight.shape) * weight)
            if b is not None:
                mods[name].bias.add_(b * weight)


def sd1_cases(refs):
    gen = torch.Generator().manual_seed(1234)
    base = sd_pipe("sd1")
    check_base(sd_image(base), "sd1")

    k = {}
    k.update(kohya(base.unet, "lora_unet_", unet_select, 4, 2.0, gen, 0.5))
    k.update(kohya(base.text_encoder, "lora_te_", te_select, 4, 2.0, gen, 0.5, te_name))
    save_file(k, f"{OUT}/sd1_kohya.safetensors")
    torch.save(k, f"{OUT}/sd1_kohya_pt.pt")  # the same LoRA as a PyTorch checkpoint
    cfg = base.unet.config
    ldm = {}
    for key, v in k.items():
        if key.startswith("lora_unet_"):
            stem, part = key.split(".", 1)
            module = next(n for n, _ in base.unet.named_modules() if "lora_unet_" + n.replace(".", "_") == stem)
            stem = "lora_unet_" + ldm_layout.unet_key(module + ".weight", cfg)[:-len(".weight")].replace(".", "_")
            key = f"{stem}.{part}"
        ldm[key] = v
    save_file(ldm, f"{OUT}/sd1_kohya_ldm.safetensors")

    p = {}
    p.update({"unet." + n: v for n, v in peft(base.unet, unet_select, 2, gen, 0.4).items()})
    p.update({"text_encoder." + n: v for n, v in peft(base.text_encoder, te_select, 2, gen, 0.4).items()})
    save_file(p, f"{OUT}/sd1_peft.safetensors")

    pipe = sd_pipe("sd1")
    load(pipe, f"{OUT}/sd1_kohya.safetensors", "kohya")
    n_kohya = sum(1 for key in k if key.endswith(".alpha"))
    assert count_adapted(pipe) == n_kohya, (count_adapted(pipe), n_kohya)
    pipe.set_adapters(["kohya"], [0.8])
    refs["sd1_kohya"] = as_chw(sd_image(pipe))
    pipe.set_adapters(["kohya"], [-0.5])
    refs["sd1_kohya_neg"] = as_chw(sd_image(pipe))
    load(pipe, f"{OUT}/sd1_peft.safetensors", "peft")
    pipe.set_adapters(["kohya", "peft"], [0.8, 0.6])
    refs["sd1_two"] = as_chw(sd_image(pipe))

    # DoRA (PEFT `lora_magnitude_vector`) on attention linears and resnet convolutions.
    pipe = sd_pipe("sd1")
    pipe.unet, state = inject(pipe.unet, ["to_q", "to_v", "ff.net.2", "conv1"], 2, gen, "dora", 0.8, dora=True)
    assert any("lora_magnitude_vector" in k for k in state)
    save_file({"unet." + k: v.contiguous() for k, v in state.items()}, f"{OUT}/sd1_dora.safetensors")
    refs["sd1_dora"] = as_chw(sd_image(pipe))

    lyco, deltas = loha_lokr(base.unet, base.text_encoder, gen)
    save_file(lyco, f"{OUT}/sd1_lycoris.safetensors")
    pipe = sd_pipe("sd1")
    apply_deltas(pipe.unet, deltas["unet"], 0.7)
    apply_deltas(pipe.text_encoder, deltas["te"], 0.7)
    refs["sd1_lycoris"] = as_chw(sd_image(pipe))
    for name in ("sd1_kohya", "sd1_two", "sd1_lycoris"):
        diff = float((refs[name] - load_file(f"{SD}/sd1/reference.safetensors")["image"]).abs().max())
        print(name, "differs from the base picture by", diff)


def sdxl_case(refs):
    gen = torch.Generator().manual_seed(4321)
    base = sd_pipe("sdxl")
    check_base(sd_image(base), "sdxl")
    k = {}
    k.update(kohya(base.unet, "lora_unet_", unet_select, 4, 4.0, gen, 0.5))
    k.update(kohya(base.text_encoder, "lora_te1_", te_select, 2, 1.0, gen, 0.5, te_name))
    k.update(kohya(base.text_encoder_2, "lora_te2_", te_select, 2, 2.0, gen, 0.5, te_name))
    save_file(k, f"{OUT}/sdxl_kohya.safetensors")
    load(base, f"{OUT}/sdxl_kohya.safetensors", "kohya")
    n_kohya = sum(1 for key in k if key.endswith(".alpha"))
    assert count_adapted(base) == n_kohya, (count_adapted(base), n_kohya)
    base.set_adapters(["kohya"], [1.0])
    refs["sdxl_kohya"] = as_chw(sd_image(base))


def pixart_case(refs):
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer
    gen = torch.Generator().manual_seed(99)
    tok = T5TokenizerFast(tokenizer_file=T5_TOKENIZER)
    t5 = T5EncoderModel.from_pretrained(f"{PIXART}/text_encoder").eval()
    transformer = PixArtTransformer2DModel.from_pretrained(f"{PIXART}/transformer").eval()
    vae = AutoencoderKL.from_pretrained(f"{PIXART}/vae").eval()
    scheduler = EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02,
                                       beta_schedule="linear", prediction_type="epsilon",
                                       timestep_spacing="linspace", interpolation_type="linear")
    pipe = PixArtSigmaPipeline(tokenizer=tok, text_encoder=t5, vae=vae, transformer=transformer, scheduler=scheduler)

    def image():
        with torch.no_grad():
            return pipe(PIXART_PROMPT, negative_prompt=PIXART_NEGATIVE, num_inference_steps=4, guidance_scale=4.5,
                        height=16, width=24, generator=torch.Generator().manual_seed(42), output_type="np",
                        use_resolution_binning=False, clean_caption=False, max_sequence_length=300).images[0]

    want = load_file(f"{PIXART}/reference.safetensors")["image"]
    assert float((as_chw(image()) - want).abs().max()) < 1e-5, "PixArt base picture differs"
    original = pixart_fixtures.to_original(transformer.state_dict())
    save_file({k: v.contiguous() for k, v in original.items()}, f"{OUT}/pixart_original.safetensors")

    targets = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2", "proj_out", "linear_1"]
    # PixArtTransformer2DModel has no PEFT mixin in diffusers: inject the adapter with PEFT.
    transformer = inject_adapter_in_model(LoraConfig(r=2, lora_alpha=2, target_modules=targets,
                                                     init_lora_weights=False), transformer, adapter_name="px")
    pipe.transformer = transformer
    with torch.no_grad():
        for n, p in transformer.named_parameters():
            if "lora_A" in n:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    from peft.utils import get_peft_model_state_dict
    state = get_peft_model_state_dict(transformer, adapter_name="px")
    save_file({"transformer." + k: v.contiguous() for k, v in state.items()}, f"{OUT}/pixart_peft.safetensors")
    for m in transformer.modules():
        if isinstance(m, LoraLayer):
            m.set_scale("px", 0.9)
    refs["pixart_peft"] = as_chw(image())
    print("pixart LoRA modules", len(state) // 2, "changes the picture by",
          float((refs["pixart_peft"] - want).abs().max()))


def inject(model, targets, rank, gen, name, scale, dora=False):
    """A random PEFT LoRA (or DoRA) on `targets` of `model` (in place) at weight `scale`; its
    state dict."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer
    from peft.utils import get_peft_model_state_dict
    model = inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, use_dora=dora,
                                               init_lora_weights=False), model, adapter_name=name)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_A" in n:
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
            elif "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            elif "lora_magnitude_vector" in n:
                p.mul_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    for m in model.modules():
        if isinstance(m, LoraLayer):
            m.set_scale(name, scale)
    return model, get_peft_model_state_dict(model, adapter_name=name)


def qwen_case(refs):
    """Qwen Image 2.1: a PEFT LoRA with diffusers names (ComfyUI's `diffusion_model.` prefix), and
    the transformer as a single file with the fused `img_mlp.gate_up`."""
    import qwen_image_pipeline_fixtures as qf
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline
    gen = torch.Generator().manual_seed(77)
    proc, vocab = qf.te_fx.processor()
    te = qf.te_fx.model(vocab)
    dit = qf.transformer(te.config.text_config.hidden_size)
    ae = qf.vae()
    sched = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, use_dynamic_shifting=True, base_image_seq_len=256, max_image_seq_len=8192,
        base_shift=0.5, max_shift=0.9, shift_terminal=0.02, time_shift_type="exponential")
    pipe = QwenImage21Pipeline(scheduler=sched, vae=ae, text_encoder=te, processor=proc, transformer=dit)

    def image():
        with torch.no_grad():
            return pipe(qf.PROMPT, negative_prompt=qf.NEGATIVE, true_cfg_scale=qf.CFG, height=qf.H, width=qf.W,
                        num_inference_steps=qf.STEPS, generator=torch.Generator().manual_seed(qf.SEED),
                        output_type="np").images[0]

    want = load_file(f"{qf.OUT}/reference.safetensors")["image"]
    assert float((as_chw(image()) - want).abs().max()) < 1e-5, "Qwen Image 2.1 base picture differs"
    fused = {}
    for k, v in dit.state_dict().items():
        if ".img_mlp.proj." in k:
            continue
        if ".img_mlp.gate_layer." in k:
            k2 = k.replace(".gate_layer.", ".proj.")
            v = torch.cat([v, dit.state_dict()[k2]], 0)
            k = k.replace(".gate_layer.", ".gate_up.")
        fused["model.diffusion_model." + k] = v.contiguous()
    save_file(fused, f"{OUT}/qwen_fused.safetensors")
    targets = ["to_q", "to_k", "to_v", "to_out.0", "img_mlp.proj", "img_mlp.gate_layer", "img_mlp.out", "img_in"]
    dit, state = inject(dit, targets, 2, gen, "q", 0.7)
    pipe.transformer = dit
    save_file({"diffusion_model." + k: v.contiguous() for k, v in state.items()}, f"{OUT}/qwen_peft.safetensors")
    refs["qwen_peft"] = as_chw(image())
    print("qwen LoRA modules", len(state) // 2, "changes the picture by", float((refs["qwen_peft"] - want).abs().max()))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    refs = {}
    sd1_cases(refs)
    sdxl_case(refs)
    pixart_case(refs)
    qwen_case(refs)
    for k, v in refs.items():
        print(k, tuple(v.shape), float(v.min()), float(v.max()), "saturated", float(((v <= 0) | (v >= 1)).float().mean()))
    save_file(refs, f"{OUT}/reference.safetensors")
