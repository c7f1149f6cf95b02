//! The CFG++ samplers (`euler_cfg_pp`, `euler_a_cfg_pp`) on PixArt and Qwen Image 2.1 with CFG,
//! against a transcription of upstream's samplers over the diffusers pipelines
//! (tests/reference/cfg_pp_fixtures.py): the unconditional estimate they renoise along comes
//! from the shared guided denoiser. Same components, prompts, seed and steps as the pipeline
//! fixtures, CFG 1.5. Tolerance: final latent 1e-3 × scale, as the pipeline tests.

mod common;

use std::path::PathBuf;

use common::*;
use sd_cli::pipeline::components::{ComponentFiles, ComponentId, Needs};
use sd_cli::pipeline::pixart::{PixArtPipeline, PixArtRequest};
use sd_cli::pipeline::qwen_image_2_1::{schedule_options, QwenImage21Request, DEFAULT_SCHEDULE};
use sd_cli::pipeline::{LoadContext, ModelArgs};
use sd_cli::rng::RngKind;
use sd_cli::runner::MemoryOptions;
use sd_cli::sampling::{Guidance, SamplerKind, SamplingPlan, ScheduleKind};

const CFG: f32 = 1.5;
const SAMPLERS: [(&str, SamplerKind); 2] = [
    ("euler_cfg_pp", SamplerKind::EulerCfgPp),
    ("euler_a_cfg_pp", SamplerKind::EulerACfgPp),
];

fn t5_tokenizer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tokenizers/t5-v1_1.tokenizer.json")
}

#[test]
fn pixart_cfg_pp_matches_the_transcription() {
    let reference = open_fixture("cfg_pp/pixart.safetensors");
    let d = fixture_path("pixart_pipeline");
    let files = ComponentFiles::new("PixArt-α/Σ")
        .with(
            ComponentId::Diffusion,
            component(ComponentId::Diffusion, &d.join("transformer")),
        )
        .with(
            ComponentId::T5,
            component(ComponentId::T5, &d.join("text_encoder")),
        )
        .with(
            ComponentId::Vae,
            component(ComponentId::Vae, &d.join("vae")),
        );
    let backends = common::device::test_plan(2);
    let tok = t5_tokenizer();
    let pipe = PixArtPipeline::load(
        &files,
        &LoadContext {
            backends: &backends,
            memory: MemoryOptions::default(),
            wtype: None,
            flash_attn: false,
            model_args: &ModelArgs::default(),
            needs: Needs::default(),
            t5_tokenizer: Some(&tok),
            prediction: None,
            clip_skip: None,
            embd_dir: None,
            lora: None,
            taesd_preview_only: false,
            flow_shift: None,
        },
    )
    .unwrap();
    for (name, sampler) in SAMPLERS {
        let plan = SamplingPlan::new(sampler, ScheduleKind::Discrete, 4);
        let mut noise = RngKind::Cpu.create(42);
        let mut srng = RngKind::Cpu.create(42);
        let z = pipe
            .sample(PixArtRequest {
                prompt: "A Lovely cat, holding a sign!  ",
                negative_prompt: "blurry",
                width: 24,
                height: 16,
                guidance: Guidance::cfg(CFG),
                plan: &plan,
                noise_rng: noise.as_mut(),
                sampler_rng: srng.as_mut(),
                vae_tiling: None,
                init: None,
                preview: None,
                mask: None,
            })
            .unwrap();
        assert_close(
            &format!("pixart {name}"),
            &z,
            &tensor(&reference, name),
            1e-3,
        );
    }
}

#[test]
fn qwen_image_2_1_cfg_pp_matches_the_transcription() {
    let reference = open_fixture("cfg_pp/qwen.safetensors");
    let files = qwen_store(&fixture_path("qwen_image_pipeline"), false);
    let backends = common::device::test_plan(2);
    let parts = QwenParts {
        encoder: false,
        vision: false,
    };
    let pipe = qwen_pipeline(&files, &backends, true, parts);
    for (name, sampler) in SAMPLERS {
        let mut plan = SamplingPlan::new(sampler, DEFAULT_SCHEDULE, 4);
        plan.schedule_opts = schedule_options();
        let mut noise = RngKind::Cpu.create(42);
        let mut srng = RngKind::Cpu.create(42);
        let x = pipe
            .sample(QwenImage21Request {
                prompt: "a lovely cat holding a sign says 'qwen2.1.cpp'",
                negative_prompt: "blurry, low quality",
                width: 96,
                height: 64,
                guidance: Guidance::cfg(CFG),
                plan: &plan,
                noise_rng: noise.as_mut(),
                sampler_rng: srng.as_mut(),
                vae_tiling: None,
                keep_prefix_cache: false,
                init: None,
                edit: None,
                preview: None,
                mask: None,
            })
            .unwrap();
        assert_close(&format!("qwen {name}"), &x, &tensor(&reference, name), 1e-3);
    }
}
