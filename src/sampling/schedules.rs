//! `--scheduler`: sigma schedules, pure functions of the step count and the model's
//! noise table. Each returns `steps + 1` descending sigmas ending in 0 (the beta
//! schedule may return fewer: it drops repeated timesteps, as upstream does).
//!
//! Formulas and constants follow stable-diffusion.cpp `src/runtime/denoiser.hpp`,
//! including the Qwen Image 2.1 flux variant (terminal stretch to 0.02).

use std::fmt;
use std::str::FromStr;

use super::special::{beta_ppf, ndtri};
use super::tables::{AYS_SD1, AYS_SDXL, AYS_SVD, GITS_1_20};
use super::timesteps::{flux_time_shift, ModelSchedule, TIMESTEPS};
use super::SamplingError;

/// The sigma schedule (upstream `scheduler_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// `discrete` (alias `normal`): evenly spaced timesteps 999 -> 0.
    Discrete,
    /// `karras`: Karras et al. 2022, rho = 7.
    Karras,
    /// `exponential`: evenly spaced in log sigma.
    Exponential,
    /// `ays`: Align Your Steps tables (SD1 / SDXL / SVD).
    Ays,
    /// `gits`: GITS tables (coefficient 1.20).
    Gits,
    /// `sgm_uniform`: timesteps linspace(999, 0, n + 1), first n.
    SgmUniform,
    /// `simple`: every (1000 / n)-th training sigma.
    Simple,
    /// `smoothstep`: timesteps along a smoothstep curve.
    Smoothstep,
    /// `kl_optimal`: evenly spaced in atan(sigma).
    KlOptimal,
    /// `lcm`: LCM's 50-step training grid.
    Lcm,
    /// `bong_tangent`: two arctangent ramps.
    BongTangent,
    /// `ltx2`: LTX-2 token-count shifted flow schedule with terminal stretch.
    Ltx2,
    /// `logit_normal`: logit-normal quantiles (Ideogram 4).
    LogitNormal,
    /// `flux2`: Flux.2 empirical mu.
    Flux2,
    /// `flux`: Flux mu from image token count.
    Flux,
    /// `beta`: Beta(0.6, 0.6) quantiles of the timesteps.
    Beta,
}

impl ScheduleKind {
    /// All kinds in upstream enum order.
    pub const ALL: [ScheduleKind; 16] = [
        ScheduleKind::Discrete,
        ScheduleKind::Karras,
        ScheduleKind::Exponential,
        ScheduleKind::Ays,
        ScheduleKind::Gits,
        ScheduleKind::SgmUniform,
        ScheduleKind::Simple,
        ScheduleKind::Smoothstep,
        ScheduleKind::KlOptimal,
        ScheduleKind::Lcm,
        ScheduleKind::BongTangent,
        ScheduleKind::Ltx2,
        ScheduleKind::LogitNormal,
        ScheduleKind::Flux2,
        ScheduleKind::Flux,
        ScheduleKind::Beta,
    ];

    /// Upstream CLI name.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Discrete => "discrete",
            ScheduleKind::Karras => "karras",
            ScheduleKind::Exponential => "exponential",
            ScheduleKind::Ays => "ays",
            ScheduleKind::Gits => "gits",
            ScheduleKind::SgmUniform => "sgm_uniform",
            ScheduleKind::Simple => "simple",
            ScheduleKind::Smoothstep => "smoothstep",
            ScheduleKind::KlOptimal => "kl_optimal",
            ScheduleKind::Lcm => "lcm",
            ScheduleKind::BongTangent => "bong_tangent",
            ScheduleKind::Ltx2 => "ltx2",
            ScheduleKind::LogitNormal => "logit_normal",
            ScheduleKind::Flux2 => "flux2",
            ScheduleKind::Flux => "flux",
            ScheduleKind::Beta => "beta",
        }
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScheduleKind {
    type Err = SamplingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "normal" {
            return Ok(ScheduleKind::Discrete);
        }
        ScheduleKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| SamplingError::UnknownScheduler(s.to_string()))
    }
}

