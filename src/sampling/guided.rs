//! The guided denoiser every family samples with: a family's raw model predictions for the
//! conditions a step needs, combined by classifier-free guidance (with the image-unconditional
//! branch of edit models), turned into the denoised estimate by the model's parameterisation,
//! plus the unconditional estimate the CFG++ samplers renoise along.
//!
//! Follows upstream's denoise callback (`stable-diffusion.cpp`, `ClassifierFreeGuidance` in
//! `runtime/guidance.cpp`): guidance combines raw model outputs, then `denoised = out · c_out +
//! x · c_skip`; CFG++ renoises along the image-unconditional prediction when there is one, else
//! the unconditional one, else the conditional one (no CFG). Distilled guidance (FLUX) is a model
//! input, not a combination: [`ModelCall::distilled_guidance`] carries it to the model.

use super::{CfgPpOutput, Denoiser, ModelSchedule, Prediction, SamplingError};

/// Guidance scales of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Guidance {
    /// `--cfg-scale`: text guidance; 1 runs the conditional prediction alone.
    pub scale: f32,
    /// `--img-cfg-scale`: image guidance of edit models (with an image-unconditional branch).
    pub img_scale: f32,
    /// `--guidance`: distilled guidance, passed to models that take it as an input.
    pub distilled: f32,
}

impl Guidance {
    /// Plain classifier-free guidance at `scale` (image scale the same, as upstream's default).
    pub fn cfg(scale: f32) -> Self {
        Self {
            scale,
            img_scale: scale,
            distilled: 3.5,
        }
    }

    /// Whether a step needs the unconditional prediction.
    pub fn needs_uncond(&self) -> bool {
        self.scale != 1.0
    }
}

/// Which predictions one step needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needs {
    pub uncond: bool,
    /// The image-unconditional branch (edit models that support image guidance).
    pub img_uncond: bool,
    /// Skip-layer guidance: also the conditional prediction with [`ModelCall::skip_layers`]
    /// skipped.
    pub skip_cond: bool,
    /// `slg_uncond`: the unconditional prediction runs with the layers skipped.
    pub skip_uncond: bool,
}

/// One model evaluation's inputs.
#[derive(Clone, Copy, Debug)]
pub struct ModelCall<'a> {
    /// The scaled model input `x · c_in`.
    pub x: &'a [f32],
    /// The model's timestep for this sigma.
    pub t: f32,
    pub sigma: f32,
    /// 1-based sampling step.
    pub step: usize,
    pub needs: Needs,
    /// `--guidance` for models with a distilled-guidance input.
    pub distilled_guidance: f32,
    /// The blocks skip-layer guidance leaves out (when `needs` asks for it).
    pub skip_layers: &'a [usize],
}

/// Raw model outputs of one step (each as long as the latent).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Predictions {
    pub cond: Vec<f32>,
    pub uncond: Option<Vec<f32>>,
    pub img_uncond: Option<Vec<f32>>,
    /// The conditional prediction with the skip layers left out (skip-layer guidance).
    pub skip_cond: Option<Vec<f32>>,
}

impl Predictions {
    /// The predictions a step asks for, each from one call of `run(condition, skipped
    /// blocks)`: cond; cond without the skip layers (skip-layer guidance); uncond (with the
    /// skip layers left out under `slg_uncond`). For models that evaluate each condition alone.
    pub fn one_call_each<C>(
        call: &ModelCall<'_>,
        cond: &C,
        uncond: Option<&C>,
        mut run: impl FnMut(&C, &[usize]) -> Result<Vec<f32>, String>,
    ) -> Result<Predictions, String> {
        let cond_out = run(cond, &[])?;
        let skip_cond = if call.needs.skip_cond {
            Some(run(cond, call.skip_layers)?)
        } else {
            None
        };
        let uncond_skip = if call.needs.skip_uncond {
            call.skip_layers
        } else {
            &[]
        };
        let uncond = match (call.needs.uncond, uncond) {
            (true, Some(u)) => Some(run(u, uncond_skip)?),
            (true, None) => {
                return Err(
                    "the unconditional prediction was asked without a negative prompt".into(),
                )
            }
            (false, _) => None,
        };
        Ok(Predictions {
            cond: cond_out,
            uncond,
            img_uncond: None,
            skip_cond,
        })
    }
}

