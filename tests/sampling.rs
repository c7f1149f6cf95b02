//! Sampling layer vs Python/C++ references (fixtures from
//! tests/reference/sampling_fixtures.py).

use sd_cli::rng::{PhiloxRng, Rng, StdDefaultRng, TorchCpuRng};
use serde::Deserialize;

fn fixture(name: &str) -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sampling/");
    let text = std::fs::read_to_string(format!("{path}{name}")).expect("fixture present");
    serde_json::from_str(&text).expect("fixture json")
}

#[derive(Deserialize)]
struct RngCase {
    seed: u64,
    sizes: Vec<usize>,
    bits: Vec<Vec<u32>>,
    #[serde(default)]
    webui_bits: Vec<Vec<u32>>,
}

fn ulp_diff(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

/// Runs each case and returns (max ulp difference, number of values).
fn check_rng(cases: &[RngCase], make: &dyn Fn(u64) -> Box<dyn Rng>) -> (u32, usize) {
    let (mut worst, mut count) = (0, 0);
    for c in cases {
        let mut r = make(c.seed);
        for (n, want) in c.sizes.iter().zip(&c.bits) {
            let got = r.randn(*n);
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                worst = worst.max(ulp_diff(*g, f32::from_bits(*w)));
                count += 1;
            }
        }
    }
    (worst, count)
}

fn rng_cases(kind: &str) -> Vec<RngCase> {
    serde_json::from_value(fixture("rng.json")[kind].clone()).expect("rng cases")
}

#[test]
fn rng_cpu_matches_torch_randn_bitwise() {
    let (worst, count) = check_rng(&rng_cases("cpu"), &|s| Box::new(TorchCpuRng::new(s)));
    assert!(count > 5000);
    assert_eq!(worst, 0, "max ulp vs torch.randn over {count} values");
}

#[test]
fn rng_cuda_matches_sdcpp_philox() {
    let cases = rng_cases("cuda");
    let (worst, count) = check_rng(&cases, &|s| Box::new(PhiloxRng::new(s)));
    assert!(count > 1000);
    assert_eq!(
        worst, 0,
        "max ulp vs f32 philox reference over {count} values"
    );
    // And within a few ulp (abs 1e-5) of the webui's f64 transform.
    for c in &cases {
        let mut r = PhiloxRng::new(c.seed);
        for (n, want) in c.sizes.iter().zip(&c.webui_bits) {
            for (g, w) in r.randn(*n).iter().zip(want) {
                let w = f32::from_bits(*w);
                assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs webui {w}");
            }
        }
    }
}

#[test]
fn rng_std_default_matches_libstdcxx() {
    let (worst, count) = check_rng(&rng_cases("std_default"), &|s| {
        Box::new(StdDefaultRng::new(s))
    });
    assert!(count > 500);
    assert_eq!(worst, 0, "max ulp vs libstdc++ over {count} values");
}

// ------------------------------------------------------------------ schedules

use sd_cli::sampling::schedules::FluxScheduleParams;
use sd_cli::sampling::{get_sigmas, AysFamily, ModelSchedule, ScheduleKind, ScheduleOptions};

#[derive(Deserialize)]
struct ScheduleCase {
    schedule: String,
    model: String,
    steps: usize,
    sigmas: Vec<f64>,
    #[serde(default)]
    image_seq_len: u32,
}

