//! Qwen Image 2.1 diffusion transformer (diffusers `QwenImage21Transformer2DModel`).
//!
//! One joint stream [prefix…, target image…] through N identical blocks with block-causal
//! attention. The prefix is the text, with condition-image latents (editing) where the
//! encoder's image slots were ([`layout`]): prefix queries see earlier prefix tokens and their
//! own image block, target queries see the whole prefix and the whole target. Prefix tokens
//! are modulated from t = 0 and target tokens from t, with one shared modulation
//! (`[scale1, gate1, scale2, gate2]`, no shift) for every block. Images are plain rasters of
//! latent pixels (one token each, channels last); positions are 3-axis rope (frame, height,
//! width) in the interleaved-pair layout: text at (p, p, p), an image block at frame p with
//! centred height/width. Output: the velocity of the target tokens.
//!
//! Because prefix tokens never see the target or the timestep, their keys and values are the
//! same at every denoising step: [`KvMode::Store`] keeps them per layer in the runner's named
//! cache and [`KvMode::Reuse`] runs the target tokens alone against them (see [`prefix`] for
//! the step driver with storage types and the out-of-memory fallback).
//!
//! Both checkpoint layouts load: diffusers names (split `img_mlp.proj` / `gate_layer`) and
//! single-file checkpoints with a fused `img_mlp.gate_up` (strip `model.diffusion_model.`
//! with the source prefix).

mod blocks;
mod config;
pub mod layout;
pub mod prefix;

pub use config::{
    default_axes_dims, FfnLayout, QwenImage21Config, NORM_EPS, ROPE_THETA, TIME_FREQ_DIM,
};
pub use layout::{PrefixLayout, Segment};
pub use prefix::{Condition, PrefixCache, PrefixCacheError};

use crate::dtype::DType;
use crate::ggml::Tensor;
use crate::nn::{self, Linear};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};
use crate::tensor::Ne;

use blocks::{Block, Group, Modulation, PrefixKv};

/// Cut-group prefix of this model's graph-cut marks.
pub const CUT_PREFIX: &str = "qwen_image_2_1";

/// How a call treats the text prefix's keys and values.
#[derive(Clone, Copy, Debug)]
pub enum KvMode<'a> {
    /// Compute text and image tokens; touch no cache.
    Full,
    /// Compute text and image tokens and keep every layer's text K (after q/k norm and rope)
    /// and V in the runner's cache as `{key}.{layer}.k` / `.v`, [hidden, L_text, B] of type
    /// `ty`. The image tokens of this call already attend to the stored values.
    Store { key: &'a str, ty: DType },
    /// Compute the image tokens only, attending to the cached text K/V under `key`.
    Reuse { key: &'a str },
}

/// One transformer call's inputs (shapes in ggml order).
#[derive(Clone, Copy)]
pub struct QwenImage21Inputs<'g, 'a> {
    /// Latent [W, H, in_channels, B] in transformer space (one token per latent pixel).
    pub latent: Tensor<'g>,
    /// Text encoder hidden states [text_dim, L_text, B]; unused (may be `None`) with
    /// [`KvMode::Reuse`].
    pub text: Option<Tensor<'g>>,
    /// σ ∈ [0, 1] per batch element (the model multiplies by 1000 internally).
    pub timesteps: &'a [f32],
    pub kv: KvMode<'a>,
    /// Condition-image latents [W_r, H_r, in_channels, B] in layout order (ignored with
    /// [`KvMode::Reuse`]).
    pub refs: &'a [Tensor<'g>],
    /// Where text rows and condition images sit in the prefix; `None` = the text alone.
    pub layout: Option<&'a PrefixLayout>,
}

/// Cache entry names of layer `layer`'s prefix K and V under `key`.
pub fn cache_names(key: &str, layer: usize) -> (String, String) {
    (format!("{key}.{layer}.k"), format!("{key}.{layer}.v"))
}

