use crate::ggml::Tensor;
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
}