#[test]
fn schedules_match_reference_formulas() {
    let cases: Vec<ScheduleCase> = serde_json::from_value(fixture("schedules.json")).unwrap();
    let mut worst: Vec<(String, f64)> = vec![];
    for c in &cases {
        let kind: ScheduleKind = c.schedule.parse().unwrap();
        let model = match c.model.as_str() {
            "flow3" => ModelSchedule::Flow { shift: 3.0 },
            _ => ModelSchedule::sd_discrete(),
        };
        let mut opts = ScheduleOptions {
            image_seq_len: c.image_seq_len,
            ..Default::default()
        };
        if c.model == "qwen21" {
            opts.flux = FluxScheduleParams::QWEN_IMAGE_2_1;
        }
        if c.model == "sd1" {
            opts.ays = Some(AysFamily::Sd1);
        }
        let got = get_sigmas(kind, c.steps, &model, &opts).unwrap();
        let tag = format!("{} {} n={}", c.schedule, c.model, c.steps);
        assert_eq!(
            got.len(),
            c.sigmas.len(),
            "{tag}: {got:?} vs {:?}",
            c.sigmas
        );
        let mut rel = 0.0f64;
        for (g, w) in got.iter().zip(&c.sigmas) {
            let e = (f64::from(*g) - w).abs() / w.abs().max(1e-3);
            rel = rel.max(e);
        }
        // f32 arithmetic vs f64 reference; karras amplifies by rho = 7, and ays
        // keeps upstream's f32-accumulated grid; bong_tangent divides by a small range.
        let tol = match c.schedule.as_str() {
            "karras" | "ays" | "bong_tangent" => 3e-6,
            _ => 1e-6,
        };
        assert!(
            rel <= tol,
            "{tag}: rel err {rel:e}\n got {got:?}\nwant {:?}",
            c.sigmas
        );
        worst.push((tag, rel));
    }
    assert!(cases.len() > 100);
    worst.sort_by(|a, b| b.1.total_cmp(&a.1));
    eprintln!("{} schedule cases; worst: {:?}", cases.len(), &worst[..3]);
}

#[test]
fn schedule_errors_are_clear() {
    let e = get_sigmas(
        ScheduleKind::Ays,
        10,
        &ModelSchedule::sd_discrete(),
        &ScheduleOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("ays"), "{e}");
    let e = "foo".parse::<ScheduleKind>().unwrap_err().to_string();
    assert!(e.contains("'foo'") && e.contains("karras"), "{e}");
}

// ------------------------------------------------------------------- samplers

use sd_cli::sampling::{sample, CfgPpOutput, Denoiser, SamplerKind, SamplerOptions, SamplingError};

/// The analytic model of the fixture script (f32 here, f64 there).
struct Analytic;

fn analytic(x: &[f32], s: f32) -> Vec<f32> {
    x.iter()
        .map(|v| 0.9 * v.tanh() / (1.0 + s * s) + 0.05 * v * s / (1.0 + s))
        .collect()
}

impl Denoiser for Analytic {
    fn denoise(&mut self, x: &[f32], sigma: f32, _step: usize) -> Result<Vec<f32>, SamplingError> {
        Ok(analytic(x, sigma))
    }

    fn denoise_cfg_pp(
        &mut self,
        x: &[f32],
        sigma: f32,
        _step: usize,
    ) -> Result<CfgPpOutput, SamplingError> {
        Ok(CfgPpOutput {
            denoised: analytic(x, sigma),
            uncond_denoised: x
                .iter()
                .map(|v| 0.8 * v.tanh() / (1.0 + sigma * sigma))
                .collect(),
        })
    }
}

/// Replays the fixture's recorded noise in order.
struct ReplayRng {
    noise: Vec<f32>,
    pos: usize,
}

impl Rng for ReplayRng {
    fn manual_seed(&mut self, _seed: u64) {
        self.pos = 0;
    }

    fn randn(&mut self, n: usize) -> Vec<f32> {
        let out = self.noise[self.pos..self.pos + n].to_vec();
        self.pos += n;
        out
    }
}

#[derive(Deserialize)]
struct SamplerCase {
    sampler: String,
    flow: bool,
    eta: f32,
    sigmas: Vec<f32>,
    x: Vec<f32>,
    out: Vec<f64>,
}

