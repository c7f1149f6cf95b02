//! Parity of the shared nn blocks and the ggml ops they use against PyTorch/diffusers.
//! Fixtures: tests/reference/nn_fixtures.py → tests/fixtures/nn/blocks.safetensors.
//! Tolerance: max abs error ≤ 1e-4 × max(1, |reference|) in f32 (flash attention: 2e-3, f16 K/V).

mod common;

use common::*;
use sd_cli::nn::{self, AttentionMask, Conv2d, GroupNorm, LayerNorm, Linear, RmsNorm, RopeLayout};
use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

const TOL: f32 = 1e-4;

fn store() -> TensorStore {
    open_fixture("nn/blocks.safetensors")
}

fn check_linear(case: &str, bias: bool) {
    let s = store();
    let x = tensor(&s, &format!("{case}.x"));
    let y = tensor(&s, &format!("{case}.y"));
    let (in_f, out_f) = (x.ne[0], y.ne[0]);
    for blocked in [true, false] {
        let (lin, w, be) = load_block(&s, &format!("{case}."), |wb| {
            Linear::new(wb, in_f, out_f, bias).unwrap()
        });
        let r = runner_with_kernels(Some(w), be, false, blocked);
        let got = r
            .compute(|g| vec![lin.forward(g, g.input_f32("x", x.ne, x.data.clone()))])
            .unwrap();
        assert_close(&format!("{case} (blocked {blocked})"), &got[0], &y, TOL);
    }
}

#[test]
fn linear_matches_torch() {
    check_linear("linear", true);
    check_linear("linear_nobias", false);
}

#[test]
fn conv2d_matches_torch() {
    let s = store();
    for (case, k, stride, pad) in [
        ("conv", 3, 1, 1),
        ("conv_s2", 3, 2, 1),
        ("conv_1x1", 1, 1, 0),
    ] {
        let x = tensor(&s, &format!("{case}.x"));
        let y = tensor(&s, &format!("{case}.y"));
        let (ic, oc) = (x.ne[2], y.ne[2]);
        let (conv, w, be) = load_block(&s, &format!("{case}."), |wb| {
            Conv2d::new(wb, ic, oc, k, stride, pad, true).unwrap()
        });
        let r = runner(Some(w), be, false);
        let got = r
            .compute(|g| vec![conv.forward(g, g.input_f32("x", x.ne, x.data.clone()))])
            .unwrap();
        assert_close(case, &got[0], &y, TOL);
    }
}

#[test]
fn norms_match_torch() {
    let s = store();
    let x = tensor(&s, "layernorm.x");
    let y = tensor(&s, "layernorm.y");
    let (ln, w, be) = load_block(&s, "layernorm.", |wb| {
        LayerNorm::new(wb, 32, 1e-6, true).unwrap()
    });
    let got = runner(Some(w), be, false)
        .compute(|g| vec![ln.forward(g, g.input_f32("x", x.ne, x.data.clone()))])
        .unwrap();
    assert_close("layernorm", &got[0], &y, TOL);

    let x = tensor(&s, "layernorm_plain.x");
    let y = tensor(&s, "layernorm_plain.y");
    let got = runner(None, cpu(), false)
        .compute(
            |g| vec![LayerNorm::plain(1e-6).forward(g, g.input_f32("x", x.ne, x.data.clone()))],
        )
        .unwrap();
    assert_close("layernorm_plain", &got[0], &y, TOL);

    let x = tensor(&s, "rmsnorm.x");
    let y = tensor(&s, "rmsnorm.y");
    let (rms, w, be) = load_block(&s, "rmsnorm.", |wb| RmsNorm::new(wb, 48, 1e-6).unwrap());
    let got = runner(Some(w), be, false)
        .compute(|g| vec![rms.forward(g, g.input_f32("x", x.ne, x.data.clone()))])
        .unwrap();
    assert_close("rmsnorm", &got[0], &y, TOL);

    let x = tensor(&s, "groupnorm.x");
    let y = tensor(&s, "groupnorm.y");
    let (gn, w, be) = load_block(&s, "groupnorm.", |wb| {
        GroupNorm::new(wb, 4, 8, 1e-6).unwrap()
    });
    let got = runner(Some(w), be, false)
        .compute(|g| vec![gn.forward(g, g.input_f32("x", x.ne, x.data.clone()))])
        .unwrap();
    assert_close("groupnorm", &got[0], &y, TOL);
}