/// A Qwen Image 2.1 transformer: weight handles and sizes.
#[derive(Clone, Debug)]
pub struct QwenImage21 {
    config: QwenImage21Config,
    time_1: Linear,
    time_2: Linear,
    /// Zero-centred text RMS norm weight (effective scale `w + 1`).
    text_norm: Param,
    txt_in_1: Linear,
    txt_in_2: Linear,
    img_in: Linear,
    modulation: Linear,
    blocks: Vec<Block>,
    norm_out: Linear,
    proj_out: Linear,
}

impl QwenImage21 {
    pub fn new(wb: &WeightBuilder<'_, '_>, config: QwenImage21Config) -> Result<Self, RunnerError> {
        let d = config.hidden_size;
        let te = wb.pp("time_text_embed").pp("timestep_embedder");
        let txt = wb.pp("txt_in");
        let blocks = (0..config.layers)
            .map(|i| Block::new(&wb.pp("transformer_blocks").pp(i), &config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            time_1: Linear::new(&te.pp("linear_1"), TIME_FREQ_DIM, d, false)?,
            time_2: Linear::new(&te.pp("linear_2"), d, d, false)?,
            text_norm: txt.pp("text_norm").get(
                "weight",
                [config.text_dim, 1, 1, 1],
                Storage::F32,
            )?,
            txt_in_1: Linear::new(&txt.pp("in_layer"), config.text_dim, d, false)?,
            txt_in_2: Linear::new(&txt.pp("out_layer"), d, d, false)?,
            img_in: Linear::new(&wb.pp("img_in"), config.in_channels, d, false)?,
            modulation: Linear::new(&wb.pp("modulation").pp(1), d, 4 * d, false)?,
            blocks,
            norm_out: Linear::new(&wb.pp("norm_out").pp("linear"), d, d, false)?,
            proj_out: Linear::new(&wb.pp("proj_out"), d, config.out_channels, false)?,
            config,
        })
    }

    pub fn config(&self) -> &QwenImage21Config {
        &self.config
    }

