//! Parity of the Qwen3-VL text encoder with condition images against diffusers'
//! `QwenImage21Pipeline.encode_prompt(prompt, image=[...])`.
//! Fixtures: tests/reference/qwen3_te_mm_fixtures.py → tests/fixtures/qwen3_te_mm/ (the tiny
//! language model of tests/fixtures/qwen3_te/text_encoder, interleaved mRoPE sections [4, 2, 2],
//! with a random depth-2 vision tower whose deepstack features feed decoder layers 0 and 1; the
//! tower's captured outputs are fed to our encoder).
//!
//! Tolerance: max abs error ≤ 1e-4 · max(1, max |reference|) in f32 (5e-3 with flash
//! attention, whose K/V are f16); ids, positions and the image-pad mask exactly.

mod common;

use common::*;
use sd_cli::models::te::qwen3::{
    qwen3_hparams, qwen3_mrope_section, rope_positions, Qwen3Config, Qwen3MmInput, Qwen3Source,
    Qwen3TextModel, VisionEmbeds,
};
use sd_cli::pipeline::qwen_image_2_1::template::{
    edit_prompt_ids as qwen_image_21_edit_prompt_ids, encode_edit_prompt,
    IMAGE_PAD as QWEN_IMAGE_PAD,
};
use sd_cli::runner::{RunOptions, Runner, WeightLoader};
use sd_cli::tensor::HostTensor;
use sd_cli::tokenizers::{load_qwen_tokenizer, BpeTokenizer};
use sd_cli::weights::TensorStore;

const TOL: f32 = 1e-4;
const CASES: [&str; 4] = ["one", "one_empty", "two", "two_empty"];

fn prompt(case: &str) -> &'static str {
    match case {
        "one" => "make the cat wear a red hat",
        "two" => "put the dog from picture 2 next to the cat",
        _ => "",
    }
}

fn cases() -> TensorStore {
    open_fixture("qwen3_te_mm/cases.safetensors")
}

fn tokenizer() -> BpeTokenizer {
    load_qwen_tokenizer(&fixture_path("qwen_tokenizer/tiny").join("tokenizer.json"))
        .expect("tiny tokenizer")
}

fn ints(store: &TensorStore, name: &str) -> Vec<i32> {
    tensor(store, name).data.iter().map(|&v| v as i32).collect()
}

fn grids(store: &TensorStore, case: &str) -> Vec<(usize, usize)> {
    ints(store, &format!("{case}.grids"))
        .chunks(2)
        .map(|g| (g[0] as usize, g[1] as usize))
        .collect()
}

/// A [rows, hidden] reference as ggml [hidden, rows].
fn rows(t: &HostTensor) -> HostTensor {
    HostTensor::new([t.ne[0], t.ne[1], 1, 1], t.data.clone()).unwrap()
}

/// Rows `[start, start + count)` of a ggml [hidden, rows] tensor.
fn slice(t: &HostTensor, start: usize, count: usize) -> HostTensor {
    let h = t.ne[0];
    HostTensor::new(
        [h, count, 1, 1],
        t.data[start * h..(start + count) * h].to_vec(),
    )
    .unwrap()
}

/// The captured vision outputs of a case, split per image.
fn images(store: &TensorStore, case: &str) -> Vec<VisionEmbeds> {
    let vision = rows(&tensor(store, &format!("{case}.vision")));
    let ds = tensor(store, &format!("{case}.deepstack"));
    // [levels, n_vis, hidden] → ggml [hidden, n_vis, levels]
    let (h, n_vis, levels) = (ds.ne[0], ds.ne[1], ds.ne[2]);
    let levels: Vec<HostTensor> = (0..levels)
        .map(|l| {
            HostTensor::new(
                [h, n_vis, 1, 1],
                ds.data[l * h * n_vis..(l + 1) * h * n_vis].to_vec(),
            )
            .unwrap()
        })
        .collect();
    let mut start = 0;
    grids(store, case)
        .into_iter()
        .map(|(gh, gw)| {
            let count = gh * gw;
            let v = VisionEmbeds {
                embeds: slice(&vision, start, count),
                deepstack: levels.iter().map(|l| slice(l, start, count)).collect(),
                grid_h: gh,
                grid_w: gw,
            };
            start += count;
            v
        })
        .collect()
}