#[test]
fn activations_match_torch() {
    let s = store();
    let x = tensor(&s, "gelu_tanh.x");
    let got = runner(None, cpu(), false)
        .compute(|g| {
            let t = g.input_f32("x", x.ne, x.data.clone());
            vec![g.gelu(t), g.gelu_erf(t), g.silu(t)]
        })
        .unwrap();
    // ggml's tanh-GELU uses an f16 lookup table on CPU for speed; allow for it.
    assert_close("gelu_tanh", &got[0], &tensor(&s, "gelu_tanh.y"), 1e-3);
    assert_close("gelu_erf", &got[1], &tensor(&s, "gelu_erf.y"), 1e-3);
    assert_close("silu", &got[2], &tensor(&s, "silu.y"), TOL);
}

fn run_attention(s: &TensorStore, case: &str, flash: bool, blocked: bool) -> HostTensor {
    let q = tensor(s, &format!("{case}.q"));
    let k = tensor(s, &format!("{case}.k"));
    let v = tensor(s, &format!("{case}.v"));
    let mask = s
        .get(&format!("{case}.mask"))
        .map(|_| tensor(s, &format!("{case}.mask")));
    let got = runner_with_kernels(None, cpu(), flash, blocked)
        .compute(|g| {
            let qt = g.input_f32("q", q.ne, q.data.clone());
            let kt = g.input_f32("k", k.ne, k.data.clone());
            let vt = g.input_f32("v", v.ne, v.data.clone());
            let m = mask
                .as_ref()
                .map(|m| AttentionMask(g.input_f32("mask", m.ne, m.data.clone())));
            vec![nn::attention(g, qt, kt, vt, 4, m.as_ref())]
        })
        .unwrap();
    got.into_iter().next().unwrap()
}

#[test]
fn attention_matches_torch_sdpa() {
    let s = store();
    for case in ["attn", "attn_mask"] {
        let y = tensor(&s, &format!("{case}.y"));
        for blocked in [true, false] {
            let exact = run_attention(&s, case, false, blocked);
            assert_close(&format!("{case} (blocked {blocked})"), &exact, &y, TOL);
            let flash = run_attention(&s, case, true, blocked);
            assert_close(
                &format!("{case} (flash, blocked {blocked})"),
                &flash,
                &y,
                2e-3,
            );
        }
    }
}

#[test]
fn timestep_embeddings_match_diffusers() {
    let s = store();
    let t = tensor(&s, "tembed_flip.t");
    for (case, dim, flip, shift) in [
        ("tembed_flip", 256, true, 0.0),
        ("tembed_sd", 64, false, 1.0),
    ] {
        let y = tensor(&s, &format!("{case}.y"));
        let data = nn::timestep_embedding(&t.data, dim, flip, shift, 1.0, 10000.0);
        let got = HostTensor::new(y.ne, data).unwrap();
        // Angles reach ~1000 rad; f32 rounding of the angle bounds the agreement.
        assert_close(case, &got, &y, 2e-4);
    }
}

#[test]
fn sincos_2d_matches_diffusers() {
    let s = store();
    for (case, dim, gh, gw, base) in [("sincos2d", 32, 3, 5, 4.0), ("sincos2d_sq", 64, 6, 6, 64.0)]
    {
        let y = tensor(&s, &format!("{case}.y"));
        let got = HostTensor::new(y.ne, nn::sincos_2d_pos_embed(dim, gh, gw, base, 2.0)).unwrap();
        assert_close(case, &got, &y, 1e-5);
    }
}

#[test]
fn rope_matches_diffusers() {
    let s = store();
    for (case, layout) in [
        ("rope_interleaved", RopeLayout::Interleaved),
        ("rope_halves", RopeLayout::Halves),
    ] {
        let x = tensor(&s, &format!("{case}.x")); // ggml [D, N, H, B]
        let y = tensor(&s, &format!("{case}.y"));
        let pos = tensor(&s, &format!("{case}.pos")); // [3, N]
        let positions: Vec<Vec<f32>> = pos.data.chunks(3).map(<[f32]>::to_vec).collect();
        let (cos, sin) = nn::rope_table(&positions, &[4, 6, 6], 10000.0);
        let [d, n, h, b] = x.ne;
        let got = runner(None, cpu(), false)
            .compute(|g| {
                let xt = g.input_f32("x", x.ne, x.data.clone());
                // diffusers keeps heads outside tokens: [D, N, H, B] -> [D, H, N, B]
                let xt = g.permute(xt, [0, 2, 1, 3]);
                let c = g.input_f32("cos", [d / 2, 1, n, 1], cos.clone());
                let sn = g.input_f32("sin", [d / 2, 1, n, 1], sin.clone());
                let out = nn::apply_rope(g, xt, c, sn, layout);
                vec![g.cont(g.permute(out, [0, 2, 1, 3]))]
            })
            .unwrap();
        assert_eq!(got[0].ne, [d, n, h, b]);
        assert_close(case, &got[0], &y, TOL);
    }
}