/// Which Align-Your-Steps table a model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AysFamily {
    /// SD1.x.
    Sd1,
    /// SDXL.
    Sdxl,
    /// Stable Video Diffusion.
    Svd,
}

/// Flux schedule parameters (`base_shift` / `max_shift` are settable upstream through
/// `--extra-sample-args`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FluxScheduleParams {
    /// Token count where mu = `base_shift`.
    pub base_seq_len: u32,
    /// Token count where mu = `max_shift`.
    pub max_seq_len: u32,
    /// mu at `base_seq_len`.
    pub base_shift: f32,
    /// mu at `max_seq_len`.
    pub max_shift: f32,
    /// If > 0 (and steps > 1), stretch so the last model sigma equals this.
    pub shift_terminal: f32,
}

impl FluxScheduleParams {
    /// Classic Flux anchors (256, 0.5) - (4096, 1.15), no terminal stretch.
    pub const FLUX: FluxScheduleParams = FluxScheduleParams {
        base_seq_len: 256,
        max_seq_len: 4096,
        base_shift: 0.5,
        max_shift: 1.15,
        shift_terminal: 0.0,
    };
    /// Qwen Image 2.1: (256, 0.5) - (8192, 0.9), last model sigma 0.02.
    pub const QWEN_IMAGE_2_1: FluxScheduleParams = FluxScheduleParams {
        base_seq_len: 256,
        max_seq_len: 8192,
        base_shift: 0.5,
        max_shift: 0.9,
        shift_terminal: 0.02,
    };

    /// mu for `image_seq_len` tokens (linear in the token count).
    pub fn mu(&self, image_seq_len: u32) -> f32 {
        let m = (self.max_shift - self.base_shift)
            / (self.max_seq_len as f32 - self.base_seq_len as f32);
        let b = self.base_shift - m * self.base_seq_len as f32;
        image_seq_len as f32 * m + b
    }
}

impl Default for FluxScheduleParams {
    fn default() -> Self {
        FluxScheduleParams::FLUX
    }
}

/// LTX-2 schedule parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ltx2ScheduleParams {
    /// Shift at 4096 tokens.
    pub max_shift: f32,
    /// Shift at 1024 tokens.
    pub base_shift: f32,
    /// Apply the terminal stretch.
    pub stretch: bool,
    /// Last model sigma after stretching (clamped to [0, 0.99]).
    pub terminal: f32,
}

impl Default for Ltx2ScheduleParams {
    fn default() -> Self {
        Ltx2ScheduleParams {
            max_shift: 2.05,
            base_shift: 0.95,
            stretch: true,
            terminal: 0.1,
        }
    }
}

/// Logit-normal schedule parameters (upstream defaults for the `--scheduler` path).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitNormalParams {
    /// Mean of the normal in logit space (`mu`).
    pub mean: f32,
    /// Standard deviation.
    pub std: f32,
    /// Lower log-SNR bound.
    pub logsnr_min: f32,
    /// Upper log-SNR bound.
    pub logsnr_max: f32,
    /// Shift the mean by `0.5 ln(tokens / 1024)`.
    pub resolution_aware: bool,
}

impl Default for LogitNormalParams {
    fn default() -> Self {
        LogitNormalParams {
            mean: 0.0,
            std: 1.75,
            logsnr_min: -15.0,
            logsnr_max: 18.0,
            resolution_aware: true,
        }
    }
}

/// Everything a schedule may need besides the step count and model table.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleOptions {
    /// Latent tokens of the image (`(h / vae_scale) * (w / vae_scale)`), for flux,
    /// flux2, ltx2 and logit_normal.
    pub image_seq_len: u32,
    /// AYS table; `None` makes `ays` fail (upstream has no table for other models).
    pub ays: Option<AysFamily>,
    /// Flux parameters (use [`FluxScheduleParams::QWEN_IMAGE_2_1`] for that model).
    pub flux: FluxScheduleParams,
    /// Beta distribution alpha, beta.
    pub beta: (f64, f64),
    /// LTX-2 parameters.
    pub ltx2: Ltx2ScheduleParams,
    /// Logit-normal parameters.
    pub logit_normal: LogitNormalParams,
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        ScheduleOptions {
            image_seq_len: 0,
            ays: None,
            flux: FluxScheduleParams::FLUX,
            beta: (0.6, 0.6),
            ltx2: Ltx2ScheduleParams::default(),
            logit_normal: LogitNormalParams::default(),
        }
    }
}