fn load() -> (Qwen3TextModel, Runner) {
    load_with(false)
}

fn load_with(flash_attn: bool) -> (Qwen3TextModel, Runner) {
    let store = open_fixture("qwen3_te/text_encoder");
    let backend = cpu();
    let source = Qwen3Source::new(&store, "");
    let loader = WeightLoader::new(&source, None);
    let (theta, eps) = qwen3_hparams(&store);
    let config = Qwen3Config::detect(&loader.root(""), Some(theta), Some(eps)).unwrap();
    let section = qwen3_mrope_section(&store).expect("config.json has mrope_section");
    assert_eq!(section, [4, 2, 2]);
    let model = Qwen3TextModel::new(&loader.root(""), config)
        .unwrap()
        .with_mrope_section(section);
    let weights = loader.finish(&backend, "qwen3").unwrap();
    let runner = Runner::new(
        "qwen3",
        backend,
        Some(weights),
        RunOptions {
            flash_attn,
            ..RunOptions::default()
        },
    );
    (model, runner)
}

fn pad_id(tok: &BpeTokenizer) -> i32 {
    tok.token_to_id(QWEN_IMAGE_PAD).unwrap() as i32
}

#[test]
fn edit_template_ids_match_processor() {
    let tok = tokenizer();
    let c = cases();
    for case in CASES {
        let pads: Vec<usize> = grids(&c, case).iter().map(|(h, w)| h * w).collect();
        let (ids, drop_idx) = qwen_image_21_edit_prompt_ids(&tok, prompt(case), &pads);
        let ids: Vec<i32> = ids.into_iter().map(|i| i as i32).collect();
        assert_eq!(ids, ints(&c, &format!("{case}.ids")), "{case}");
        assert_eq!(drop_idx as i32, ints(&c, &format!("{case}.drop"))[0]);
    }
}

#[test]
fn rope_positions_match_get_rope_index() {
    let tok = tokenizer();
    let c = cases();
    for case in CASES {
        let ids = ints(&c, &format!("{case}.ids"));
        let pos = rope_positions(&ids, pad_id(&tok), &grids(&c, case)).unwrap();
        let want = ints(&c, &format!("{case}.pos"));
        let n = ids.len();
        for axis in 0..3 {
            assert_eq!(
                pos[axis],
                want[axis * n..(axis + 1) * n],
                "{case} axis {axis}"
            );
        }
    }
}

#[test]
fn edit_embeds_match_pipeline() {
    let tok = tokenizer();
    let c = cases();
    let (model, runner) = load();
    for case in CASES {
        let (got, mask) =
            encode_edit_prompt(&runner, &model, &tok, prompt(case), &images(&c, case)).unwrap();
        let want_mask: Vec<bool> = tensor(&c, &format!("{case}.pad_mask"))
            .data
            .iter()
            .map(|&v| v != 0.0)
            .collect();
        assert_eq!(mask, want_mask, "{case} image_pad_mask");
        let want = rows(&tensor(&c, &format!("{case}.embeds")));
        assert_close(&format!("edit {case}"), &got, &want, TOL);
    }
}

#[test]
fn flash_attention_within_tolerance() {
    // K/V rounded to f16 (as in qwen3_te_parity.rs).
    let tok = tokenizer();
    let c = cases();
    let (model, runner) = load_with(true);
    let case = "two";
    let (got, _) =
        encode_edit_prompt(&runner, &model, &tok, prompt(case), &images(&c, case)).unwrap();
    let want = rows(&tensor(&c, &format!("{case}.embeds")));
    assert_close("flash attention two", &got, &want, 5e-3);
}

