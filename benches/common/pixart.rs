//! The PixArt-Σ XL step the PixArt benchmarks time: 512×512 (64×64 latent) with CFG (batch 2)
//! and 300 context tokens, fixed inputs; a warm-up and a timed run, the faster kept.

use std::time::Instant;

use sd_cli::models::dit::pixart::{PixArt, PixArtInputs, PosEmbedParams};
use sd_cli::runner::Runner;

/// The runner cache key of the caption's cross-attention K/V in cached steps.
#[allow(dead_code)] // (`lora_step` times full steps only)
const CROSS_CACHE: &str = "bench.cross";

/// Seconds of the faster of two steps, each computing everything (as diffusers does).
pub fn best_step_seconds(runner: &Runner, model: &PixArt) -> f64 {
    // As the reference script: one warm-up step, then the best of two.
    step_seconds(runner, model, None);
    step_seconds(runner, model, None).min(step_seconds(runner, model, None))
}

/// Seconds of the faster of two steps reading the caption's cross-attention K/V that an
/// earlier step stored: the sampler's steps after its first (the pipeline keeps them).
#[allow(dead_code)] // (`lora_step` times full steps only)
pub fn best_cached_step_seconds(runner: &Runner, model: &PixArt) -> f64 {
    runner.clear_cache(CROSS_CACHE);
    step_seconds(runner, model, Some(CROSS_CACHE));
    let best = step_seconds(runner, model, Some(CROSS_CACHE)).min(step_seconds(
        runner,
        model,
        Some(CROSS_CACHE),
    ));
    runner.clear_cache(CROSS_CACHE);
    best
}

/// Seconds of one step (keeping the cross-attention K/V under `cache`, if given).
fn step_seconds(runner: &Runner, model: &PixArt, cache: Option<&str>) -> f64 {
    let x: Vec<f32> = (0..64 * 64 * 4 * 2)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let ctx: Vec<f32> = (0..4096 * 300 * 2)
        .map(|i| ((i * 104729 % 1000) as f32 / 5000.0) - 0.1)
        .collect();
    let t0 = Instant::now();
    let out = runner
        .compute(|g| {
            let inputs = PixArtInputs {
                x: g.input_f32("x", [64, 64, 4, 2], x.clone()),
                timesteps: g.input_f32("t", [2, 1, 1, 1], vec![999.0; 2]),
                context: g.input_f32("ctx", [4096, 300, 2, 1], ctx.clone()),
                context_mask: None,
                micro: None,
            };
            vec![model.forward_cached(g, &inputs, PosEmbedParams::default(), cache)]
        })
        .expect("step");
    let seconds = t0.elapsed().as_secs_f64();
    assert_eq!(out[0].ne, [64, 64, 8, 2]);
    seconds
}
