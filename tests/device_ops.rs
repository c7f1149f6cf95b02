//! An op the device has no kernel for is refused before anything runs, with an error naming
//! the device and the op: never an abort inside ggml and never a silently wrong result.
//! Runs on `SD_CLI_TEST_BACKEND` (scripts/device-tests): the CPU and the RPC device compute
//! the graph; ggml's Vulkan backend has no f32 → q4_K copy and must refuse it.
//! Tolerance of the computed round trip: q4_K's own quantisation error (< 1/8 of the range).

mod common;

use sd_cli::dtype::DType;
use sd_cli::runner::RunnerError;

/// A graph that quantises 512 values to q4_K and widens them back.
fn q4k_round_trip() -> (Vec<f32>, Result<Vec<f32>, RunnerError>) {
    let input: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect();
    let runner = common::runner(None, common::cpu(), false);
    let out = runner.compute(|g| {
        let x = g.input_f32("device_ops.x", [256, 2, 1, 1], input.clone());
        let q = g.ctx().cast(x, DType::Q4_K);
        vec![g.ctx().cast(q, DType::F32)]
    });
    (input, out.map(|mut v| v.remove(0).data))
}

#[test]
fn an_op_without_a_kernel_on_the_device_is_refused_by_name() {
    let device = common::device::test_device();
    let (input, result) = q4k_round_trip();
    match result {
        Ok(out) => {
            let err = out
                .iter()
                .zip(&input)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(err < 0.25, "q4_K round trip error {err}");
            assert!(
                !device.as_deref().unwrap_or("").starts_with("Vulkan"),
                "ggml's Vulkan backend has no f32 -> q4_K copy, yet the graph ran"
            );
        }
        Err(e) => {
            let text = e.to_string();
            let name = device.expect("the CPU runs every op");
            assert!(text.contains(&name), "{text}");
            assert!(text.contains("cannot run op CPY"), "{text}");
            assert!(text.contains("q4_K"), "{text}");
            eprintln!("refused as expected: {text}");
        }
    }
}
