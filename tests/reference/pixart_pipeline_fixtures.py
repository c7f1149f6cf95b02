"""Golden fixtures for a full PixArt-Σ text-to-image run (tests/pixart_pipeline.rs).

Run from the repository root:  python3 tests/reference/pixart_pipeline_fixtures.py

Builds a tiny random-weight PixArt-Σ pipeline with the real diffusers/transformers classes
(T5EncoderModel, PixArtTransformer2DModel, AutoencoderKL), saves each component the way
users have them (diffusers folders with config.json), runs PixArtSigmaPipeline with
EulerDiscreteScheduler configured like sd-cli's `euler` + `discrete` on PixArt's linear-beta
schedule (4 steps: integer timesteps 999/666/333/0, where k-diffusion's log-sigma and
diffusers' linear interpolation agree), and stores the intermediate and final results.
The tokenizer is the real T5 v1.1 tokenizer.json from ../shared/tokenizers.
"""
import os

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import T5Config, T5EncoderModel, T5TokenizerFast
from diffusers import AutoencoderKL, EulerDiscreteScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

OUT = "tests/fixtures/pixart_pipeline"
TOKENIZER = os.path.join(os.path.dirname(__file__), "../../../shared/tokenizers/t5-v1_1.tokenizer.json")
PROMPT = "A Lovely cat, holding a sign!  "
NEGATIVE = "blurry"
SEED, STEPS, CFG, W, H = 42, 4, 4.5, 24, 16

torch.manual_seed(0)
tok = T5TokenizerFast(tokenizer_file=TOKENIZER)
t5 = T5EncoderModel(T5Config(vocab_size=32128, d_model=16, d_kv=4, num_heads=4, d_ff=24, num_layers=2,
                             feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                             relative_attention_max_distance=128, is_encoder_decoder=False)).eval()
transformer = PixArtTransformer2DModel(
    num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
    cross_attention_dim=16, caption_channels=16, sample_size=8, patch_size=2, norm_type="ada_norm_single",
    norm_elementwise_affine=False, norm_eps=1e-6, use_additional_conditions=False).eval()
vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                    up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 32), layers_per_block=1,
                    latent_channels=4, norm_num_groups=32, sample_size=32, scaling_factor=0.13025).eval()

with torch.no_grad():
    for m, s in ((t5, 0.3), (transformer, 0.2), (vae, 0.2)):
        for name, p in m.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * s)
    # Keep the decoded image inside (0, 1) so the PNG comparison is not hidden by clamping.
    vae.decoder.conv_out.weight.mul_(0.1)
    # The embedding table is stored in f16 (keeps the fixture small); use the same values here.
    t5.shared.weight.copy_(t5.shared.weight.half().float())

scheduler = EulerDiscreteScheduler(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02,
                                   beta_schedule="linear", prediction_type="epsilon",
                                   timestep_spacing="linspace", interpolation_type="linear")
pipe = PixArtSigmaPipeline(tokenizer=tok, text_encoder=t5, vae=vae, transformer=transformer, scheduler=scheduler)

captured = {}
orig_decode = vae.decode


def decode_hook(z, *a, **k):
    captured["latent"] = z.detach().clone()
    return orig_decode(z, *a, **k)


vae.decode = decode_hook
with torch.no_grad():
    emb, mask, neg_emb, neg_mask = pipe.encode_prompt(PROMPT, negative_prompt=NEGATIVE, clean_caption=False,
                                                      max_sequence_length=300)
    image = pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=STEPS, guidance_scale=CFG, height=H, width=W,
                 generator=torch.Generator().manual_seed(SEED), output_type="np", use_resolution_binning=False,
                 clean_caption=False, max_sequence_length=300).images[0]
vae.decode = orig_decode

n = int(mask[0].sum())
nn_ = int(neg_mask[0].sum())
ids = tok(PROMPT.lower().strip(), max_length=300, truncation=True).input_ids
os.makedirs(OUT, exist_ok=True)
t5.save_pretrained(f"{OUT}/text_encoder", safe_serialization=True)
# Store the embedding table in f16 to keep the fixture small.
from safetensors.torch import load_file
sd = load_file(f"{OUT}/text_encoder/model.safetensors")
sd = {k: (v.half() if k == "shared.weight" else v).contiguous() for k, v in sd.items() if k != "encoder.embed_tokens.weight"}
save_file(sd, f"{OUT}/text_encoder/model.safetensors", metadata={"format": "pt"})
transformer.save_pretrained(f"{OUT}/transformer", safe_serialization=True)
vae.save_pretrained(f"{OUT}/vae", safe_serialization=True)
save_file({
    "token_ids": torch.tensor(ids, dtype=torch.float32),
    "cond": emb[0, :n].float().contiguous(),
    "uncond": neg_emb[0, :nn_].float().contiguous(),
    "latent": captured["latent"][0].float().contiguous(),   # already divided by scaling_factor
    "image": torch.from_numpy(np.ascontiguousarray(image)).float().permute(2, 0, 1).contiguous(),  # [3, H, W]
}, f"{OUT}/reference.safetensors")
print("saturated fraction", float(((image <= 0) | (image >= 1)).mean()), "tokens", ids, "cond tokens", n, "uncond tokens", nn_, "image", image.shape, image.min(), image.max())