/// Sigmas for `steps` sampling steps (`Denoiser::get_sigmas` upstream).
pub fn get_sigmas(
    kind: ScheduleKind,
    steps: usize,
    model: &ModelSchedule,
    opts: &ScheduleOptions,
) -> Result<Vec<f32>, SamplingError> {
    let n = steps;
    let t2s = |t: f32| model.t_to_sigma(t);
    let (smin, smax) = (model.sigma_min(), model.sigma_max());
    Ok(match kind {
        ScheduleKind::Discrete => discrete(n, t2s),
        ScheduleKind::Karras => karras(n, smin, smax),
        ScheduleKind::Exponential => exponential(n, smin, smax),
        ScheduleKind::Ays => ays(n, opts.ays)?,
        ScheduleKind::Gits => gits(n)?,
        ScheduleKind::SgmUniform => sgm_uniform(n, t2s),
        ScheduleKind::Simple => simple(n, t2s),
        ScheduleKind::Smoothstep => smoothstep(n, t2s),
        ScheduleKind::KlOptimal => kl_optimal(n, smin, smax),
        ScheduleKind::Lcm => lcm(n, t2s),
        ScheduleKind::BongTangent => bong_tangent(n, smin, smax),
        ScheduleKind::Ltx2 => ltx2(n, opts.image_seq_len, &opts.ltx2),
        ScheduleKind::LogitNormal => logit_normal(n, opts.image_seq_len, &opts.logit_normal),
        ScheduleKind::Flux2 => flux2(n, opts.image_seq_len),
        ScheduleKind::Flux => flux(n, opts.image_seq_len, &opts.flux),
        ScheduleKind::Beta => beta(n, opts.beta.0, opts.beta.1, t2s),
    })
}

const T_MAX: f32 = (TIMESTEPS - 1) as f32;

/// `discrete`: timesteps `999 - i * 999 / (n - 1)`.
pub fn discrete(n: usize, t_to_sigma: impl Fn(f32) -> f32) -> Vec<f32> {
    match n {
        0 => vec![],
        1 => vec![t_to_sigma(T_MAX), 0.0],
        _ => {
            let step = T_MAX / (n - 1) as f32;
            let mut v: Vec<f32> = (0..n)
                .map(|i| t_to_sigma(T_MAX - step * i as f32))
                .collect();
            v.push(0.0);
            v
        }
    }
}

/// `karras`, rho = 7 (sigma_min floored at 1e-6).
pub fn karras(n: usize, sigma_min: f32, sigma_max: f32) -> Vec<f32> {
    let rho = 7.0f32;
    let sigma_min = sigma_min.max(1e-6);
    let min_inv = sigma_min.powf(1.0 / rho);
    let max_inv = sigma_max.powf(1.0 / rho);
    let mut v: Vec<f32> = (0..n)
        .map(|i| (max_inv + i as f32 / (n as f32 - 1.0) * (min_inv - max_inv)).powf(rho))
        .collect();
    v.push(0.0);
    v
}

/// `exponential`: log-linear from sigma_max to sigma_min.
pub fn exponential(n: usize, sigma_min: f32, sigma_max: f32) -> Vec<f32> {
    let (lmin, lmax) = (sigma_min.ln(), sigma_max.ln());
    let step = (lmax - lmin) / (n as f32 - 1.0);
    let mut v: Vec<f32> = (0..n).map(|i| (lmax - step * i as f32).exp()).collect();
    v.push(0.0);
    v
}

