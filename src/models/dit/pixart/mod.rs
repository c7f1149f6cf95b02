//! PixArt-α / PixArt-Σ diffusion transformer (diffusers `PixArtTransformer2DModel`).
//!
//! Patchify (conv, stride = patch) + fixed 2-D sin-cos positions → N blocks of adaLN-single
//! modulated self-attention, cross-attention to the projected T5 caption and a GELU(tanh)
//! feed-forward → final modulated layer norm → linear → unpatchify. One `t_mod =
//! Linear(SiLU(t_emb))` is shared by all blocks; each block adds its own 6-row table. With
//! learned sigma the output has 2 × in channels: the caller keeps the first `in_channels`
//! ([`PixArt::noise_prediction`]).
//!
//! Both checkpoint layouts load: diffusers names and the original PixArt repository's (fused
//! `attn.qkv` / `cross_attn.kv_linear`, split with views in the graph). α-1024-MS resolution
//! and aspect-ratio micro-conditions are applied when the weights carry their embedders and
//! the caller passes [`MicroConditions`].

mod blocks;
mod config;

pub use config::{PixArtConfig, PixArtLayout, PosEmbedParams, FREQ_DIM, HEAD_DIM};

use crate::dtype::DType;
use crate::ggml::Tensor;
use crate::nn::{self, AttentionMask, Conv2d, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use blocks::{Act, Block, Mlp2, NORM_EPS};

/// Period of the sinusoidal timestep features.
const MAX_PERIOD: i32 = 10_000;

/// Added to the attention scores of masked caption keys (diffusers' bias value).
const MASKED_KEY_BIAS: f32 = -10_000.0;

/// α-1024-MS micro-conditions, one entry per batch element.
#[derive(Clone, Copy)]
pub struct MicroConditions<'g> {
    /// f32 [2, B] (ggml order): image (height, width) in pixels.
    pub resolution: Tensor<'g>,
    /// f32 [B] (or [1, B]): height / width.
    pub aspect_ratio: Tensor<'g>,
}

impl<'g> MicroConditions<'g> {
    /// Graph inputs for `sizes` = (height, width) in pixels per batch element.
    pub fn inputs(g: &'g GraphCtx<'g>, sizes: &[(f32, f32)]) -> Self {
        let b = sizes.len();
        let res = sizes.iter().flat_map(|&(h, w)| [h, w]).collect();
        let ar = sizes.iter().map(|&(h, w)| h / w).collect();
        Self {
            resolution: g.input_f32("pixart.resolution", [2, b, 1, 1], res),
            aspect_ratio: g.input_f32("pixart.aspect_ratio", [b, 1, 1, 1], ar),
        }
    }
}

/// One transformer call's inputs (shapes in ggml order).
#[derive(Clone, Copy)]
pub struct PixArtInputs<'g> {
    /// Latent [W, H, in_channels, B]; W and H multiples of the patch size.
    pub x: Tensor<'g>,
    /// f32 [B]: DDPM timesteps in [0, 999] (fractional allowed).
    pub timesteps: Tensor<'g>,
    /// Caption features [caption_channels, n_txt, B] (T5 encoder output).
    pub context: Tensor<'g>,
    /// f32 [n_txt, B]: 1 keeps a caption token, 0 drops it. `None` attends to all tokens
    /// (equivalent when the caller trimmed the padding).
    pub context_mask: Option<Tensor<'g>>,
    /// Ignored unless the model has micro-condition embedders; without them such a model
    /// runs on the timestep alone (as upstream sd-cli does).
    pub micro: Option<MicroConditions<'g>>,
}

