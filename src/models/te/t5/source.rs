//! A weight source that serves T5 weights under transformers' names whatever the file used.

use std::collections::HashMap;

use crate::runner::{SourceTensor, StoreSource, WeightSource};
use crate::weights::names::t5_llamacpp_to_hf;
use crate::weights::TensorStore;

/// T5 weights from a [`TensorStore`] under `prefix`, looked up by HF transformers names.
///
/// HF / diffusers `text_encoder/` files and ComfyUI / sd.cpp single files (whose
/// `text_encoders.t5xxl.transformer.` prefix the store already normalises) are served as is;
/// llama.cpp GGUF names (`enc.blk.N.attn_q.weight`, `token_embd.weight`, ...) are renamed to
/// their HF equivalents with [`t5_llamacpp_to_hf`].
pub struct T5Source<'s> {
    inner: StoreSource<'s>,
    /// HF name → name in the store (without `prefix`), for renamed tensors only.
    renamed: HashMap<String, String>,
}

impl<'s> T5Source<'s> {
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        let renamed = store
            .with_prefix(prefix)
            .filter_map(|t| {
                let local = &t.name[prefix.len()..];
                t5_llamacpp_to_hf(local).map(|hf| (hf, local.to_string()))
            })
            .collect();
        Self {
            inner: StoreSource::new(store, prefix),
            renamed,
        }
    }

    /// Whether any tensor was found under llama.cpp GGUF names.
    pub fn is_llamacpp(&self) -> bool {
        !self.renamed.is_empty()
    }

    fn resolve<'a>(&'a self, name: &'a str) -> &'a str {
        if self.inner.contains(name) {
            name
        } else {
            self.renamed.get(name).map_or(name, String::as_str)
        }
    }
}

impl WeightSource for T5Source<'_> {
    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        self.inner.tensor(self.resolve(name))
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(self.resolve(name))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
