//! Previews while sampling (`--preview proj|tae|vae`, `--preview-interval`, `--preview-noisy`):
//! every few steps the current latent — the denoised estimate, or with `--preview-noisy` the
//! model's noisy input — becomes a picture handed to a [`PreviewSink`] (the app writes it to
//! `--preview-path`, atomically).
//!
//! `proj` multiplies the latent by the family's fixed latent→RGB matrix (upstream's
//! `latent-preview.h` constants; families without one preview nothing, with a warning, as
//! upstream); `vae` and `tae` decode it with the run's decoder (the VAE, or TAESD when the run
//! decodes with `--taesd`).

use crate::error::Result;
use crate::models::vae::tiling::TileSettings;
use crate::tensor::HostTensor;

use super::vae::VaeStage;

/// How a preview is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PreviewMethod {
    /// The latent through a fixed linear map to RGB (fast, rough).
    Proj,
    /// The tiny autoencoder (decodes with the run's decoder here; see the module docs).
    Tae,
    /// The run's VAE.
    Vae,
}

impl std::str::FromStr for PreviewMethod {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "proj" => Ok(Self::Proj),
            "tae" => Ok(Self::Tae),
            "vae" => Ok(Self::Vae),
            _ => Err(format!(
                "unknown preview method '{s}' (none, proj, tae, vae)"
            )),
        }
    }
}

/// Where previews go.
pub trait PreviewSink {
    fn method(&self) -> PreviewMethod;
    /// Preview the model's noisy input instead of the denoised estimate.
    fn noisy(&self) -> bool;
    /// Whether 1-based step `step` gets a preview.
    fn due(&self, step: usize) -> bool;
    /// Takes one preview, [W, H, 3] in [0, 1].
    fn show(&mut self, step: usize, image: &HostTensor);
}

/// What a generation request carries for previews.
pub struct PreviewRequest<'a> {
    pub sink: &'a mut (dyn PreviewSink + 'static),
    /// `--vae-tiling` for `vae`/`tae` previews.
    pub tiling: Option<&'a TileSettings>,
}

impl<'a> PreviewRequest<'a> {
    /// [`Self::with`], drawing `tae` previews with `preview_vae` (TAESD under
    /// `--taesd-preview-only`) when the family loaded one, else with `vae`.
    pub(crate) fn with_decoders<'b>(
        self,
        projection: Option<LatentProjection>,
        vae: &'b VaeStage,
        preview_vae: Option<&'b VaeStage>,
    ) -> LatentPreview<'b>
    where
        'a: 'b,
    {
        let decoder = match (self.sink.method(), preview_vae) {
            (PreviewMethod::Tae, Some(tae)) => tae,
            _ => vae,
        };
        self.with(projection, decoder)
    }

    /// The request with the family's means to draw latents.
    pub(crate) fn with<'b>(
        self,
        projection: Option<LatentProjection>,
        vae: &'b VaeStage,
    ) -> LatentPreview<'b>
    where
        'a: 'b,
    {
        LatentPreview {
            sink: self.sink,
            projection,
            vae,
            tiling: self.tiling,
        }
    }
}

/// A family's latent→RGB projection: rgb = latent · rows + bias, then `x / 2 + 0.5`.
#[derive(Clone, Copy, Debug)]
pub struct LatentProjection {
    pub rows: &'static [[f32; 3]],
    pub bias: [f32; 3],
}

/// SD 1.x / 2.x latents (upstream `sd_latent_rgb_proj` / `sd_latent_rgb_bias`).
pub const SD_PROJECTION: LatentProjection = LatentProjection {
    rows: &[
        [0.337366, 0.216344, 0.257386],
        [0.165636, 0.386828, 0.046994],
        [-0.267803, 0.237036, 0.223517],
        [-0.178022, -0.200862, -0.678514],
    ],
    bias: [-0.017478, -0.055834, -0.105825],
};

/// SDXL latents (upstream `sdxl_latent_rgb_proj` / `sdxl_latent_rgb_bias`).
pub const SDXL_PROJECTION: LatentProjection = LatentProjection {
    rows: &[
        [0.258303, 0.277640, 0.329699],
        [-0.299701, 0.105446, 0.014194],
        [0.050522, 0.186163, -0.143257],
        [-0.211938, -0.149892, -0.080036],
    ],
    bias: [0.144381, -0.033313, 0.007061],
};

impl LatentProjection {
    /// The preview of a latent [w, h, C] (C = the projection's rows) as [w, h, 3] in [0, 1].
    pub fn project(&self, latent: &HostTensor) -> HostTensor {
        let (w, h, c) = (latent.width(), latent.height(), latent.channels());
        let plane = w * h;
        let mut out = vec![0f32; plane * 3];
        for (ch, row) in self.rows.iter().enumerate().take(c) {
            let src = &latent.data[ch * plane..(ch + 1) * plane];
            for (k, weight) in row.iter().enumerate() {
                let dst = &mut out[k * plane..(k + 1) * plane];
                dst.iter_mut().zip(src).for_each(|(o, v)| *o += v * weight);
            }
        }
        for (k, b) in self.bias.iter().enumerate() {
            out[k * plane..(k + 1) * plane]
                .iter_mut()
                .for_each(|v| *v = ((*v + b) * 0.5 + 0.5).clamp(0.0, 1.0));
        }
        HostTensor {
            ne: [w, h, 3, 1],
            data: out,
        }
    }
}

/// A sink with the means to turn latents into pictures, for one sampling run.
pub(crate) struct LatentPreview<'a> {
    pub sink: &'a mut (dyn PreviewSink + 'static),
    pub projection: Option<LatentProjection>,
    pub vae: &'a VaeStage,
    pub tiling: Option<&'a TileSettings>,
}

impl LatentPreview<'_> {
    /// Shows the latent of `step` ([w, h, C] values `data`) if the sink wants it. A failed
    /// decode only loses the preview (a warning), as upstream.
    pub fn step(&mut self, step: usize, shape: (usize, usize, usize), data: &[f32]) {
        if !self.sink.due(step) {
            return;
        }
        let (w, h, c) = shape;
        let latent = HostTensor {
            ne: [w, h, c, 1],
            data: data.to_vec(),
        };
        let image: Result<HostTensor> = match (self.sink.method(), &self.projection) {
            (PreviewMethod::Proj, Some(p)) => Ok(p.project(&latent)),
            (PreviewMethod::Proj, None) => return,
            (PreviewMethod::Vae | PreviewMethod::Tae, _) => self.vae.decode(&latent, self.tiling),
        };
        match image {
            Ok(img) => self.sink.show(step, &img),
            Err(e) => log::warn!("preview of step {step} failed: {e}"),
        }
    }

    /// Warns once when `proj` has no matrix for this family.
    pub fn check(&self, family: &str) {
        if self.sink.method() == PreviewMethod::Proj && self.projection.is_none() {
            log::warn!("no latent-to-RGB projection is known for {family}: no proj previews");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_is_linear_then_mapped_to_unit_range() {
        let latent = HostTensor {
            ne: [1, 1, 4, 1],
            data: vec![1.0, 0.0, 0.0, 0.0],
        };
        let img = SD_PROJECTION.project(&latent);
        let want = [
            0.337366 - 0.017478,
            0.216344 - 0.055834,
            0.257386 - 0.105825,
        ];
        for (got, w) in img.data.iter().zip(want) {
            assert!((got - (w * 0.5 + 0.5)).abs() < 1e-6);
        }
        assert_eq!("vae".parse::<PreviewMethod>(), Ok(PreviewMethod::Vae));
        assert!("none".parse::<PreviewMethod>().is_err());
    }
}