/// A family's model: raw predictions for the conditions a step needs (batched or one call
/// each, as the model prefers). Errors are reported as the message of a failed evaluation.
pub trait GuidedModel {
    fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String>;

    /// Whether the model can predict the image-unconditional branch (edit models).
    fn has_image_branch(&self) -> bool {
        false
    }

    /// Whether the model can leave blocks out (skip-layer guidance).
    fn can_skip_layers(&self) -> bool {
        false
    }
}

/// Skip-layer guidance (`--slg-scale`, `--skip-layers`, `--skip-layer-start/-end`), as
/// upstream: on steps s (1-based) with ⌊start·n⌋ < s < ⌊end·n⌋, n the number of sigmas, the
/// guided prediction gains `scale · (cond − cond without the layers)`; with `slg_uncond` the
/// unconditional prediction runs without them instead.
#[derive(Clone, Debug, PartialEq)]
pub struct SkipLayerGuidance {
    pub layers: Vec<usize>,
    pub scale: f32,
    pub start: f32,
    pub end: f32,
    pub uncond: bool,
}

impl SkipLayerGuidance {
    /// Whether step `step` of a schedule of `sigmas` values skips layers.
    pub fn enabled(&self, step: usize, sigmas: usize) -> bool {
        let start = (self.start * sigmas as f32) as i64;
        let end = (self.end * sigmas as f32) as i64;
        !self.layers.is_empty() && (step as i64) > start && (step as i64) < end
    }
}

/// Combines raw predictions as upstream's classifier-free guidance does.
pub fn combine(p: &Predictions, g: &Guidance) -> Result<Vec<f32>, SamplingError> {
    let n = p.cond.len();
    let check = |v: &Vec<f32>, what: &'static str| {
        if v.len() == n {
            Ok(())
        } else {
            Err(SamplingError::LengthMismatch {
                what,
                expected: n,
                got: v.len(),
            })
        }
    };
    match (&p.uncond, &p.img_uncond) {
        (Some(u), Some(i)) => {
            check(u, "guidance: uncond vs cond")?;
            check(i, "guidance: image-uncond vs cond")?;
            Ok(p.cond
                .iter()
                .zip(u)
                .zip(i)
                .map(|((c, u), i)| i + g.img_scale * (u - i) + g.scale * (c - u))
                .collect())
        }
        (Some(u), None) => {
            check(u, "guidance: uncond vs cond")?;
            Ok(p.cond
                .iter()
                .zip(u)
                .map(|(c, u)| u + g.scale * (c - u))
                .collect())
        }
        (None, Some(i)) => {
            check(i, "guidance: image-uncond vs cond")?;
            Ok(p.cond
                .iter()
                .zip(i)
                .map(|(c, i)| i + g.scale * (c - i))
                .collect())
        }
        (None, None) => Ok(p.cond.clone()),
    }
}

/// One evaluation of the model, as step observers (progress bars, previews) see it.
pub struct StepState<'s> {
    /// The 1-based sampling step.
    pub step: usize,
    /// The model's (scaled) input: the noisy latent `x · c_in`.
    pub model_input: &'s [f32],
    /// The denoised estimate.
    pub denoised: &'s [f32],
}

/// Inpainting's blend (upstream's denoise mask): after each evaluation the denoised estimate
/// keeps `init` where `mask` is 0 — `d·m + init·(1 − m)` — and no init blends with zeros.
#[derive(Clone, Copy, Debug)]
pub struct DenoiseMask<'a> {
    /// One value per latent pixel ([w, h]), shared by every channel.
    pub mask: &'a [f32],
    /// The init image's latent ([w, h, C]).
    pub init: Option<&'a [f32]>,
}