/// `start..=end` in `num` points by repeated addition of the f32 increment (upstream
/// `linear_space`; the accumulation matters for exact agreement).
fn linear_space(start: f32, end: f32, num: usize) -> Vec<f32> {
    let inc = (end - start) / (num as f32 - 1.0);
    let mut v = Vec::with_capacity(num);
    if num > 0 {
        v.push(start);
        for i in 1..num {
            v.push(v[i - 1] + inc);
        }
    }
    v
}

/// Resamples a descending sigma list to `new_len` points, linear in log sigma.
fn log_linear_interpolation(sigmas: &[f32], new_len: usize) -> Result<Vec<f32>, SamplingError> {
    let len = sigmas.len();
    let xs = linear_space(0.0, 1.0, len);
    let ys: Vec<f32> = sigmas.iter().rev().map(|s| s.ln()).collect();
    let mut new_x = linear_space(0.0, 1.0, new_len);
    if let (Some(first), Some(last)) = (new_x.first_mut(), xs.first()) {
        *first = first.max(*last);
    }
    if let (Some(l), Some(xl)) = (new_x.last_mut(), xs.last()) {
        *l = l.min(*xl);
    }
    let mut new_y = vec![0.0f64; new_len];
    let (mut i, mut j) = (0usize, 0usize);
    while i < new_len {
        let (Some(&x0), Some(&x1)) = (xs.get(j), xs.get(j + 1)) else {
            return Err(SamplingError::Internal(
                "log-linear interpolation ran past its table".into(),
            ));
        };
        if x0 > new_x[i] || new_x[i] > x1 {
            j += 1;
            continue;
        }
        let perc = f64::from(new_x[i] - x0) / f64::from(x1 - x0);
        new_y[i] = f64::from(ys[j]) * (1.0 - perc) + f64::from(ys[j + 1]) * perc;
        i += 1;
    }
    Ok(new_y.iter().rev().map(|y| y.exp() as f32).collect())
}

/// `ays`: the model's 10-step table, log-linearly resampled to `n` steps.
pub fn ays(n: usize, family: Option<AysFamily>) -> Result<Vec<f32>, SamplingError> {
    let table: &[f32] = match family {
        Some(AysFamily::Sd1) => &AYS_SD1,
        Some(AysFamily::Sdxl) => &AYS_SDXL,
        Some(AysFamily::Svd) => &AYS_SVD,
        None => {
            return Err(SamplingError::ScheduleUnsupported {
                schedule: "ays",
                reason: "it only has tables for SD1.x, SDXL and SVD models".into(),
            })
        }
    };
    let mut v = if n + 1 != table.len() {
        log_linear_interpolation(table, n + 1)?
    } else {
        table.to_vec()
    };
    v[n] = 0.0;
    Ok(v)
}

/// `gits` with coefficient 1.20: table rows for 2..=20 steps, else resampled.
pub fn gits(n: usize) -> Result<Vec<f32>, SamplingError> {
    // Upstream indexes row n - 2 for n <= 20 (undefined for n < 2); we resample the
    // longest row for n < 2 and n > 20.
    let mut v = if (2..=20).contains(&n) {
        GITS_1_20[n - 2].to_vec()
    } else {
        log_linear_interpolation(GITS_1_20[18], n + 1)?
    };
    v[n] = 0.0;
    Ok(v)
}

/// `sgm_uniform`: timesteps linspace(999, 0, n + 1) without the last.
pub fn sgm_uniform(n: usize, t_to_sigma: impl Fn(f32) -> f32) -> Vec<f32> {
    if n == 0 {
        return vec![0.0];
    }
    let ts = linear_space(T_MAX, 0.0, n + 1);
    let mut v: Vec<f32> = ts[..n].iter().map(|&t| t_to_sigma(t)).collect();
    v.push(0.0);
    v
}

