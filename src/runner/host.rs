//! Host-side tensors: what goes into and comes out of a runner call.

use crate::ggml::Ne;

/// An f32 tensor in host memory, shape in ggml order (`ne[0]` innermost).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub ne: Ne,
    pub data: Vec<f32>,
}

impl HostTensor {
    /// A tensor of `ne` holding `data`; `None` when the element count does not match.
    pub fn new(ne: Ne, data: Vec<f32>) -> Option<Self> {
        (ne.iter().product::<usize>() == data.len()).then_some(Self { ne, data })
    }

    pub fn zeros(ne: Ne) -> Self {
        Self {
            ne,
            data: vec![0.0; ne.iter().product()],
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}
