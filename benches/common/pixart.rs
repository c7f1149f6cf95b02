//! The PixArt-Σ XL step the PixArt benchmarks time: 512×512 (64×64 latent) with CFG (batch 2)
//! and 300 context tokens, fixed inputs; a warm-up and a timed run, the faster kept.

use std::time::Instant;

use sd_cli::models::dit::pixart::{PixArt, PixArtInputs, PosEmbedParams};
use sd_cli::runner::Runner;

/// Seconds of the faster of two steps.
pub fn best_step_seconds(runner: &Runner, model: &PixArt) -> f64 {
    let x: Vec<f32> = (0..64 * 64 * 4 * 2)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let ctx: Vec<f32> = (0..4096 * 300 * 2)
        .map(|i| ((i * 104729 % 1000) as f32 / 5000.0) - 0.1)
        .collect();
    // As the reference script: one warm-up step, then the best of two.
    let mut best = f64::INFINITY;
    for run in 0..3 {
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
                vec![model.forward(g, &inputs, PosEmbedParams::default())]
            })
            .expect("step");
        assert_eq!(out[0].ne, [64, 64, 8, 2]);
        if run > 0 {
            best = best.min(t0.elapsed().as_secs_f64());
        }
    }
    best
}
