//! TAESD / TAESDXL: the tiny autoencoder (diffusers `AutoencoderTiny`, madebyollin/taesd), a
//! fast stand-in for the SD/SDXL VAE (`--taesd`).
//!
//! Decoder: tanh(z/3)·3 → conv → ReLU → per level: blocks, then (not after the last) a nearest
//! 2× upsample and a bias-free conv → conv to RGB; its output is in [0, 1] (mapped to [−1, 1]
//! here, as the [`Vae`] interface says). Encoder: conv, then per level a stride-2 bias-free
//! conv (not before the first) and blocks, then conv to the latent; it reads [0, 1] images. A
//! block is conv → ReLU → conv → ReLU → conv, plus the input (through a 1×1 conv when the width
//! changes), then ReLU. Latents are the diffusion model's own (scaling factor 1): the caller
//! applies no latent scale.
//!
//! Names are diffusers' (`decoder.layers.N.conv.M`, `encoder.layers.N`), which is also what
//! upstream reads; levels, blocks and widths come from the tensors present.

use super::Vae;
use crate::ggml::{ScaleMode, Tensor};
use crate::nn::Conv2d;
use crate::runner::{GraphCtx, RunnerError, WeightBuilder};

/// Deepest `layers.N` index probed while detecting.
const MAX_LAYERS: usize = 64;

/// One residual block.
#[derive(Clone, Copy, Debug)]
struct Block {
    convs: [Conv2d; 3],
    skip: Option<Conv2d>,
}

impl Block {
    fn new(wb: &WeightBuilder<'_, '_>, c_in: usize, c_out: usize) -> Result<Self, RunnerError> {
        let conv = |i: usize, cin: usize| {
            Conv2d::new(&wb.pp(format!("conv.{i}")), cin, c_out, 3, 1, 1, true)
        };
        Ok(Self {
            convs: [conv(0, c_in)?, conv(2, c_out)?, conv(4, c_out)?],
            skip: if wb.contains("skip.weight") {
                Some(Conv2d::new(&wb.pp("skip"), c_in, c_out, 1, 1, 0, false)?)
            } else {
                None
            },
        })
    }

    fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let [a, b, c] = &self.convs;
        let h = g.relu(a.forward(g, x));
        let h = g.relu(b.forward(g, h));
        let h = c.forward(g, h);
        let skip = match &self.skip {
            Some(s) => s.forward(g, x),
            None => x,
        };
        g.relu(g.add(h, skip))
    }
}

/// A layer of the `layers` sequence.
#[derive(Clone, Copy, Debug)]
enum Layer {
    Conv(Conv2d),
    Block(Block),
    Relu,
    Upsample,
}

/// Shape of a tiny autoencoder, from its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct TaesdConfig {
    pub latent_channels: usize,
    /// Image channels (3).
    pub image_channels: usize,
    /// Spatial factor (2 per up/down level; 8 for TAESD).
    pub scale_factor: usize,
    pub encoder: bool,
    pub decoder: bool,
}

/// A part's layer kinds from the names present: a conv is `layers.N.weight`, a block
/// `layers.N.conv.0.weight`; gaps are the parameter-free ReLU / Upsample layers.
fn layer_kinds(wb: &WeightBuilder<'_, '_>, part: &str) -> Vec<Option<bool>> {
    let mut kinds: Vec<Option<bool>> = (0..MAX_LAYERS)
        .map(|i| {
            if wb.contains(&format!("{part}.layers.{i}.conv.0.weight")) {
                Some(true)
            } else if wb.contains(&format!("{part}.layers.{i}.weight")) {
                Some(false)
            } else {
                None
            }
        })
        .collect();
    while kinds.last() == Some(&None) {
        kinds.pop();
    }
    kinds
}

fn bad(key: &str, reason: String) -> RunnerError {
    RunnerError::BadData {
        key: key.into(),
        origin: "TAESD weights".into(),
        reason,
    }
}

/// The tiny autoencoder.
#[derive(Clone, Debug)]
pub struct Taesd {
    config: TaesdConfig,
    encoder: Vec<Layer>,
    decoder: Vec<Layer>,
}

impl Taesd {
    /// Declares the weights under `wb` (`encoder.layers.*`, `decoder.layers.*`).
    pub fn new(wb: &WeightBuilder<'_, '_>, need_encoder: bool) -> Result<Self, RunnerError> {
        let dec_kinds = layer_kinds(wb, "decoder");
        if dec_kinds.is_empty() {
            return Err(bad(
                "decoder.layers.0.weight",
                "no TAESD decoder (diffusers AutoencoderTiny names) found".into(),
            ));
        }
        let (decoder, latent, image, ups) = Self::decoder(wb, &dec_kinds)?;
        let enc_kinds = layer_kinds(wb, "encoder");
        let encoder = if need_encoder {
            if enc_kinds.is_empty() {
                return Err(bad(
                    "encoder.layers.0.weight",
                    "--init-img needs the TAESD encoder, but the file has only a decoder".into(),
                ));
            }
            Self::encoder(wb, &enc_kinds, image, latent)?
        } else {
            Vec::new()
        };
        Ok(Self {
            config: TaesdConfig {
                latent_channels: latent,
                image_channels: image,
                scale_factor: 1 << ups,
                encoder: need_encoder,
                decoder: true,
            },
            encoder,
            decoder,
        })
    }

