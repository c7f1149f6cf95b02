//! Host tensors: what goes into and comes out of a runner call, and the one type for a host
//! image or latent (`[W, H, C]`, planar: x fastest, then y, then channel).
//!
//! Shapes are in ggml's `ne` order (innermost first), as everywhere near ggml.

/// A shape in ggml order: `ne[0]` is the innermost (contiguous) dimension.
pub type Ne = [usize; 4];

/// An f32 tensor in host memory, shape in ggml order (`ne[0]` innermost). Images and latents
/// are `[W, H, C, 1]`: `data[x + W * (y + H * c)]`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub ne: Ne,
    pub data: Vec<f32>,
}

/// A tensor's data does not fit its shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {ne:?} tensor needs {want} values, got {got}")]
pub struct ShapeError {
    pub ne: Ne,
    pub want: usize,
    pub got: usize,
}

impl HostTensor {
    /// A tensor of `ne` holding `data`; `None` when the element count does not match.
    pub fn new(ne: Ne, data: Vec<f32>) -> Option<Self> {
        (ne.iter().product::<usize>() == data.len()).then_some(Self { ne, data })
    }

    pub fn zeros(ne: Ne) -> Self {
        Self {
            ne,
            data: vec![0.0; ne.iter().product()],
        }
    }

    /// A `[w, h, c]` image or latent holding `data`, checking its length.
    pub fn image(w: usize, h: usize, c: usize, data: Vec<f32>) -> Result<Self, ShapeError> {
        let ne = [w, h, c, 1];
        let want = w * h * c;
        if data.len() != want {
            return Err(ShapeError {
                ne,
                want,
                got: data.len(),
            });
        }
        Ok(Self { ne, data })
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Width of an image (`ne[0]`).
    pub fn width(&self) -> usize {
        self.ne[0]
    }

    /// Height of an image (`ne[1]`).
    pub fn height(&self) -> usize {
        self.ne[1]
    }

    /// Channels of an image (`ne[2]`).
    pub fn channels(&self) -> usize {
        self.ne[2]
    }

    /// Whether the data length matches the shape.
    pub fn is_consistent(&self) -> bool {
        self.ne.iter().product::<usize>() == self.data.len()
    }

    /// Image value at `(x, y, channel)`.
    pub fn at(&self, x: usize, y: usize, ch: usize) -> f32 {
        self.data[x + self.ne[0] * (y + self.ne[1] * ch)]
    }

    /// Copies the `w` x `h` window of an image starting at `(x0, y0)` (inside the image).
    pub fn crop(&self, x0: usize, y0: usize, w: usize, h: usize) -> HostTensor {
        let [iw, ih, c, _] = self.ne;
        let mut out = Vec::with_capacity(w * h * c);
        for ch in 0..c {
            for y in y0..y0 + h {
                let row = iw * (y + ih * ch);
                out.extend_from_slice(&self.data[row + x0..row + x0 + w]);
            }
        }
        HostTensor {
            ne: [w, h, c, 1],
            data: out,
        }
    }

    /// This tensor with every value mapped by `f`.
    pub fn map(mut self, f: impl Fn(f32) -> f32) -> Self {
        self.data.iter_mut().for_each(|v| *v = f(*v));
        self
    }

    /// A planar image in [0, 1] from interleaved 8-bit pixels of `src_channels` channels,
    /// keeping the first `channels`.
    pub fn from_u8_interleaved(
        width: usize,
        height: usize,
        src_channels: usize,
        channels: usize,
        data: &[u8],
    ) -> Self {
        let mut out = vec![0f32; width * height * channels];
        for ch in 0..channels {
            for (i, px) in data
                .chunks_exact(src_channels)
                .take(width * height)
                .enumerate()
            {
                out[ch * width * height + i] = f32::from(px[ch]) / 255.0;
            }
        }
        Self {
            ne: [width, height, channels, 1],
            data: out,
        }
    }

    /// Interleaved 8-bit pixels of an image in [0, 1] (clamped), rounding as PIL's
    /// `numpy_to_pil` does.
    pub fn to_u8_interleaved(&self) -> Vec<u8> {
        let [w, h, c, _] = self.ne;
        let mut out = vec![0u8; w * h * c];
        for ch in 0..c {
            for (i, &v) in self.data[ch * w * h..(ch + 1) * w * h].iter().enumerate() {
                out[i * c + ch] = (v.clamp(0.0, 1.0) * 255.0).round() as u8;
            }
        }
        out
    }
}