/// `simple`: training sigma at index `999 - floor(i * 1000 / n)`.
pub fn simple(n: usize, t_to_sigma: impl Fn(f32) -> f32) -> Vec<f32> {
    if n == 0 {
        return vec![];
    }
    let factor = TIMESTEPS as f32 / n as f32;
    let mut v: Vec<f32> = (0..n)
        .map(|i| {
            let off = (i as f32 * factor) as i64;
            let idx = (TIMESTEPS as i64 - 1 - off).max(0);
            t_to_sigma(idx as f32)
        })
        .collect();
    v.push(0.0);
    v
}

/// `smoothstep`: timesteps `round(smoothstep(1 - i/n) * 999)`.
pub fn smoothstep(n: usize, t_to_sigma: impl Fn(f32) -> f32) -> Vec<f32> {
    match n {
        0 => vec![],
        1 => vec![t_to_sigma(T_MAX), 0.0],
        _ => {
            let mut v: Vec<f32> = (0..n)
                .map(|i| {
                    let u = 1.0 - i as f32 / n as f32;
                    let s = u * u * (3.0 - 2.0 * u);
                    t_to_sigma((s * T_MAX).round())
                })
                .collect();
            v.push(0.0);
            v
        }
    }
}

/// `kl_optimal`: `tan` of evenly spaced angles between atan(sigma_max) and atan(sigma_min).
pub fn kl_optimal(n: usize, sigma_min: f32, sigma_max: f32) -> Vec<f32> {
    match n {
        0 => vec![],
        1 => vec![sigma_max, 0.0],
        _ => {
            let sigma_min = sigma_min.max(1e-6);
            let (amin, amax) = (sigma_min.atan(), sigma_max.atan());
            let mut v: Vec<f32> = (0..n)
                .map(|i| {
                    let t = i as f32 / (n - 1) as f32;
                    (t * amin + (1.0 - t) * amax).tan()
                })
                .collect();
            v.push(0.0);
            v
        }
    }
}

/// `lcm`: timesteps `(50 - floor(50 i / n)) * 20 - 1`.
pub fn lcm(n: usize, t_to_sigma: impl Fn(f32) -> f32) -> Vec<f32> {
    const ORIGINAL_STEPS: usize = 50;
    let k = TIMESTEPS / ORIGINAL_STEPS;
    let mut v: Vec<f32> = (0..n)
        .map(|i| {
            let index = (i * ORIGINAL_STEPS) / n;
            t_to_sigma(((ORIGINAL_STEPS - index) * k - 1) as f32)
        })
        .collect();
    v.push(0.0);
    v
}

fn bong_tangent_ramp(steps: i64, slope: f32, pivot: f32, start: f32, end: f32) -> Vec<f32> {
    use std::f32::consts::PI;
    if steps <= 0 {
        return vec![];
    }
    let f = |x: f32| ((2.0 / PI) * (-slope * (x - pivot)).atan() + 1.0) * 0.5;
    let smax = f(0.0);
    let smin = f((steps - 1) as f32);
    let srange = smax - smin;
    let sscale = start - end;
    if srange.abs() < 1e-8 {
        if steps == 1 {
            return vec![start];
        }
        return (0..steps)
            .map(|i| start + (end - start) * (i as f32 / (steps - 1) as f32))
            .collect();
    }
    let inv = 1.0 / srange;
    (0..steps)
        .map(|x| ((f(x as f32) - smin) * inv) * sscale + end)
        .collect()
}