#[test]
fn deepstack_and_mrope_matter() {
    // The same inputs without deepstack, and with the text path's 1-D positions, must differ
    // from the reference: the test can fail.
    let tok = tokenizer();
    let c = cases();
    let (model, runner) = load();
    let case = "two";
    let imgs = images(&c, case);
    let ids = ints(&c, &format!("{case}.ids"));
    let drop = ints(&c, &format!("{case}.drop"))[0] as usize;
    let want = rows(&tensor(&c, &format!("{case}.embeds")));
    let vision: Vec<HostTensor> = imgs.iter().map(|v| v.embeds.clone()).collect();
    let run = |input: &Qwen3MmInput| {
        let full = runner
            .compute(|g| vec![model.forward_multimodal(g, input, None, false)])
            .unwrap()
            .pop()
            .unwrap();
        slice(&full, drop, full.ne[1] - drop)
    };
    let pos = rope_positions(&ids, pad_id(&tok), &grids(&c, case)).unwrap();
    let no_ds = Qwen3MmInput::new(ids.clone(), pad_id(&tok), pos, &vision, vec![], 32).unwrap();
    let linear: Vec<i32> = (0..ids.len() as i32).collect();
    let full = Qwen3MmInput::from_images(ids.clone(), pad_id(&tok), &imgs, 32).unwrap();
    let flat = Qwen3MmInput::new(
        ids.clone(),
        pad_id(&tok),
        [linear.clone(), linear.clone(), linear],
        &vision,
        (0..2)
            .map(|l| {
                let d: Vec<f32> = imgs
                    .iter()
                    .flat_map(|v| v.deepstack[l].data.clone())
                    .collect();
                HostTensor::new([32, d.len() / 32, 1, 1], d).unwrap()
            })
            .collect(),
        32,
    )
    .unwrap();
    let scale = want.data.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let err = |t: &HostTensor| max_abs_diff(t, &want) / scale;
    assert!(err(&run(&full)) <= common::device::tolerance(TOL));
    assert!(err(&run(&no_ds)) > 1e-2, "deepstack has no effect");
    assert!(err(&run(&flat)) > 1e-3, "3-D positions have no effect");
}

#[test]
fn mismatched_vision_inputs_are_errors() {
    let tok = tokenizer();
    let c = cases();
    let (model, runner) = load();
    let mut imgs = images(&c, "two");
    // Wrong grid for the embeddings.
    imgs[1].grid_w = 3;
    let err = encode_edit_prompt(&runner, &model, &tok, "x", &imgs)
        .unwrap_err()
        .to_string();
    assert!(err.contains("image 1"), "{err}");
    // Deepstack levels differ between images.
    let mut imgs = images(&c, "two");
    imgs[0].deepstack.pop();
    assert!(encode_edit_prompt(&runner, &model, &tok, "x", &imgs).is_err());
    // Wrong hidden size.
    let mut imgs = images(&c, "one");
    imgs[0].embeds = HostTensor::zeros([16, 6, 1, 1]);
    imgs[0].deepstack.clear();
    assert!(encode_edit_prompt(&runner, &model, &tok, "x", &imgs).is_err());
    // Fewer pads than vision rows.
    let ids = ints(&c, "one.ids");
    let short: Vec<i32> = ids.iter().copied().filter(|&i| i != pad_id(&tok)).collect();
    assert!(rope_positions(&short, pad_id(&tok), &[(2, 3)]).is_err());
    assert!(Qwen3MmInput::from_images(short, pad_id(&tok), &images(&c, "one"), 32).is_err());
}

#[test]
fn mrope_section_from_gguf_metadata() {
    use sd_cli::dtype::DType;
    use sd_cli::weights::{GgufType, GgufValue, GgufWriter};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sections.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", GgufValue::String("qwen3vl".into()))
        .unwrap();
    w.add_kv(
        "qwen3vl.rope.dimension_sections",
        GgufValue::Array(
            GgufType::I32,
            [24, 20, 20, 0].into_iter().map(GgufValue::I32).collect(),
        ),
    )
    .unwrap();
    w.add_tensor("token_embd.weight", DType::F32, &[4, 2])
        .unwrap();
    w.write(&path, &[&[0u8; 32][..]]).unwrap();
    let store = TensorStore::open(&path).unwrap();
    assert_eq!(qwen3_mrope_section(&store), Some([24, 20, 20]));
    assert_eq!(qwen3_mrope_section(&TensorStore::new()), None);
}
