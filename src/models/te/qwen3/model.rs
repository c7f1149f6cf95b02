//! The Qwen3 (Qwen3-VL text) decoder stack as a ggml graph, used as a hidden-state encoder;
//! also Qwen2 / Qwen2.5-VL's (biased q/k/v, no q/k norms: `Qwen3Config::qk_norm`).
//!
//! Per layer: `x += o(attn(rope(q_norm(q(rms(x)))), rope(k_norm(k(rms(x)))), v(rms(x))))`,
//! `x += down(silu(gate(rms(x))) · up(rms(x)))`. Attention is causal with grouped KV heads
//! (query head h reads KV head h / (heads / kv_heads)), scaled by 1/√head_dim; q/k are
//! RMS-normalised per head before NeoX rope at positions 0..n (Qwen3-VL's interleaved mRoPE
//! reduces to this for text, where all three position ids are equal).
//!
//! With images ([`Qwen3TextModel::forward_multimodal`]) the input embeddings at the image-pad
//! tokens are the vision tower's merged embeddings, rope is the interleaved mRoPE over 3-D
//! positions (see `mrope`), and deepstack features are added to the image rows after the
//! first decoder layers.

use crate::ggml::{RopeMode, Tensor};
use crate::nn::{Linear, RmsNorm};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder};

use super::config::Qwen3Config;
use super::mm::Qwen3MmInput;
use super::mrope::{ggml_imrope_positions, ggml_imrope_sections, DEFAULT_MROPE_SECTION};

/// How q/k are rotated: NeoX rope at 1-D positions (text) or interleaved mRoPE at 4-axis
/// positions with ggml's 4 section sizes.
#[derive(Clone, Copy)]
enum Rope<'g> {
    Neox(Tensor<'g>),
    Interleaved(Tensor<'g>, [usize; 4]),
}

#[derive(Clone, Copy, Debug)]
struct Layer {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    /// Per-head q/k RMS norms (Qwen3; absent in Qwen2 / Qwen2.5-VL).
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Layer {
    fn new(wb: &WeightBuilder<'_, '_>, c: &Qwen3Config) -> Result<Self, RunnerError> {
        let (d, hd, ff) = (c.hidden, c.head_dim, c.intermediate);
        let sa = wb.pp("self_attn");
        let mlp = wb.pp("mlp");
        let norm = |name: &str| {
            c.qk_norm
                .then(|| RmsNorm::new(&sa.pp(name), hd, c.eps))
                .transpose()
        };
        Ok(Self {
            attn_norm: RmsNorm::new(&wb.pp("input_layernorm"), d, c.eps)?,
            q: Linear::new(&sa.pp("q_proj"), d, c.heads * hd, c.qkv_bias)?,
            k: Linear::new(&sa.pp("k_proj"), d, c.kv_heads * hd, c.qkv_bias)?,
            v: Linear::new(&sa.pp("v_proj"), d, c.kv_heads * hd, c.qkv_bias)?,
            o: Linear::new(&sa.pp("o_proj"), c.heads * hd, d, false)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            ffn_norm: RmsNorm::new(&wb.pp("post_attention_layernorm"), d, c.eps)?,
            gate: Linear::new(&mlp.pp("gate_proj"), d, ff, false)?,
            up: Linear::new(&mlp.pp("up_proj"), d, ff, false)?,
            down: Linear::new(&mlp.pp("down_proj"), ff, d, false)?,
        })
    }

    /// x: [hidden, n]; rope positions; mask: causal [n_kv, n_q] → [hidden, n].
    fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        c: &Qwen3Config,
        x: Tensor<'g>,
        rope: Rope<'g>,
        mask: Tensor<'g>,
    ) -> Tensor<'g> {
        let n = x.ne()[1];
        let hd = c.head_dim;
        let h = self.attn_norm.forward(g, x);
        // [heads·hd, n] → [hd, heads, n], per-head RMS norm, rope → [hd, n, heads]
        let prep = |lin: &Linear, norm: &Option<RmsNorm>, heads: usize| {
            let t = g.reshape(lin.forward(g, h), [hd, heads, n, 1]);
            let t = match norm {
                Some(norm) => norm.forward(g, t),
                None => t,
            };
            let t = match rope {
                Rope::Neox(pos) => g.rope(t, pos, hd, RopeMode::Neox, c.rope_theta),
                Rope::Interleaved(pos, sections) => {
                    g.rope_multi(t, pos, hd, sections, RopeMode::IMRope, c.rope_theta)
                }
            };
            g.permute(t, [0, 2, 1, 3])
        };
        let q = prep(&self.q, &self.q_norm, c.heads);
        let k = prep(&self.k, &self.k_norm, c.kv_heads);
        let v = g.reshape(self.v.forward(g, h), [hd, c.kv_heads, n, 1]);
        let scale = 1.0 / (hd as f32).sqrt();
        let fused = g.flash_attn().then(|| {
            let k = g.cast(k, crate::dtype::DType::F16);
            let v = g.cast(g.permute(v, [0, 2, 1, 3]), crate::dtype::DType::F16);
            let mask = g.cast(mask, crate::dtype::DType::F16);
            // → [hd, heads, n]
            g.flash_attn_ext(q, k, v, Some(mask), scale)
        });
        // A device without the fused kernel for this head size takes the plain path.
        let attn = if let Some(out) = fused.filter(|&out| g.device_supports(out)) {
            out
        } else {
            // scores [n_kv, n_q, heads]; the KV head is broadcast over its query group.
            let probs = g.soft_max_ext(g.mul_mat(k, q), Some(mask), scale);
            // v^T: [n_kv, hd, kv_heads]
            let vt = g.cont(g.permute(v, [1, 2, 0, 3]));
            // [hd, n_q, heads] → [hd, heads, n_q]
            g.cont(g.permute(g.mul_mat(vt, probs), [0, 2, 1, 3]))
        };
        let attn = g.reshape(attn, [c.heads * hd, n, 1, 1]);
        let x = g.add(x, self.o.forward(g, attn));

        let h = self.ffn_norm.forward(g, x);
        let act = g.mul(g.silu(self.gate.forward(g, h)), self.up.forward(g, h));
        g.add(x, self.down.forward(g, act))
    }
}