    pub fn config(&self) -> &TaesdConfig {
        &self.config
    }

    /// Decoder layers: conv, ReLU, then per level blocks, and between levels Upsample + conv.
    fn decoder(
        wb: &WeightBuilder<'_, '_>,
        kinds: &[Option<bool>],
    ) -> Result<(Vec<Layer>, usize, usize, usize), RunnerError> {
        let mut layers = Vec::new();
        let mut width = 0usize;
        let mut latent = 0usize;
        let mut ups = 0usize;
        for (i, kind) in kinds.iter().enumerate() {
            let w = wb.pp(format!("decoder.layers.{i}"));
            match kind {
                Some(false) => {
                    let ne = w.require_ne("weight", "TAESD decoder")?;
                    let (cin, cout) = (ne[2], ne[3]);
                    if i == 0 {
                        latent = cin;
                    }
                    let bias = w.contains("bias");
                    layers.push(Layer::Conv(Conv2d::new(
                        &w,
                        cin,
                        cout,
                        ne[0],
                        1,
                        ne[0] / 2,
                        bias,
                    )?));
                    width = cout;
                }
                Some(true) => {
                    let ne = w.require_ne("conv.0.weight", "TAESD decoder")?;
                    let block = Block::new(&w, ne[2], ne[3])?;
                    width = ne[3];
                    layers.push(Layer::Block(block));
                }
                // Gaps: the ReLU after the first conv, else an upsample before a conv.
                None if i == 1 => layers.push(Layer::Relu),
                None => {
                    layers.push(Layer::Upsample);
                    ups += 1;
                }
            }
        }
        if latent == 0 || !matches!(layers.first(), Some(Layer::Conv(_))) {
            return Err(bad(
                "decoder.layers.0.weight",
                "the decoder does not start with a convolution".into(),
            ));
        }
        Ok((layers, latent, width, ups))
    }

    /// Encoder layers: conv, then per level a stride-2 conv (after the first) and blocks, conv.
    fn encoder(
        wb: &WeightBuilder<'_, '_>,
        kinds: &[Option<bool>],
        image: usize,
        latent: usize,
    ) -> Result<Vec<Layer>, RunnerError> {
        let mut layers = Vec::new();
        let mut seen_block = false;
        let last = kinds.len() - 1;
        for (i, kind) in kinds.iter().enumerate() {
            let w = wb.pp(format!("encoder.layers.{i}"));
            match kind {
                Some(false) => {
                    let ne = w.require_ne("weight", "TAESD encoder")?;
                    // Convs between blocks halve the size; the first and the last do not.
                    let stride = if seen_block && i != last { 2 } else { 1 };
                    let bias = w.contains("bias");
                    let conv = Conv2d::new(&w, ne[2], ne[3], ne[0], stride, ne[0] / 2, bias)?;
                    if i == 0 && ne[2] != image {
                        return Err(bad(
                            "encoder.layers.0.weight",
                            format!("takes {} channels, the decoder makes {image}", ne[2]),
                        ));
                    }
                    if i == last && ne[3] != latent {
                        return Err(bad(
                            &format!("encoder.layers.{i}.weight"),
                            format!("makes {} channels, the decoder takes {latent}", ne[3]),
                        ));
                    }
                    layers.push(Layer::Conv(conv));
                }
                Some(true) => {
                    seen_block = true;
                    let ne = w.require_ne("conv.0.weight", "TAESD encoder")?;
                    layers.push(Layer::Block(Block::new(&w, ne[2], ne[3])?));
                }
                None => {
                    return Err(bad(
                        &format!("encoder.layers.{i}"),
                        "missing encoder layer".into(),
                    ))
                }
            }
        }
        Ok(layers)
    }

    fn run<'g>(g: &'g GraphCtx<'g>, layers: &[Layer], mut x: Tensor<'g>) -> Tensor<'g> {
        for layer in layers {
            x = match layer {
                Layer::Conv(c) => c.forward(g, x),
                Layer::Block(b) => b.forward(g, x),
                Layer::Relu => g.relu(x),
                Layer::Upsample => {
                    let [w, h, c, n] = x.ne();
                    g.interpolate(x, [2 * w, 2 * h, c, n], ScaleMode::Nearest)
                }
            };
        }
        x
    }
}

impl Vae for Taesd {
    fn scale_factor(&self) -> usize {
        self.config.scale_factor
    }

    fn has_encoder(&self) -> bool {
        self.config.encoder
    }

    fn has_decoder(&self) -> bool {
        self.config.decoder
    }

    fn image_channels(&self) -> usize {
        self.config.image_channels
    }

    fn decode<'g>(&self, g: &'g GraphCtx<'g>, z: Tensor<'g>) -> Tensor<'g> {
        // Soft clamp of the latent to (−3, 3).
        let z = g.scale(g.tanh(g.scale(z, 1.0 / 3.0)), 3.0);
        let x = Self::run(g, &self.decoder, z);
        // [0, 1] → [−1, 1].
        g.scale_bias(x, 2.0, -1.0)
    }

    fn encode_mean<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        // [−1, 1] → [0, 1].
        let x = g.scale_bias(x, 0.5, 0.5);
        Self::run(g, &self.encoder, x)
    }
}