/// `bong_tangent`: two arctangent ramps meeting half-way between sigma_max and sigma_min.
pub fn bong_tangent(n: usize, sigma_min: f32, sigma_max: f32) -> Vec<f32> {
    if n == 0 {
        return vec![];
    }
    let (start, end) = (sigma_max, sigma_min);
    let middle = sigma_min + (sigma_max - sigma_min) * 0.5;
    let (pivot_1, pivot_2) = (0.6f32, 0.6f32);
    let steps = n as i64 + 2;
    let midpoint = ((steps as f32 * pivot_1 + steps as f32 * pivot_2) * 0.5) as i64;
    let pivot_1_i = (steps as f32 * pivot_1) as i64;
    let pivot_2_i = (steps as f32 * pivot_2) as i64;
    let slope_scale = steps as f32 / 40.0;
    let (slope_1, slope_2) = (0.2 / slope_scale, 0.2 / slope_scale);
    let stage_2_len = steps - midpoint;
    let stage_1_len = steps - stage_2_len;
    let mut s1 = bong_tangent_ramp(stage_1_len, slope_1, pivot_1_i as f32, start, middle);
    let s2 = bong_tangent_ramp(
        stage_2_len,
        slope_2,
        (pivot_2_i - stage_1_len) as f32,
        middle,
        end,
    );
    s1.pop();
    s1.extend(s2);
    s1.resize(n + 1, end);
    s1[n] = 0.0;
    s1
}

/// Stretches `sigmas[..n]` so that `sigmas[n - 1]` becomes `terminal`
/// (`1 - (1 - s) / ((1 - s_last) / (1 - terminal))`).
fn stretch_to_terminal(sigmas: &mut [f32], n: usize, terminal: f32, min_scale: f32) {
    let scale = (1.0 - sigmas[n - 1]) / (1.0 - terminal);
    if scale.is_finite() && scale > min_scale {
        for s in &mut sigmas[..n] {
            *s = 1.0 - (1.0 - *s) / scale;
        }
    }
}

/// `ltx2`: shift from the token count (anchors 1024 and 4096 tokens), then stretch.
pub fn ltx2(n: usize, image_seq_len: u32, p: &Ltx2ScheduleParams) -> Vec<f32> {
    if n == 0 {
        return vec![0.0];
    }
    let tokens = if image_seq_len > 0 {
        image_seq_len
    } else {
        4096
    };
    let m = (p.max_shift - p.base_shift) / (4096.0 - 1024.0);
    let b = p.base_shift - m * 1024.0;
    let exp_shift = (tokens as f32 * m + b).exp();
    let terminal = p.terminal.clamp(0.0, 0.99);
    let mut v: Vec<f32> = (0..=n)
        .map(|i| {
            let s = 1.0 - i as f32 / n as f32;
            if s != 0.0 {
                exp_shift / (exp_shift + (1.0 / s - 1.0))
            } else {
                s
            }
        })
        .collect();
    if p.stretch && v.len() > 2 {
        stretch_to_terminal(&mut v, n, terminal, 1e-8);
    }
    v[n] = 0.0;
    v
}

/// `flux`: `flux_time_shift(mu, 1, 1 - i/n)` with mu from the token count; optional
/// terminal stretch (Qwen Image 2.1) on the model sigmas only, never for n = 1.
pub fn flux(n: usize, image_seq_len: u32, p: &FluxScheduleParams) -> Vec<f32> {
    if n == 0 {
        return vec![1.0];
    }
    let mu = p.mu(image_seq_len);
    let mut v: Vec<f32> = (0..=n)
        .map(|i| {
            let t = 1.0 - i as f32 / n as f32;
            if t <= 0.0 {
                0.0
            } else {
                flux_time_shift(mu, 1.0, t)
            }
        })
        .collect();
    if p.shift_terminal > 0.0 && n > 1 {
        stretch_to_terminal(&mut v, n, p.shift_terminal, 0.0);
    }
    v[n] = 0.0;
    v
}

/// Flux.2's empirical mu for a token count and step count.
pub fn flux2_empirical_mu(image_seq_len: u32, steps: usize) -> f32 {
    let (a1, b1) = (8.738_095e-5f32, 1.898_333_3f32);
    let (a2, b2) = (0.000_169_27f32, 0.456_666_66f32);
    let len = image_seq_len as f32;
    if image_seq_len > 4300 {
        return a2 * len + b2;
    }
    let m_200 = a2 * len + b2;
    let m_10 = a1 * len + b1;
    let a = (m_200 - m_10) / 190.0;
    let b = m_200 - 200.0 * a;
    a * steps as f32 + b
}

