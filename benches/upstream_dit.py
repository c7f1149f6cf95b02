"""Step time of this sd-cli against the upstream C++ sd-cli on the same GGUF, both driven through their
command lines: FLUX.1-dev at the real widths with the blocks of benches/dit_step.py, SD3.5 medium whole.

    SD_CPP_CLI=/path/to/upstream/sd-cli python3 benches/upstream_dit.py <flux|sd35m> [--types q8_0,f16]

Needs the diffusers weights `cargo bench --bench dit_step -- --model <model>` writes (/tmp/dit_step_<model>)
and `target/release/sd-cli` (cargo build --release). Writes beside those weights: the transformer in
its single-file names (BFL / Stability), a 16-channel AutoencoderKL at the released widths with random
weights, and the GGUFs the upstream binary converts from that single file (`-M convert --type T`), so both
programs read the same bytes. No T5 (both fill in zeros: FLUX 256 tokens, SD3 154); random CLIP-L (and for
SD3 CLIP-G) at the released sizes, because upstream crashes without them. Each run
does 4 euler steps at 512x512 with 2 threads in a pseudo-terminal (so both draw their progress bars per
step); the step time is the median wall time between the bars' step counts after the first step (which
carries each program's lazy work), empty gaps left out. Both are stopped once the last step is drawn (the VAE is not timed).
The upstream binary is built outside this repository from leejet/stable-diffusion.cpp.
"""
import argparse
import os
import pty
import re
import shutil
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/reference"))


def qwen3_4b(dst):
    """Qwen3-4B's shape whole (36 layers: upstream's Z-Image reads layer 35 by index), random f16 in
    transformers' names."""
    from transformers import Qwen3Config, Qwen3Model
    cfg = Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                      rope_theta=1e6, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen3Model(cfg)
    gen = torch.Generator().manual_seed(1)
    state = {}
    for k, v in model.state_dict().items():
        t = torch.ones(v.shape) if v.ndim == 1 else torch.randn(v.shape, generator=gen) * 0.02
        state["model." + k] = t.to(torch.float16)
    save_file(state, dst)


def single_file(model_name, src, dst):
    """FLUX: the bench's transformer in BFL names. SD3.5 medium: the released depth (24 blocks, the
    first 13 with a second attention), random f16 in Stability's names, because upstream reads the
    MMDiT depth as at least 24 whatever the file holds."""
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel
    if model_name == "flux":
        import flux_fixtures as fx
        save_file(fx.to_bfl(FluxTransformer2DModel.from_pretrained(src)), dst)
        return
    if model_name == "zimage":
        from diffusers import ZImageTransformer2DModel
        import z_image_fixtures as fx
        save_file(fx.to_original(ZImageTransformer2DModel.from_pretrained(src)), dst)
        return
    import sd3_fixtures as fx
    with torch.device("meta"):
        model = SD3Transformer2DModel(sample_size=128, patch_size=2, in_channels=16, num_layers=24,
                                      attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                                      caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
                                      pos_embed_max_size=384, qk_norm="rms_norm", dual_attention_layers=tuple(range(13)))
    gen = torch.Generator().manual_seed(0)
    state = {}
    for k, v in model.state_dict().items():
        if k.endswith("bias"):
            state[k] = torch.zeros(v.shape, dtype=torch.float16)
        elif v.ndim == 1:
            state[k] = torch.ones(v.shape, dtype=torch.float16)
        else:
            state[k] = (torch.randn(v.shape, generator=gen) * 0.02).to(torch.float16)
    save_file(fx.to_sai(state), dst)


def vae(dst_dir):
    """The FLUX `ae` / SD3 VAE shape (128-256-512-512, 16 latent channels, no quant convs), random."""
    from diffusers import AutoencoderKL
    torch.manual_seed(3)
    model = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                          up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                          layers_per_block=2, latent_channels=16, norm_num_groups=32, sample_size=1024,
                          scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                          use_post_quant_conv=False).eval()
    model.save_pretrained(dst_dir, safe_serialization=True)