/// transformers `Qwen3VLTextModel` / `Qwen3Model` run as a text encoder.
pub struct Qwen3TextModel {
    config: Qwen3Config,
    embed: Param,
    layers: Vec<Layer>,
    /// Absent in exports truncated before it (MiniMax-H3's 50-layer Qwen3-VL).
    final_norm: Option<RmsNorm>,
    /// transformers' `mrope_section` (t, h, w frequency counts) for multimodal positions.
    mrope_section: [usize; 3],
}

impl Qwen3TextModel {
    /// Declares the weights under plain Qwen3 names relative to `wb` (`embed_tokens.weight`,
    /// `layers.{i}...`, `norm.weight`).
    pub fn new(wb: &WeightBuilder<'_, '_>, config: Qwen3Config) -> Result<Self, RunnerError> {
        Self::build(wb, config, true)
    }

    /// [`Self::new`] for a truncated export: `norm.weight` is taken when the file has it.
    /// Its outputs are only ever read before the final norm.
    pub fn new_truncated(
        wb: &WeightBuilder<'_, '_>,
        config: Qwen3Config,
    ) -> Result<Self, RunnerError> {
        Self::build(wb, config, wb.contains("norm.weight"))
    }

    fn build(
        wb: &WeightBuilder<'_, '_>,
        config: Qwen3Config,
        with_final_norm: bool,
    ) -> Result<Self, RunnerError> {
        let c = &config;
        if c.layers == 0 {
            return Err(RunnerError::MissingTensor {
                key: wb.key("layers.0.self_attn.q_proj.weight"),
                origin: "the Qwen3 LLM text encoder weights".into(),
            });
        }
        let embed = wb
            .pp("embed_tokens")
            .get("weight", [c.hidden, c.vocab, 1, 1], Storage::Any)?;
        let layers = (0..c.layers)
            .map(|i| Layer::new(&wb.pp("layers").pp(i), c))
            .collect::<Result<Vec<_>, _>>()?;
        let final_norm = if with_final_norm {
            Some(RmsNorm::new(&wb.pp("norm"), c.hidden, c.eps)?)
        } else {
            None
        };
        Ok(Self {
            config,
            embed,
            layers,
            final_norm,
            mrope_section: DEFAULT_MROPE_SECTION,
        })
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.config
    }

    /// Sets the interleaved mRoPE sections (`rope_parameters.mrope_section` of the config;
    /// `qwen3_mrope_section` reads it); the default is Qwen3-VL's [24, 20, 20]. Only the
    /// multimodal forward uses it.
    pub fn with_mrope_section(mut self, mrope_section: [usize; 3]) -> Self {
        self.mrope_section = mrope_section;
        self
    }

    pub fn mrope_section(&self) -> [usize; 3] {
        self.mrope_section
    }

