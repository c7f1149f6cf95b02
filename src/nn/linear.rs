use crate::ggml::{Tensor, Then};
use crate::runner::{GraphCtx, Param, RunnerError, Storage, WeightBuilder, WeightRole};

/// `y = x W^T + b` (PyTorch `nn.Linear`); the weight is stored [in, out] in ggml order.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub weight: Param,
    pub bias: Option<Param>,
    pub in_features: usize,
    pub out_features: usize,
}

impl Linear {
    /// Declares `<path>.weight` and, when `bias`, `<path>.bias`.
    pub fn new(
        wb: &WeightBuilder<'_, '_>,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Self, RunnerError> {
        let ne = [in_features, out_features, 1, 1];
        let weight = wb.get_as("weight", ne, Storage::Any, WeightRole::Linear)?;
        let bias = if bias {
            Some(wb.get("bias", [out_features, 1, 1, 1], Storage::F32)?)
        } else {
            None
        };
        Ok(Self {
            weight,
            bias,
            in_features,
            out_features,
        })
    }

    /// Like [`Linear::new`] but the bias is taken when the file has it.
    pub fn new_optional_bias(
        wb: &WeightBuilder<'_, '_>,
        in_features: usize,
        out_features: usize,
    ) -> Result<Self, RunnerError> {
        Self::new(wb, in_features, out_features, wb.contains("bias"))
    }

    /// x: [in, ...] → [out, ...] (plus the weight's run-time adapter, if any).
    pub fn forward<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        let y = g.linear(g.param(self.weight), x, self.bias.map(|b| g.param(b)));
        g.adapt_linear(self.weight, x, y)
    }

    /// `gelu(forward(x), approximate = "tanh")`, in one pass over the output where the
    /// blocked CPU kernels take it.
    pub fn forward_gelu_tanh<'g>(&self, g: &'g GraphCtx<'g>, x: Tensor<'g>) -> Tensor<'g> {
        g.linear_then(self.weight, x, self.bias, Then::GeluTanh)
            .unwrap_or_else(|| super::gelu_tanh(g, self.forward(g, x)))
    }

    /// `residual + gate ⊙ forward(x)` (without a gate `residual + forward(x)`): a block's
    /// output projection onto its residual stream, in one pass over the output where the
    /// blocked CPU kernels take it. `gate` broadcasts over the tokens (adaLN's [out, 1, B]).
    pub fn forward_onto<'g>(
        &self,
        g: &'g GraphCtx<'g>,
        x: Tensor<'g>,
        residual: Tensor<'g>,
        gate: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        if let Some(y) = g.linear_then(self.weight, x, self.bias, Then::Residual(residual, gate)) {
            return y;
        }
        let y = self.forward(g, x);
        g.add(residual, gate.map_or(y, |gate| g.mul(y, gate)))
    }
}