impl DenoiseMask<'_> {
    pub fn apply(&self, denoised: &mut [f32]) -> Result<(), SamplingError> {
        let plane = self.mask.len();
        let bad = |got: usize| SamplingError::LengthMismatch {
            what: "denoise mask vs latent",
            expected: denoised.len(),
            got,
        };
        if plane == 0 || !denoised.len().is_multiple_of(plane) {
            return Err(bad(plane));
        }
        if let Some(init) = self.init.filter(|i| i.len() != denoised.len()) {
            return Err(bad(init.len()));
        }
        for (i, d) in denoised.iter_mut().enumerate() {
            let m = self.mask[i % plane];
            let keep = self.init.map_or(0.0, |x| x[i]);
            *d = *d * m + keep * (1.0 - m);
        }
        Ok(())
    }
}

/// The denoiser of a sampling run: a [`GuidedModel`] under a parameterisation and noise table,
/// with guidance.
pub struct GuidedDenoiser<'a, M: GuidedModel> {
    pub model: M,
    pub prediction: Prediction,
    pub schedule: &'a ModelSchedule,
    pub guidance: Guidance,
    /// `--mask`: inpainting's blend of each denoised estimate.
    pub mask: Option<DenoiseMask<'a>>,
    /// Skip-layer guidance and the schedule's length (sigmas) its window is measured in.
    pub slg: Option<(&'a SkipLayerGuidance, usize)>,
    /// Called after each evaluation (progress bars, previews).
    pub on_step: &'a mut dyn FnMut(StepState<'_>),
}

impl<M: GuidedModel> GuidedDenoiser<'_, M> {
    fn evaluate(
        &mut self,
        x: &[f32],
        sigma: f32,
        step: usize,
    ) -> Result<(Vec<f32>, Predictions), SamplingError> {
        let x_in = self.prediction.model_input(x, sigma);
        let slg = self
            .slg
            .filter(|(g, n)| self.model.can_skip_layers() && g.enabled(step, *n))
            .map(|(g, _)| g);
        let needs = Needs {
            uncond: self.guidance.needs_uncond(),
            img_uncond: self.model.has_image_branch() && self.guidance.img_scale != 1.0,
            skip_cond: slg.is_some_and(|g| g.scale != 0.0),
            skip_uncond: slg.is_some_and(|g| g.uncond) && self.guidance.needs_uncond(),
        };
        let call = ModelCall {
            x: &x_in,
            t: self.schedule.sigma_to_t(sigma),
            sigma,
            step,
            needs,
            distilled_guidance: self.guidance.distilled,
            skip_layers: slg.map_or(&[], |g| g.layers.as_slice()),
        };
        let preds = self
            .model
            .predict(call)
            .map_err(|message| SamplingError::Denoiser { sigma, message })?;
        let mut guided = combine(&preds, &self.guidance)?;
        if let (Some(skip), Some(g)) = (&preds.skip_cond, slg) {
            if skip.len() != guided.len() {
                return Err(SamplingError::LengthMismatch {
                    what: "skip-layer prediction vs cond",
                    expected: guided.len(),
                    got: skip.len(),
                });
            }
            for ((o, c), s) in guided.iter_mut().zip(&preds.cond).zip(skip) {
                *o += g.scale * (c - s);
            }
        }
        let mut denoised = self.prediction.to_denoised(&guided, x, sigma)?;
        if let Some(mask) = &self.mask {
            mask.apply(&mut denoised)?;
        }
        (self.on_step)(StepState {
            step,
            model_input: &x_in,
            denoised: &denoised,
        });
        Ok((denoised, preds))
    }
}