    /// `token_ids`: i32 [n]. Runs the first `layers_to_run` layers (all when `None`) with causal
    /// attention at positions 0..n and returns their output [hidden, n]; `final_norm` applies
    /// the model's final RMS norm (Qwen Image 2.1 wants the output *before* it).
    pub fn forward<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        token_ids: Tensor<'g>,
        layers_to_run: Option<usize>,
        final_norm: bool,
    ) -> Tensor<'g> {
        let n = token_ids.ne()[0];
        let x = g.get_rows(g.param(self.embed), token_ids);
        let pos = g.input_i32("qwen3.pos", [n, 1, 1, 1], (0..n as i32).collect());
        self.run_layers(g, x, Rope::Neox(pos), &[], layers_to_run, final_norm)
    }

    /// The multimodal forward (transformers `Qwen3VLModel` language path with images): the
    /// token embeddings with the image-pad rows replaced by the vision embeddings, interleaved
    /// mRoPE at the input's 3-D positions, deepstack level `i` added after decoder layer `i`.
    /// Layers / final norm as in [`Self::forward`]. With `layers_to_run = Some(k)` the result is
    /// transformers' `hidden_states[k]`, the output of layer k − 1 as the layer returns it: a
    /// deepstack level due after that layer is not added (only a model no deeper than its
    /// deepstack sees the difference). Returns [hidden, n].
    pub fn forward_multimodal<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        input: &Qwen3MmInput,
        layers_to_run: Option<usize>,
        final_norm: bool,
    ) -> Tensor<'g> {
        let c = &self.config;
        let n = input.len();
        let x = self.spliced_embeddings(g, input);
        let pos = g.input_i32(
            "qwen3.mrope_pos",
            [4 * n, 1, 1, 1],
            ggml_imrope_positions(input.positions()),
        );
        let sections = ggml_imrope_sections(self.mrope_section, c.head_dim);
        let deepstack: Vec<Tensor<'g>> = input
            .deepstack_full()
            .into_iter()
            .enumerate()
            .map(|(i, d)| g.input_f32(&format!("qwen3.deepstack.{i}"), [c.hidden, n, 1, 1], d))
            .collect();
        let count = layers_to_run.unwrap_or(c.layers).min(c.layers);
        let deepstack = match layers_to_run {
            Some(_) => &deepstack[..deepstack.len().min(count.saturating_sub(1))],
            None => &deepstack[..],
        };
        self.run_layers(
            g,
            x,
            Rope::Interleaved(pos, sections),
            deepstack,
            layers_to_run,
            final_norm,
        )
    }

    /// The image-conditioned forward as upstream sd-cli runs Qwen2.5-VL: the token embeddings
    /// with the image-pad rows replaced by the vision embeddings, but every token (image ones
    /// included) at its plain sequence position 0..n on all rope axes (transformers gives image
    /// tokens 3-D grid positions instead). No deepstack. Returns [hidden, n].
    pub fn forward_sequential<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        input: &Qwen3MmInput,
        final_norm: bool,
    ) -> Tensor<'g> {
        let n = input.len();
        let x = self.spliced_embeddings(g, input);
        let pos = g.input_i32("qwen3.pos", [n, 1, 1, 1], (0..n as i32).collect());
        self.run_layers(g, x, Rope::Neox(pos), &[], None, final_norm)
    }

    /// Token embeddings [hidden, n] with the image-pad rows replaced by the vision embeddings.
    fn spliced_embeddings<'g>(&self, g: &'g GraphCtx<'g>, input: &Qwen3MmInput) -> Tensor<'g> {
        let c = &self.config;
        let n = input.len();
        let ids = g.input_i32("qwen3.input_ids", [n, 1, 1, 1], input.ids().to_vec());
        let x = g.get_rows(g.param(self.embed), ids);
        let n_vis = input.vision().ne[1];
        if n_vis == 0 {
            return x;
        }
        let vis = g.input_f32(
            "qwen3.vision_embeds",
            [c.hidden, n_vis, 1, 1],
            input.vision().data.clone(),
        );
        let rows = g.input_i32("qwen3.vision_rows", [n, 1, 1, 1], input.gather_rows());
        g.get_rows(g.concat(x, vis, 1), rows)
    }

    /// The decoder stack on x [hidden, n] with causal attention; `deepstack[i]` ([hidden, n],
    /// zero outside the image rows) is added after layer `i`.
    fn run_layers<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        mut x: Tensor<'g>,
        rope: Rope<'g>,
        deepstack: &[Tensor<'g>],
        layers_to_run: Option<usize>,
        final_norm: bool,
    ) -> Tensor<'g> {
        let c = &self.config;
        let n = x.ne()[1];
        let mask_data: Vec<f32> = (0..n)
            .flat_map(|q| (0..n).map(move |k| if k <= q { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let mask = g.input_f32("qwen3.causal_mask", [n, n, 1, 1], mask_data);
        let count = layers_to_run.unwrap_or(c.layers).min(c.layers);
        for (i, layer) in self.layers[..count].iter().enumerate() {
            x = layer.forward(g, c, x, rope, mask);
            if let Some(&d) = deepstack.get(i) {
                x = g.add(x, d);
            }
            x = g.cut(&format!("qwen3.layers.{i}"), "x", x);
        }
        match (final_norm, &self.final_norm) {
            (true, Some(norm)) => norm.forward(g, x),
            _ => x,
        }
    }
}
