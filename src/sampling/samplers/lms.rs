//! `lms`: linear multistep (k-diffusion), coefficients by a midpoint Riemann sum of
//! the Lagrange basis, with upstream's "history shift" (default 1; 0 = original).

use super::{eval, to_d};
use crate::rng::Rng;
use crate::sampling::{Denoiser, SamplerOptions, SamplingError};

/// Integral over `[sigmas[m], sigmas[m+1]]` of the j-th Lagrange basis polynomial on
/// `sigmas[m], sigmas[m-1], ...` (f32 like upstream).
fn coeff(sigmas: &[f32], divisions: usize, order: usize, m: usize, j: usize) -> f32 {
    if divisions == 0 {
        return sigmas[m + 1] - sigmas[m];
    }
    let a = sigmas[m];
    let dx = (sigmas[m + 1] - a) / divisions as f32;
    let s = sigmas[m - j];
    let b0 = a + 0.5 * dx;
    let mut sum = 0.0f32;
    for h in 0..divisions {
        let b = h as f32 * dx + b0;
        let mut prod = 1.0f32;
        for k in (0..order).filter(|&k| k != j) {
            let t = sigmas[m - k];
            prod *= (b - t) / (s - t);
        }
        sum += prod;
    }
    sum * dx
}

/// Runs the sampler (order / shift / divisions from the extra args).
pub fn sample(
    denoiser: &mut dyn Denoiser,
    mut x: Vec<f32>,
    sigmas: &[f32],
    _rng: &mut dyn Rng,
    opts: &SamplerOptions,
) -> Result<Vec<f32>, SamplingError> {
    let steps = sigmas.len() - 1;
    let max_order = opts.extra.lms_max_order.max(1).min(steps.max(1));
    let (shift, divisions) = (opts.extra.lms_shift, opts.extra.lms_divisions);
    let mut hist: Vec<Vec<f32>> = vec![];
    for i in 0..steps {
        let sigma = sigmas[i];
        let denoised = eval(denoiser, &x, sigma, i + 1)?;
        let order = max_order.min(i + 1);
        let c: Vec<f32> = (0..order)
            .map(|j| coeff(sigmas, divisions, order, i, j))
            .collect();
        let d = to_d(&x, &denoised, sigma);
        x.iter_mut().zip(&d).for_each(|(v, d)| *v += d * c[0]);
        if max_order > 1 {
            let size_p1 = hist.len() + 1;
            if i > 0 {
                let hist_max = hist.len() - 1;
                for k in 2..=order {
                    let idx = hist_max.min(size_p1 - k + shift);
                    x.iter_mut()
                        .zip(&hist[idx])
                        .for_each(|(v, h)| *v += h * c[k - 1]);
                }
            }
            if size_p1 == max_order {
                hist.remove(0);
            }
            hist.push(d);
        }
    }
    Ok(x)
}