/// `flux2`: like `flux` with Flux.2's empirical mu.
pub fn flux2(n: usize, image_seq_len: u32) -> Vec<f32> {
    if n == 0 {
        return vec![1.0];
    }
    let mu = flux2_empirical_mu(image_seq_len, n);
    let mut v: Vec<f32> = (0..=n)
        .map(|i| {
            let t = 1.0 - i as f32 / n as f32;
            if t <= 0.0 {
                0.0
            } else if t >= 1.0 {
                1.0
            } else {
                flux_time_shift(mu, 1.0, t)
            }
        })
        .collect();
    v[n] = 0.0;
    v
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `logit_normal`: `sigmoid(mean + std * z_{1 - i/n})`, clamped by the log-SNR bounds.
pub fn logit_normal(n: usize, image_seq_len: u32, p: &LogitNormalParams) -> Vec<f32> {
    let mut mean = p.mean;
    if image_seq_len > 0 && p.resolution_aware {
        let known = (512.0 * 512.0) / (16.0 * 16.0);
        mean += 0.5 * (image_seq_len as f32 / known).ln();
    }
    let hi = sigmoid(0.5 * p.logsnr_max);
    let lo = sigmoid(0.5 * p.logsnr_min);
    let mut v: Vec<f32> = (0..=n)
        .map(|i| {
            let t = i as f32 / n as f32;
            let z = -ndtri(f64::from(t)) as f32;
            sigmoid(mean + p.std * z).min(hi).max(lo)
        })
        .collect();
    v[n] = 0.0;
    v
}

/// `beta`: timesteps `round(ppf(1 - i/n) * 999)`, consecutive repeats dropped.
pub fn beta(n: usize, alpha: f64, beta: f64, t_to_sigma: impl Fn(f32) -> f32) -> Vec<f32> {
    match n {
        0 => return vec![],
        1 => return vec![t_to_sigma(T_MAX), 0.0],
        _ => {}
    }
    let mut v = Vec::with_capacity(n + 1);
    let mut last_t = -1i64;
    for i in 0..n {
        let u = 1.0 - i as f64 / n as f64;
        let t = (beta_ppf(u, alpha, beta) * f64::from(T_MAX)).round() as i64;
        if t != last_t {
            v.push(t_to_sigma(t as f32));
            last_t = t;
        }
    }
    v.push(0.0);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        for k in ScheduleKind::ALL {
            assert_eq!(k.name().parse::<ScheduleKind>().unwrap(), k);
        }
        assert_eq!(
            "normal".parse::<ScheduleKind>().unwrap(),
            ScheduleKind::Discrete
        );
        assert!("foo".parse::<ScheduleKind>().is_err());
    }

    #[test]
    fn gits_rows_and_resampling() {
        let g = gits(10).unwrap();
        assert_eq!(g.len(), 11);
        assert_eq!(&g[..10], &GITS_1_20[8][..10]);
        assert_eq!(g[10], 0.0);
        for n in [1usize, 25, 40] {
            let g = gits(n).unwrap();
            assert_eq!(g.len(), n + 1);
            assert!(
                (g[0] - 14.614_641).abs() < 1e-3 && g[n] == 0.0,
                "n={n}: {g:?}"
            );
            assert!(g.windows(2).all(|w| w[0] >= w[1]), "n={n}: {g:?}");
        }
    }

    #[test]
    fn qwen_terminal_contract() {
        let p = FluxScheduleParams::QWEN_IMAGE_2_1;
        for n in [2usize, 4, 20, 50] {
            let s = flux(n, 4096, &p);
            assert_eq!(s.len(), n + 1);
            assert!((s[n - 1] - 0.02).abs() < 1e-6, "n={n}: {}", s[n - 1]);
            assert_eq!(s[n], 0.0);
            assert!((s[0] - 1.0).abs() < 1e-6);
        }
        assert_eq!(flux(1, 4096, &p), vec![1.0, 0.0]);
        assert!((p.mu(8192) - 0.9).abs() < 1e-6 && (p.mu(256) - 0.5).abs() < 1e-6);
    }
}