    /// The velocity [W, H, out_channels, B] for `inputs`.
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        inputs: &QwenImage21Inputs<'g, '_>,
    ) -> Result<Tensor<'g>, PrefixCacheError> {
        let c = &self.config;
        let d = c.hidden_size;
        let [w, h, ch, b] = inputs.latent.ne();
        if ch != c.in_channels || inputs.timesteps.len() != b {
            return Err(PrefixCacheError::Inputs(format!(
                "latent {:?} with {} timesteps; the model takes {} channels and one timestep \
                 per batch element",
                inputs.latent.ne(),
                inputs.timesteps.len(),
                c.in_channels
            )));
        }
        let n = w * h;

        // Timestep embedding for [t_0 .. t_{B-1}, 0]: columns 0..B modulate the image, column B
        // the text.
        let mut ts = inputs.timesteps.to_vec();
        ts.push(0.0);
        let freqs = nn::timestep_embedding(&ts, TIME_FREQ_DIM, true, 0.0, 1000.0, 10_000.0);
        let tfreq = g.input_f32("qwen21.t_freq", [TIME_FREQ_DIM, b + 1, 1, 1], freqs);
        let temb = g.silu(
            self.time_2
                .forward(g, g.silu(self.time_1.forward(g, tfreq))),
        );
        let mods = self.modulation.forward(g, temb); // [4D, B + 1]
        let img_mod = modulation_rows(g, mods, d, 0, b);
        let txt_mod = modulation_rows(g, mods, d, b, 1);

        // Image tokens: [W, H, C, B] -> [C, W, H, B] -> [C, N, B] (raster h-major, w-minor).
        let tokens = g.reshape(
            g.cont(g.permute(inputs.latent, [1, 2, 0, 3])),
            [ch, n, b, 1],
        );
        let mut x_img = g.cut(
            &format!("{CUT_PREFIX}.prelude"),
            "img",
            self.img_in.forward(g, tokens),
        );

        // Prefix length: from the layout, or from the cached prefix when reusing.
        let half = c.head_dim / 2;
        let text_only;
        let layout = match (inputs.layout, inputs.text) {
            (Some(l), _) => l,
            (None, Some(t)) => {
                text_only = PrefixLayout::text_only(t.ne()[1]);
                &text_only
            }
            (None, None) => {
                let (k_name, _) =
                    cache_names(
                        match inputs.kv {
                            KvMode::Reuse { key } => key,
                            _ => return Err(PrefixCacheError::Inputs(
                                "text hidden states are required unless reusing a cached prefix"
                                    .into(),
                            )),
                        },
                        0,
                    );
                let l = g
                    .cache_get(&k_name)
                    .ok_or(PrefixCacheError::Missing(k_name))?
                    .ne()[1];
                text_only = PrefixLayout::text_only(l);
                &text_only
            }
        };
        let text_len = layout.len();
        let (prefix_pos, target_frame) = layout.positions();
        let (img_cos, img_sin) = nn::rope_table(
            &layout::image_positions(target_frame, h, w),
            &c.axes_dims,
            ROPE_THETA,
        );
        let img_cos = g.input_f32("qwen21.img_cos", [half, n, 1, 1], img_cos);
        let img_sin = g.input_f32("qwen21.img_sin", [half, n, 1, 1], img_sin);

        let mut x_txt = None;
        let mut txt_rope = None;
        let mut mask = None;
        if !matches!(inputs.kv, KvMode::Reuse { .. }) {
            let text = inputs.text.ok_or_else(|| {
                PrefixCacheError::Inputs(
                    "text hidden states are required unless reusing a cached prefix".into(),
                )
            })?;
            let [td, l, tb, _] = text.ne();
            if td != c.text_dim || tb != b || l != layout.text_rows() {
                return Err(PrefixCacheError::Inputs(format!(
                    "text {:?}: expected [{}, {}, {b}]",
                    text.ne(),
                    c.text_dim,
                    layout.text_rows()
                )));
            }
            let w1 = g.scale_bias(g.param(self.text_norm), 1.0, 1.0);
            let t = g.mul(g.rms_norm(text, NORM_EPS), w1);
            let t = nn::gelu_tanh(g, self.txt_in_1.forward(g, t));
            let t = self.txt_in_2.forward(g, t);
            let prefix = self.assemble_prefix(g, layout, t, inputs.refs)?;
            x_txt = Some(g.cut(&format!("{CUT_PREFIX}.prelude"), "txt", prefix));
            let (cos, sin) = nn::rope_table(&prefix_pos, &c.axes_dims, ROPE_THETA);
            txt_rope = Some((
                g.input_f32("qwen21.txt_cos", [half, text_len, 1, 1], cos),
                g.input_f32("qwen21.txt_sin", [half, text_len, 1, 1], sin),
            ));
            mask = Some(g.input_f32(
                "qwen21.prefix_mask",
                [text_len, text_len, 1, 1],
                layout.mask(),
            ));
        }

        for (i, block) in self.blocks.iter().enumerate() {
            let cut_group = format!("{CUT_PREFIX}.transformer_blocks.{i}");
            let (k_name, v_name) = match inputs.kv {
                KvMode::Store { key, .. } | KvMode::Reuse { key } => cache_names(key, i),
                KvMode::Full => Default::default(),
            };
            let prefix = match (inputs.kv, x_txt, txt_rope, mask) {
                (KvMode::Reuse { .. }, ..) => {
                    let want: Ne = [d, text_len, b, 1];
                    let get = |name: &str| -> Result<Tensor<'g>, PrefixCacheError> {
                        let t = g
                            .cache_get(name)
                            .ok_or_else(|| PrefixCacheError::Missing(name.to_string()))?;
                        if t.ne() != want {
                            return Err(PrefixCacheError::Shape {
                                name: name.to_string(),
                                found: t.ne(),
                                expected: want,
                            });
                        }
                        Ok(blocks::to_f32(g, t))
                    };
                    PrefixKv::Cached {
                        k: get(&k_name)?,
                        v: get(&v_name)?,
                    }
                }
                (kv, Some(x), Some((cos, sin)), Some(mask)) => PrefixKv::Computed {
                    group: Group {
                        x,
                        modulation: txt_mod,
                        cos,
                        sin,
                    },
                    mask,
                    store: match kv {
                        KvMode::Store { ty, .. } => Some((k_name, v_name, ty)),
                        _ => None,
                    },
                    need_text: i + 1 < self.blocks.len(),
                    cut_group: &cut_group,
                },
                _ => unreachable!("text group is built for every non-reuse mode"),
            };
            let img = Group {
                x: x_img,
                modulation: img_mod,
                cos: img_cos,
                sin: img_sin,
            };
            let (t_out, i_out) = block.forward(g, img, prefix);
            x_img = g.cut(&cut_group, "img", i_out);
            x_txt = t_out.map(|t| g.cut(&cut_group, "txt", t));
        }

        // Final scale-only adaptive norm from temb(t), then the projection to velocity.
        let scale = self.norm_out.forward(g, temb); // [D, B + 1]
        let scale = g.view(scale, [d, b, 1, 1], [d * 4, d * b * 4, d * b * 4], 0);
        let scale = g.reshape(g.scale_bias(g.cont(scale), 1.0, 1.0), [d, 1, b, 1]);
        let y = g.mul(g.norm(x_img, NORM_EPS), scale);
        let y = self.proj_out.forward(g, y); // [C_out, N, B]
        let y = g.reshape(y, [c.out_channels, w, h, b]);
        Ok(g.cont(g.permute(y, [2, 0, 1, 3])))
    }
}