/// Runs every case of a sampler fixture file; returns (kinds seen, cases, worst).
fn check_sampler_fixture(
    file: &str,
    noise: &[f32],
    seen: &mut std::collections::HashSet<SamplerKind>,
) -> (usize, (String, f64)) {
    let fx = fixture(file);
    let cases: Vec<SamplerCase> = serde_json::from_value(fx["cases"].clone()).unwrap();
    let mut worst = (String::new(), 0.0f64);
    for c in &cases {
        let kind: SamplerKind = c.sampler.parse().unwrap();
        seen.insert(kind);
        let mut opts = SamplerOptions::new(kind, c.flow);
        opts.eta = c.eta;
        let mut rng = ReplayRng {
            noise: noise.to_vec(),
            pos: 0,
        };
        let got = sample(kind, &mut Analytic, c.x.clone(), &c.sigmas, &mut rng, &opts).unwrap();
        let tag = format!(
            "{file}: {} flow={} eta={} n={}",
            c.sampler,
            c.flow,
            c.eta,
            c.sigmas.len() - 1
        );
        assert_eq!(got.len(), c.out.len(), "{tag}");
        let err = got
            .iter()
            .zip(&c.out)
            .map(|(g, w)| (f64::from(*g) - w).abs() / w.abs().max(1.0))
            .fold(0.0, f64::max);
        // f32 here vs f64 in the reference (relative to max(|ref|, 1)).
        assert!(
            err <= 1e-5,
            "{tag}: err {err:e}\n got {got:?}\nwant {:?}",
            c.out
        );
        if err > worst.1 {
            worst = (tag, err);
        }
    }
    (cases.len(), worst)
}

#[test]
fn samplers_match_reference_loops() {
    let noise: Vec<f32> =
        serde_json::from_value(fixture("samplers.json")["noise"].clone()).unwrap();
    let mut seen = std::collections::HashSet::new();
    for file in ["samplers.json", "samplers_more.json"] {
        let (n, worst) = check_sampler_fixture(file, &noise, &mut seen);
        eprintln!("{file}: {n} sampler cases, worst {worst:?}");
    }
    // Every sampler has reference cases.
    assert_eq!(seen.len(), SamplerKind::ALL.len());
}

#[test]
fn bt_single_step_returns_input_like_upstream() {
    // Upstream's dpm++2m_sde_bt returns the latent untouched when the schedule has
    // fewer than two distinct positive sigmas (no model call).
    struct Fail;
    impl Denoiser for Fail {
        fn denoise(&mut self, _x: &[f32], _s: f32, _t: usize) -> Result<Vec<f32>, SamplingError> {
            Err(SamplingError::Cancelled)
        }
    }
    let mut rng = StdDefaultRng::new(1);
    let kind = SamplerKind::Dpmpp2mSdeBt;
    let x = vec![0.5, -1.0, 2.0];
    let opts = SamplerOptions::new(kind, false);
    let out = sample(kind, &mut Fail, x.clone(), &[3.0, 0.0], &mut rng, &opts).unwrap();
    assert_eq!(out, x);
    assert!(sample(kind, &mut Fail, x, &[3.0, 1.0, 0.0], &mut rng, &opts).is_err());
}

#[test]
fn cfg_pp_without_uncond_is_an_error() {
    struct Plain;
    impl Denoiser for Plain {
        fn denoise(&mut self, x: &[f32], _s: f32, _t: usize) -> Result<Vec<f32>, SamplingError> {
            Ok(x.to_vec())
        }
    }
    let mut rng = ReplayRng {
        noise: vec![0.0; 16],
        pos: 0,
    };
    let kind = SamplerKind::EulerCfgPp;
    let err = sample(
        kind,
        &mut Plain,
        vec![0.0; 4],
        &[1.0, 0.0],
        &mut rng,
        &SamplerOptions::new(kind, false),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("euler_cfg_pp"), "{err}");
}

// ------------------------------------------------- --extra-sample-args / --sigmas

use sd_cli::sampling::{parse_extra_sample_args, parse_sigmas_arg, SamplingPlan};

#[derive(Deserialize)]
struct ScheduleArgsCase {
    schedule: String,
    model: String,
    steps: usize,
    image_seq_len: u32,
    args: Vec<(String, String)>,
    sigmas: Vec<f64>,
}