def clip(dst, big):
    """CLIP ViT-L/14's text model, or bigG's with its projection, at the released size, random f16 in the
    names ComfyUI's clip_l / clip_g files use."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
    torch.manual_seed(4)
    if big:
        cfg = CLIPTextConfig(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                             num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu",
                             projection_dim=1280)
        model = CLIPTextModelWithProjection(cfg).eval()
    else:
        cfg = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                             num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu")
        model = CLIPTextModel(cfg).eval()
    sd = {}
    for k, v in model.state_dict().items():
        if not k.endswith("position_ids"):
            name = k if k.startswith(("text_model.", "text_projection")) else "text_model." + k
            sd[name] = v.to(torch.float16).contiguous()
    save_file(sd, dst)


# A sampling bar's count: "k/n - 1.23s/it" (upstream's bar has no label; ours says "sampling").
STEP = re.compile(rb"\|\s*(\d+)/(\d+) - [\d.]+\s*(?:s/it|it/s)")


def timed_steps(cmd, steps):
    """Runs `cmd` in a pty; returns the median seconds per step after the first."""
    master, slave = pty.openpty()
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, close_fds=True)
    os.close(slave)
    seen, buf, out = {}, b"", b""
    while steps not in seen:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        buf += chunk
        *lines, buf = re.split(rb"[\r\n]", buf)
        for line in lines:
            m = STEP.search(line)
            if m and b"loading" not in line and int(m.group(2)) == steps:
                seen.setdefault(int(m.group(1)), time.time() - t0)
    proc.kill()
    proc.wait()
    if steps not in seen:
        raise SystemExit(f"no step {steps}/{steps} from {cmd[0]}:\n{out[-3000:].decode(errors='replace')}")
    # Upstream redraws its bar late (two counts can arrive together): drop the empty gaps.
    per = sorted(g for g in (seen[k + 1] - seen[k] for k in range(1, steps) if k in seen and k + 1 in seen)
                 if g > 0.05)
    return per[len(per) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["flux", "sd35m", "zimage"])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--types", default="q8_0")
    ap.add_argument("--ours", default=os.path.join(HERE, "../target/release/sd-cli"))
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    upstream = os.environ.get("SD_CPP_CLI")
    if not upstream:
        raise SystemExit("set SD_CPP_CLI to the upstream sd-cli binary")
    d = args.dir or f"/tmp/dit_step_{args.model}"
    single = os.path.join(d, "single.safetensors")
    if not os.path.exists(single):
        single_file(args.model, d, single)
    vae_dir = os.path.join(d, "vae")
    if not os.path.exists(os.path.join(vae_dir, "diffusion_pytorch_model.safetensors")):
        vae(vae_dir)
    vae_file = os.path.join(vae_dir, "diffusion_pytorch_model.safetensors")
    size = ["-W", "512", "-H", "512"]
    if args.model == "zimage":
        # Z-Image Turbo at 1024²: the whole Qwen3-4B shape (random; ours reads the tiny Qwen
        # tokenizer placed beside it, upstream its built-in one: captions of similar length, both
        # padded to 32).
        llm = os.path.join(d, "llm", "qwen3_4b.safetensors")
        if not os.path.exists(llm):
            os.makedirs(os.path.dirname(llm), exist_ok=True)
            qwen3_4b(llm)
            shutil.copy(os.path.join(HERE, "../tests/fixtures/z_image/tokenizer/tokenizer.json"),
                        os.path.join(os.path.dirname(llm), "tokenizer.json"))
        cfg, size = ["--cfg-scale", "1", "--llm", llm], ["-W", "1024", "-H", "1024"]
    else:
        # Upstream crashes with no text encoder at all (SIGSEGV), and for SD3 with CLIP-L alone (a
        # rank mismatch joining the pooled states): both programs get CLIP-L, for SD3 CLIP-G too.
        encoders = [("clip_l", False)] + ([("clip_g", True)] if args.model == "sd35m" else [])
        cfg = ["--cfg-scale", "1", "--guidance", "3.5"] if args.model == "flux" else ["--cfg-scale", "4.5"]
        for name, big in encoders:
            path = os.path.join(d, f"{name}.safetensors")
            if not os.path.exists(path):
                clip(path, big)
            cfg += [f"--{name}", path]
    common = ["-p", "a cat", "--steps", str(args.steps), "-s", "42", "-t", "2", "--sampling-method", "euler",
              "-o", os.path.join(d, "out.png")] + size + cfg
    for ty in args.types.split(","):
        gguf = os.path.join(d, f"dit_{ty}.gguf")
        if not os.path.exists(gguf):
            subprocess.run([upstream, "-M", "convert", "-m", single, "-o", gguf, "--type", ty], check=True,
                           stdout=subprocess.DEVNULL)
        size = os.path.getsize(gguf) / 2**20
        run = ["--diffusion-model", gguf, "--vae", vae_file] + common
        theirs = timed_steps([upstream] + run, args.steps)
        ours = timed_steps([args.ours] + run, args.steps)
        print(f"{args.model} {ty} ({size:.0f} MB GGUF): upstream sd-cli {theirs:.2f} s/step, "
              f"ours {ours:.2f} s/step ({ours / theirs:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