/// Where a call's cross-attention keys and values come from.
enum CrossKv<'g> {
    /// Stored by an earlier call, per layer.
    Cached(Vec<[Tensor<'g>; 2]>),
    /// The projected caption [D, n_txt, B].
    Caption(Tensor<'g>),
}

/// A PixArt transformer: weight handles and sizes.
#[derive(Clone, Debug)]
pub struct PixArt {
    config: PixArtConfig,
    patch: Conv2d,
    t_embedder: Mlp2,
    /// (resolution, aspect-ratio) embedders of α-1024-MS.
    size_embedders: Option<(Mlp2, Mlp2)>,
    t_block: Linear,
    caption: Mlp2,
    blocks: Vec<Block>,
    /// (2, D) final table: [shift, scale].
    final_table: Param,
    proj_out: Linear,
}

impl PixArt {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: PixArtConfig) -> Result<Self, RunnerError> {
        let n = config.layout.names();
        let d = config.hidden_size;
        let p = config.patch_size;
        let size_embedders = if config.micro_conditions {
            let dims = [FREQ_DIM, d / 3, d / 3];
            Some((
                Mlp2::new(&wb.pp(n.resolution_embedder), n.mlp, dims, Act::Silu)?,
                Mlp2::new(&wb.pp(n.aspect_ratio_embedder), n.mlp, dims, Act::Silu)?,
            ))
        } else {
            None
        };
        let blocks = (0..config.layers)
            .map(|i| Block::new(&wb.pp(n.blocks).pp(i), &config, n))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            patch: Conv2d::new(&wb.pp(n.patch), config.in_channels, d, p, p, 0, true)?,
            t_embedder: Mlp2::new(&wb.pp(n.t_embedder), n.mlp, [FREQ_DIM, d, d], Act::Silu)?,
            size_embedders,
            t_block: Linear::new(&wb.pp(n.t_block), d, 6 * d, true)?,
            caption: Mlp2::new(
                &wb.pp(n.caption),
                n.caption_fc,
                [config.caption_channels, d, d],
                Act::GeluTanh,
            )?,
            blocks,
            final_table: wb.get(n.final_table, [d, 2, 1, 1], Storage::F32)?,
            proj_out: Linear::new(&wb.pp(n.proj_out), d, p * p * config.out_channels, true)?,
            config,
        })
    }

    pub fn config(&self) -> &PixArtConfig {
        &self.config
    }

    /// The full prediction [W, H, out_channels, B] (noise prediction, then learned variance).
    /// Marks a graph cut after every block (`pixart.blocks.{i}`, output `x`).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &PixArtInputs<'g>,
        pos: PosEmbedParams,
    ) -> Tensor<'g> {
        self.forward_cached(g, inputs, pos, None)
    }

    /// [`PixArt::forward`], keeping the cross-attention's keys and values of the caption in
    /// the runner's cache under `cross_cache` (entries `{cross_cache}.{layer}.k` / `.v`): the
    /// first call computes and stores them, later ones (the sampler's next steps, the same
    /// caption) read them instead of projecting the caption again, ~3.5 % of a PixArt XL
    /// step at 300 caption tokens. The caller clears the entries when the caption changes.
    pub fn forward_cached<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &PixArtInputs<'g>,
        pos: PosEmbedParams,
        cross_cache: Option<&str>,
    ) -> Tensor<'g> {
        let c = &self.config;
        let d = c.hidden_size;
        let p = c.patch_size;
        let [w, h, _, batch] = inputs.x.ne();
        let (wp, hp) = (w / p, h / p);
        let n_img = wp * hp;

        // Patch embedding: [wp, hp, D, B] -> tokens [D, wp*hp, B] (row-major over h, w).
        let tok = self.patch.forward(g, inputs.x);
        let tok = g.reshape(g.cont(g.permute(tok, [1, 2, 0, 3])), [d, n_img, batch, 1]);
        let pe = nn::sincos_2d_pos_embed(d, hp, wp, pos.base_size, pos.interpolation_scale);
        let mut x = g.add(tok, g.input_f32("pixart.pos_embed", [d, n_img, 1, 1], pe));

        let emb = self.timestep_embedding(g, inputs);
        let t_mod = g.reshape(self.t_block.forward(g, g.silu(emb)), [d, 6, batch, 1]);
        let [_, n_txt, ctx_batch, _] = inputs.context.ne();
        let cross = self.cross_kv(g, inputs.context, [d, n_txt, ctx_batch, 1], cross_cache);
        let mask = inputs.context_mask.map(|keep| {
            // keep 1 -> 0, keep 0 -> -10000; one row per image query.
            let bias = g.scale_bias(keep, -MASKED_KEY_BIAS, MASKED_KEY_BIAS);
            let bias = g.reshape(g.cont(bias), [n_txt, 1, 1, batch]);
            let like = g.new_tensor(DType::F32, [n_txt, n_img, 1, batch]);
            AttentionMask(g.repeat(bias, like))
        });

        for (i, block) in self.blocks.iter().enumerate() {
            let group = format!("pixart.blocks.{i}");
            let kv = match &cross {
                CrossKv::Cached(kv) => kv[i],
                CrossKv::Caption(context) => {
                    let [k, v] = block.cross_kv(g, *context);
                    match cross_cache {
                        Some(key) => [("k", k), ("v", v)].map(|(name, t)| {
                            let stored = g.cache_store(&format!("{key}.{i}.{name}"), t);
                            g.cut(&group, name, stored)
                        }),
                        None => [k, v],
                    }
                }
            };
            x = block.forward(g, x, t_mod, kv, mask.as_ref());
            x = g.cut(&group, "x", x);
        }

        // Final layer: (table + raw t_emb) -> shift, scale.
        let emb = g.reshape(emb, [d, 1, batch, 1]);
        let table = g.param(self.final_table);
        let row = |i: usize| g.view(table, [d, 1, 1, 1], [table.nb()[1]; 3], i * table.nb()[1]);
        let shift = g.add(emb, row(0));
        let scale = g.scale_bias(g.add(emb, row(1)), 1.0, 1.0);
        let x = g.add(g.mul(g.norm(x, NORM_EPS), scale), shift);
        let y = self.proj_out.forward(g, x); // [p*p*out, N, B], vector = [p_row][p_col][c]
        self.unpatchify(g, y, wp, hp, batch)
    }

    /// Every layer's cached cross-attention keys and values under `key` when all are there
    /// with shape `ne`, else the projected caption to compute them from.
    fn cross_kv<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        caption: Tensor<'g>,
        ne: [usize; 4],
        key: Option<&str>,
    ) -> CrossKv<'g> {
        let cached: Option<Vec<[Tensor<'g>; 2]>> = key.and_then(|key| {
            (0..self.blocks.len())
                .map(|i| {
                    let [k, v] = ["k", "v"].map(|n| g.cache_get(&format!("{key}.{i}.{n}")));
                    let (k, v) = (k?, v?);
                    (k.ne() == ne && v.ne() == ne).then_some([k, v])
                })
                .collect()
        });
        match cached {
            Some(kv) => CrossKv::Cached(kv),
            None => CrossKv::Caption(self.caption.forward(g, caption)),
        }
    }

    /// The first `in_channels` of a learned-sigma prediction (a view), else `out` itself.
    pub fn noise_prediction<'g>(&self, g: &'g GraphCtx<'g>, out: Tensor<'g>) -> Tensor<'g> {
        if !self.config.learned_sigma() {
            return out;
        }
        let [w, h, _, b] = out.ne();
        let nb = out.nb();
        g.view(
            out,
            [w, h, self.config.in_channels, b],
            [nb[1], nb[2], nb[3]],
            0,
        )
    }

    /// t_emb [D, B]: MLP over the [cos, sin] timestep features, plus the micro-condition
    /// embeddings `[emb(h), emb(w), emb(h/w)]` when the model has them.
    fn timestep_embedding<'g>(&self, g: &'g GraphCtx<'g>, inputs: &PixArtInputs<'g>) -> Tensor<'g> {
        let batch = inputs.x.ne()[3];
        let freq = |t: Tensor<'g>, n: usize| {
            let t = g.reshape(g.cont(t), [n, 1, 1, 1]);
            g.timestep_embedding(t, FREQ_DIM, MAX_PERIOD)
        };
        let emb = self.t_embedder.forward(g, freq(inputs.timesteps, batch));
        match (&self.size_embedders, inputs.micro) {
            (Some((res_mlp, ar_mlp)), Some(micro)) => {
                let third = self.config.hidden_size / 3;
                // (h, w) of each batch element -> [D/3, 2B] -> [2D/3, B]
                let res = res_mlp.forward(g, freq(micro.resolution, 2 * batch));
                let res = g.reshape(res, [2 * third, batch, 1, 1]);
                let ar = ar_mlp.forward(g, freq(micro.aspect_ratio, batch));
                g.add(emb, g.concat(res, ar, 0))
            }
            _ => emb,
        }
    }

    /// [p*p*C, wp*hp, B] tokens (vector layout [p_row][p_col][c]) -> image [wp*p, hp*p, C, B].
    fn unpatchify<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        y: Tensor<'g>,
        wp: usize,
        hp: usize,
        batch: usize,
    ) -> Tensor<'g> {
        let p = self.config.patch_size;
        let oc = self.config.out_channels;
        // memory (c, q, r, w, h, B) -> (q, r, w, h, c, B)
        let y = g.reshape(y, [oc, p * p, wp * hp, batch]);
        let y = g.cont(g.permute(y, [2, 0, 1, 3]));
        // (q, r, w, rest) -> (q, w, r, rest)
        let y = g.reshape(y, [p, p, wp, hp * oc * batch]);
        let y = g.cont(g.permute(y, [0, 2, 1, 3]));
        g.reshape(y, [wp * p, hp * p, oc, batch])
    }
}