impl<M: GuidedModel> Denoiser for GuidedDenoiser<'_, M> {
    fn denoise(&mut self, x: &[f32], sigma: f32, step: usize) -> Result<Vec<f32>, SamplingError> {
        self.evaluate(x, sigma, step).map(|(d, _)| d)
    }

    fn denoise_cfg_pp(
        &mut self,
        x: &[f32],
        sigma: f32,
        step: usize,
    ) -> Result<CfgPpOutput, SamplingError> {
        let (denoised, preds) = self.evaluate(x, sigma, step)?;
        let base = preds
            .img_uncond
            .as_ref()
            .or(preds.uncond.as_ref())
            .unwrap_or(&preds.cond);
        let uncond_denoised = self.prediction.to_denoised(base, x, sigma)?;
        Ok(CfgPpOutput {
            denoised,
            uncond_denoised,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_follows_upstream() {
        let g = Guidance {
            scale: 2.0,
            img_scale: 1.5,
            distilled: 3.5,
        };
        let p = |u: Option<f32>, i: Option<f32>| Predictions {
            cond: vec![3.0],
            uncond: u.map(|v| vec![v]),
            img_uncond: i.map(|v| vec![v]),
            skip_cond: None,
        };
        assert_eq!(combine(&p(None, None), &g).unwrap(), vec![3.0]);
        assert_eq!(combine(&p(Some(2.0), None), &g).unwrap(), vec![4.0]);
        assert_eq!(combine(&p(None, Some(1.0)), &g).unwrap(), vec![5.0]);
        assert_eq!(
            combine(&p(Some(2.0), Some(1.0)), &g).unwrap(),
            vec![1.0 + 1.5 + 2.0]
        );
        let bad = Predictions {
            cond: vec![1.0, 2.0],
            uncond: Some(vec![1.0]),
            img_uncond: None,
            skip_cond: None,
        };
        assert!(combine(&bad, &g).is_err());
    }

    /// A model whose predictions are known: cond = x + 1, uncond = x − 1 (eps form).
    struct Affine {
        calls: Vec<Needs>,
        timesteps: Vec<f32>,
    }

    impl GuidedModel for Affine {
        fn predict(&mut self, call: ModelCall<'_>) -> Result<Predictions, String> {
            self.calls.push(call.needs);
            self.timesteps.push(call.t);
            Ok(Predictions {
                cond: call.x.iter().map(|v| v + 1.0).collect(),
                uncond: call
                    .needs
                    .uncond
                    .then(|| call.x.iter().map(|v| v - 1.0).collect()),
                img_uncond: None,
                skip_cond: None,
            })
        }
    }

    #[test]
    fn cfg_pp_gets_the_unconditional_estimate() {
        let schedule = ModelSchedule::Flow { shift: 1.0 };
        let mut steps = vec![];
        let mut on_step = |s: StepState<'_>| steps.push(s.step);
        let mut d = GuidedDenoiser {
            model: Affine {
                calls: vec![],
                timesteps: vec![],
            },
            prediction: Prediction::Sd3Flow,
            schedule: &schedule,
            guidance: Guidance::cfg(3.0),
            mask: None,
            slg: None,
            on_step: &mut on_step,
        };
        let x = [0.5f32];
        let out = d.denoise_cfg_pp(&x, 0.5, 1).unwrap();
        // Flow: denoised = x − σ·v. Guided v = (x−1) + 3·2 = x + 5.
        assert_eq!(out.denoised, vec![0.5 - 0.5 * 5.5]);
        assert_eq!(out.uncond_denoised, vec![0.5 - 0.5 * -0.5]);
        // Without CFG the conditional prediction is the base, and no uncond is asked for.
        d.guidance = Guidance::cfg(1.0);
        let out = d.denoise_cfg_pp(&x, 0.5, 2).unwrap();
        assert_eq!(out.denoised, out.uncond_denoised);
        assert!(!d.model.calls[1].uncond && d.model.calls[0].uncond);
        // The flow table maps sigma 0.5 to timestep 500.
        assert_eq!(d.model.timesteps, vec![500.0, 500.0]);
        drop(d);
        assert_eq!(steps, vec![1, 2]);
    }
}