impl QwenImage21 {
    /// The prefix tokens [D, len, B]: embedded text rows and condition-image tokens in
    /// layout order.
    fn assemble_prefix<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        layout: &PrefixLayout,
        text: Tensor<'g>,
        refs: &[Tensor<'g>],
    ) -> Result<Tensor<'g>, PrefixCacheError> {
        if refs.len() != layout.images() {
            return Err(PrefixCacheError::Inputs(format!(
                "{} reference latents for a prompt encoded with {} images",
                refs.len(),
                layout.images()
            )));
        }
        let [d, l, b, _] = text.ne();
        let es = 4;
        let mut parts = Vec::with_capacity(layout.segments().len());
        for s in layout.segments() {
            match *s {
                Segment::Text { ref rows } if rows.len() == l => parts.push(text),
                Segment::Text { ref rows } => parts.push(g.cont(g.view(
                    text,
                    [d, rows.len(), b, 1],
                    [d * es, d * l * es, d * l * b * es],
                    rows.start * d * es,
                ))),
                Segment::Image { index, h, w } => {
                    let r = refs[index];
                    let [rw, rh, rc, rb] = r.ne();
                    if (rw, rh, rc, rb) != (w, h, self.config.in_channels, b) {
                        return Err(PrefixCacheError::Inputs(format!(
                            "reference latent {} is {:?}; the layout expects [{w}, {h}, {}, {b}]",
                            index + 1,
                            r.ne(),
                            self.config.in_channels
                        )));
                    }
                    let tokens = g.reshape(g.cont(g.permute(r, [1, 2, 0, 3])), [rc, w * h, b, 1]);
                    parts.push(self.img_in.forward(g, tokens));
                }
            }
        }
        let mut it = parts.into_iter();
        let first = it
            .next()
            .ok_or_else(|| PrefixCacheError::Inputs("empty prefix".into()))?;
        Ok(it.fold(first, |acc, p| g.concat(acc, p, 1)))
    }
}

/// The four modulation rows for batch columns `first .. first + count` of `mods` [4D, ·],
/// each [D, 1, count]: `1 + scale` and `tanh(gate)`.
fn modulation_rows<'g>(
    g: &'g GraphCtx<'g>,
    mods: Tensor<'g>,
    d: usize,
    first: usize,
    count: usize,
) -> Modulation<'g> {
    let es = 4;
    let row = |k: usize| {
        let v = g.view(
            mods,
            [d, count, 1, 1],
            [4 * d * es, 4 * d * es * count, 4 * d * es * count],
            (first * 4 * d + k * d) * es,
        );
        g.reshape(g.cont(v), [d, 1, count, 1])
    };
    Modulation {
        scale1: g.scale_bias(row(0), 1.0, 1.0),
        gate1: g.tanh(row(1)),
        scale2: g.scale_bias(row(2), 1.0, 1.0),
        gate2: g.tanh(row(3)),
    }
}
