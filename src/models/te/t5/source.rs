//! A weight source that serves T5 weights under transformers' names whatever the file used.

use std::collections::HashMap;

use crate::runner::{SourceTensor, StoreSource, WeightSource};
use crate::weights::names::t5_llamacpp_to_hf;
use crate::weights::TensorStore;

use super::names::wan_t5_to_hf;

/// The naming scheme a T5 file uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum T5Layout {
    /// transformers / diffusers / ComfyUI names (`encoder.block.N.layer.0.SelfAttention.q`).
    Transformers,
    /// llama.cpp GGUF names (`enc.blk.N.attn_q`).
    LlamaCpp,
    /// The original Wan checkpoint names (`blocks.N.attn.q`).
    Wan,
}

/// T5 weights from a [`TensorStore`] under `prefix`, looked up by HF transformers names.
///
/// HF / diffusers `text_encoder/` files and ComfyUI / sd.cpp single files (whose
/// `text_encoders.t5xxl.transformer.` prefix the store already normalises) are served as is;
/// llama.cpp GGUF names (`enc.blk.N.attn_q.weight`, `token_embd.weight`, ...) and the original
/// Wan names (`blocks.N.attn.q.weight`, `token_embedding.weight`, ...) are renamed to their HF
/// equivalents.
///
/// ComfyUI's "scaled" fp8 files store `w / s` as F8_E4M3 beside a `<name>.scale_weight`
/// scalar `s`; such weights are served already multiplied by `s`.
pub struct T5Source<'s> {
    inner: StoreSource<'s>,
    /// HF name → name in the store (without `prefix`), for renamed tensors only.
    renamed: HashMap<String, String>,
    layout: T5Layout,
}

impl<'s> T5Source<'s> {
    pub fn new(store: &'s TensorStore, prefix: &str) -> Self {
        let mut layout = T5Layout::Transformers;
        let mut renamed = HashMap::new();
        for t in store.with_prefix(prefix) {
            let local = &t.name[prefix.len()..];
            let mapped = match t5_llamacpp_to_hf(local) {
                Some(hf) => Some((hf, T5Layout::LlamaCpp)),
                None => wan_t5_to_hf(local).map(|hf| (hf, T5Layout::Wan)),
            };
            if let Some((hf, from)) = mapped {
                layout = from;
                renamed.insert(hf, local.to_string());
            }
        }
        Self {
            inner: StoreSource::new(store, prefix),
            renamed,
            layout,
        }
    }

    /// Whether any tensor was found under llama.cpp GGUF names.
    pub fn is_llamacpp(&self) -> bool {
        self.layout == T5Layout::LlamaCpp
    }

    /// The naming scheme of the file (of the last renamed tensor, for a mixed store).
    pub fn layout(&self) -> T5Layout {
        self.layout
    }

    fn resolve<'a>(&'a self, name: &'a str) -> &'a str {
        if self.inner.contains(name) {
            name
        } else {
            self.renamed.get(name).map_or(name, String::as_str)
        }
    }
}

/// `t` multiplied by the scalar tensor `scale` on conversion. The result no longer has a ggml
/// layout, so the loader converts it (to the file's float width or `--type`).
fn scaled<'a>(t: SourceTensor<'a>, scale: SourceTensor<'_>, scale_key: &str) -> SourceTensor<'a> {
    let factor = match (scale.to_f32)(&scale.bytes) {
        Ok(v) if v.len() == 1 && v[0].is_finite() => Ok(v[0]),
        Ok(v) => Err(format!(
            "{scale_key} holds {} value(s) {:?}, expected one finite scale",
            v.len(),
            &v[..v.len().min(4)]
        )),
        Err(e) => Err(format!("{scale_key}: {e}")),
    };
    let inner = t.to_f32;
    SourceTensor {
        ne: t.ne,
        n_dims: t.n_dims,
        ggml_type: None,
        bytes: t.bytes,
        to_f32: Box::new(move |b: &[u8]| {
            let s = factor.clone()?;
            let mut v = inner(b)?;
            v.iter_mut().for_each(|x| *x *= s);
            Ok(v)
        }),
        origin: t.origin,
    }
}

impl WeightSource for T5Source<'_> {
    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn tensor(&self, name: &str) -> Option<SourceTensor<'_>> {
        let local = self.resolve(name);
        let t = self.inner.tensor(local)?;
        let scale_key = local
            .strip_suffix(".weight")
            .map(|stem| format!("{stem}.scale_weight"));
        match scale_key.and_then(|k| self.inner.tensor(&k).map(|s| (k, s))) {
            Some((key, scale)) => Some(scaled(t, scale, &key)),
            None => Some(t),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(self.resolve(name))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