#[test]
fn schedule_extra_args_match_reference() {
    let cases: Vec<ScheduleArgsCase> =
        serde_json::from_value(fixture("schedules_args.json")).unwrap();
    let mut worst = 0.0f64;
    for c in &cases {
        let parsed = parse_extra_sample_args(&c.args).unwrap();
        assert!(parsed.unknown.is_empty(), "{:?}", parsed.unknown);
        let mut opts = ScheduleOptions {
            image_seq_len: c.image_seq_len,
            ..Default::default()
        };
        parsed.schedule.apply_to(&mut opts);
        // The schedule-only entry point must agree.
        let mut opts2 = ScheduleOptions {
            image_seq_len: c.image_seq_len,
            ..Default::default()
        };
        assert!(opts2.apply_extra_args(&c.args).unwrap().is_empty());
        assert_eq!(opts, opts2);
        let model = match c.model.as_str() {
            "sd" => ModelSchedule::sd_discrete(),
            _ => ModelSchedule::Flow { shift: 3.0 },
        };
        let kind: ScheduleKind = c.schedule.parse().unwrap();
        let got = get_sigmas(kind, c.steps, &model, &opts).unwrap();
        let tag = format!("{} n={} {:?}", c.schedule, c.steps, c.args);
        assert_eq!(
            got.len(),
            c.sigmas.len(),
            "{tag}: {got:?} vs {:?}",
            c.sigmas
        );
        for (g, w) in got.iter().zip(&c.sigmas) {
            let e = (f64::from(*g) - w).abs() / w.abs().max(1e-3);
            // ltx2's terminal stretch `1 - (1 - s) / k` loses ~1 f32 ulp of 1.
            let tol = if c.schedule == "ltx2" { 3e-6 } else { 1e-6 };
            assert!(
                e <= tol,
                "{tag}: rel err {e:e}\n got {got:?}\nwant {:?}",
                c.sigmas
            );
            worst = worst.max(e);
        }
        // And the overrides really change the schedule (else the case tests nothing).
        let plain = ScheduleOptions {
            image_seq_len: c.image_seq_len,
            ..Default::default()
        };
        let default = get_sigmas(kind, c.steps, &model, &plain).unwrap();
        if c.steps > 1 {
            assert_ne!(default, got, "{tag}: overrides had no effect");
        }
    }
    assert!(cases.len() >= 30);
    eprintln!(
        "{} extra-args schedule cases, worst rel err {worst:e}",
        cases.len()
    );
}

#[test]
fn plan_runs_with_schedule_or_custom_sigmas() {
    let model = ModelSchedule::sd_discrete();
    let mut plan = SamplingPlan::new(SamplerKind::Euler, ScheduleKind::Karras, 6);
    let args = sd_cli::sampling::ExtraSampleArgs::parse_str("gamma=1.5").unwrap();
    plan.apply_extra_args(&args);
    assert_eq!(plan.sampler_args.ge_gamma, 1.5);
    let sigmas = plan.sigmas(&model).unwrap();
    assert_eq!(sigmas.len(), 7);
    assert_eq!(plan.eta(), 0.0);
    let x: Vec<f32> = (0..8).map(|i| (i as f32 - 3.5) * sigmas[0] * 0.3).collect();
    let mut rng = StdDefaultRng::new(7);
    let got = plan
        .run(&model, &mut Analytic, x.clone(), &sigmas, &mut rng)
        .unwrap();
    let opts = SamplerOptions::new(SamplerKind::Euler, false);
    let want = sample(
        SamplerKind::Euler,
        &mut Analytic,
        x.clone(),
        &sigmas,
        &mut rng,
        &opts,
    )
    .unwrap();
    assert_eq!(got, want);

    // --sigmas replaces the schedule and the step count.
    plan.custom_sigmas = Some(parse_sigmas_arg("[14.6, 3.0, 0.7, 0]").unwrap());
    assert_eq!(plan.sigmas(&model).unwrap(), vec![14.6, 3.0, 0.7, 0.0]);
    plan.custom_sigmas = Some(vec![1.0, 2.0]);
    assert!(plan.sigmas(&model).is_err());
    plan.custom_sigmas = None;
    plan.steps = 0;
    let e = plan.sigmas(&model).unwrap_err().to_string();
    assert!(e.contains("--steps"), "{e}");
}
