//! The prefix K/V cache's step driver: storage types, completeness checks and the
//! out-of-memory fallback.
//!
//! The first call for a condition stores every layer's text K/V ([`KvMode::Store`]); later
//! calls with the same condition reuse them ([`KvMode::Reuse`]) and only run the image
//! tokens. A condition is a caller-chosen name (e.g. "cond" / "uncond" for CFG); its text
//! hidden states are fingerprinted so a changed prompt under the same name is re-stored
//! rather than silently reused. If a call with the cache fails to allocate, every cached
//! prefix of this [`PrefixCache`] is freed, caching is disabled for the rest of the run and
//! the call is retried once on the full sequence.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use thiserror::Error;

use super::{cache_names, KvMode, PrefixLayout, QwenImage21, QwenImage21Config, QwenImage21Inputs};
use crate::dtype::DType;
use crate::runner::{Runner, RunnerError};
use crate::tensor::HostTensor;
use crate::tensor::Ne;

/// Quantized storage types whose f32 ↔ type copies ggml's CPU backend implements.
const QUANTIZED_TYPES: &[&str] = &[
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K", "iq4_nl",
];

#[derive(Debug, Error)]
pub enum PrefixCacheError {
    #[error("Qwen Image 2.1 prefix cache entry '{0}' is missing")]
    Missing(String),
    #[error(
        "Qwen Image 2.1 prefix cache entry '{name}' has shape {found:?}, expected {expected:?}"
    )]
    Shape {
        name: String,
        found: Ne,
        expected: Ne,
    },
    #[error("prefix cache type '{ty}' is not supported: {reason}")]
    UnsupportedType { ty: String, reason: String },
    #[error("Qwen Image 2.1 inputs: {0}")]
    Inputs(String),
    #[error(transparent)]
    Runner(#[from] RunnerError),
}

/// Per-run prefix cache settings and state (one per sampling run; shared by its conditions).
pub struct PrefixCache {
    base: String,
    ty: DType,
    disabled: Cell<bool>,
    fingerprints: RefCell<HashMap<String, u64>>,
}

impl PrefixCache {
    /// Cache entries live under `base` (e.g. "qwen_image_2_1.prefix"); K/V are stored as
    /// `ty`, checked with [`PrefixCache::check_type`].
    pub fn new(
        base: &str,
        ty: DType,
        config: &QwenImage21Config,
    ) -> Result<Self, PrefixCacheError> {
        Self::check_type(ty, config.hidden_size)?;
        Ok(Self {
            base: base.trim_end_matches('.').to_string(),
            ty,
            disabled: Cell::new(false),
            fingerprints: RefCell::new(HashMap::new()),
        })
    }

    /// Whether `ty` can hold cached K/V rows of `hidden` elements: f32, f16, bf16, or a
    /// quantized type ggml converts at run time whose block size divides `hidden`.
    pub fn check_type(ty: DType, hidden: usize) -> Result<(), PrefixCacheError> {
        let err = |reason: String| PrefixCacheError::UnsupportedType {
            ty: ty.name().to_string(),
            reason,
        };
        if ty == DType::F32 || ty == DType::F16 || ty == DType::BF16 {
            return Ok(());
        }
        if !QUANTIZED_TYPES
            .iter()
            .any(|n| ty.name().eq_ignore_ascii_case(n))
        {
            return Err(err(format!(
                "use f32, f16, bf16 or one of {}",
                QUANTIZED_TYPES.join(", ")
            )));
        }
        if ty.row_bytes(hidden).is_none() {
            return Err(err(format!(
                "its block size {} does not divide the hidden size {hidden}",
                ty.block_size()
            )));
        }
        Ok(())
    }

    pub fn storage_type(&self) -> DType {
        self.ty
    }

    /// Whether caching was turned off for this run (after an allocation failure).
    pub fn is_disabled(&self) -> bool {
        self.disabled.get()
    }

    /// The cache key of `condition`.
    pub fn key(&self, condition: &str) -> String {
        format!("{}.{condition}", self.base)
    }

    /// Frees every condition's cached prefix.
    pub fn clear(&self, runner: &Runner) {
        runner.clear_cache(&format!("{}.", self.base));
        self.fingerprints.borrow_mut().clear();
    }

    /// Whether `runner` holds all layers' K/V of `condition` with `text_len` tokens, batch
    /// `batch`, in this cache's type.
    pub fn is_complete(
        &self,
        runner: &Runner,
        config: &QwenImage21Config,
        condition: &str,
        text_len: usize,
        batch: usize,
    ) -> bool {
        let key = self.key(condition);
        let want: Ne = [config.hidden_size, text_len, batch, 1];
        (0..config.layers).all(|i| {
            let (k, v) = cache_names(&key, i);
            [k, v]
                .iter()
                .all(|n| runner.cache_info(n) == Some((self.ty, want)))
        })
    }

    /// Bytes one layer's K + V take for `text_len` tokens (batch 1).
    pub fn bytes_per_layer(&self, config: &QwenImage21Config, text_len: usize) -> usize {
        2 * text_len * self.ty.row_bytes(config.hidden_size).unwrap_or(0)
    }
}

/// What the prefix is made of: the text encoder's rows and, for editing, the condition
/// images' latents [W_r, H_r, C, B] with the layout that places them.
#[derive(Clone, Copy)]
pub struct Condition<'a> {
    pub text: &'a HostTensor,
    pub refs: &'a [HostTensor],
    /// `None` = the text alone.
    pub layout: Option<&'a PrefixLayout>,
}

impl<'a> Condition<'a> {
    pub fn text(text: &'a HostTensor) -> Self {
        Self {
            text,
            refs: &[],
            layout: None,
        }
    }

    fn prefix_len(&self) -> usize {
        self.layout.map_or(self.text.ne[1], PrefixLayout::len)
    }

    fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for t in std::iter::once(self.text).chain(self.refs) {
            t.ne.hash(&mut h);
            for v in &t.data {
                v.to_bits().hash(&mut h);
            }
        }
        self.layout.hash(&mut h);
        h.finish()
    }
}

impl QwenImage21 {
    /// One denoising call: latent [W, H, C, B] and text [text_dim, L, B] → velocity
    /// [W, H, out_channels, B]. With `cache = Some((cache, condition))` the text prefix is
    /// stored on the condition's first call and reused afterwards.
    pub fn velocity(
        &self,
        runner: &Runner,
        latent: &HostTensor,
        text: &HostTensor,
        timesteps: &[f32],
        cache: Option<(&PrefixCache, &str)>,
    ) -> Result<HostTensor, PrefixCacheError> {
        self.velocity_for(runner, latent, &Condition::text(text), timesteps, cache)
    }

    /// [`QwenImage21::velocity`] for a prefix of text and condition images.
    pub fn velocity_for(
        &self,
        runner: &Runner,
        latent: &HostTensor,
        condition: &Condition<'_>,
        timesteps: &[f32],
        cache: Option<(&PrefixCache, &str)>,
    ) -> Result<HostTensor, PrefixCacheError> {
        let l = condition.prefix_len();
        let b = condition.text.ne[2];
        let active = cache.filter(|(c, _)| !c.is_disabled());
        let mode = match active {
            None => Mode::Full,
            Some((c, cond)) => {
                let fp = condition.fingerprint();
                let same = c.fingerprints.borrow().get(cond) == Some(&fp);
                if same && c.is_complete(runner, &self.config, cond, l, b) {
                    Mode::Reuse
                } else {
                    runner.clear_cache(&format!("{}.", c.key(cond)));
                    c.fingerprints.borrow_mut().insert(cond.to_string(), fp);
                    Mode::Store
                }
            }
        };
        let key = active.map(|(c, cond)| c.key(cond)).unwrap_or_default();
        let ty = active.map_or(DType::F32, |(c, _)| c.ty);
        let kv = match mode {
            Mode::Full => KvMode::Full,
            Mode::Store => KvMode::Store { key: &key, ty },
            Mode::Reuse => KvMode::Reuse { key: &key },
        };
        let result = self.run_once(runner, latent, condition, timesteps, kv);
        match (result, active) {
            (Err(PrefixCacheError::Runner(e)), Some((c, _))) if e.is_alloc_failure() => {
                c.clear(runner);
                c.disabled.set(true);
                log::warn!(
                    "Qwen Image 2.1: not enough memory for prefix caching ({e}); retrying \
                     without it for this sampling run"
                );
                self.run_once(runner, latent, condition, timesteps, KvMode::Full)
            }
            (Ok(out), Some((c, cond))) if mode == Mode::Store => {
                if c.is_complete(runner, &self.config, cond, l, b) {
                    log::debug!(
                        "Qwen Image 2.1: cached prefix '{cond}' ({l} tokens, {}, {:.1} MiB)",
                        c.ty,
                        (c.bytes_per_layer(&self.config, l) * b * self.config.layers) as f64
                            / 1048576.0
                    );
                } else {
                    c.clear(runner);
                    c.disabled.set(true);
                    log::warn!(
                        "Qwen Image 2.1: incomplete prefix cache; disabling it for this run"
                    );
                }
                Ok(out)
            }
            (r, _) => r,
        }
    }

    fn run_once(
        &self,
        runner: &Runner,
        latent: &HostTensor,
        condition: &Condition<'_>,
        timesteps: &[f32],
        kv: KvMode<'_>,
    ) -> Result<HostTensor, PrefixCacheError> {
        let reuse = matches!(kv, KvMode::Reuse { .. });
        let text = condition.text;
        runner.compute_one(|g| {
            let refs: Vec<_> = if reuse {
                Vec::new()
            } else {
                condition
                    .refs
                    .iter()
                    .enumerate()
                    .map(|(i, r)| g.input_f32(&format!("qwen21.ref{i}"), r.ne, r.data.clone()))
                    .collect()
            };
            let inputs = QwenImage21Inputs {
                latent: g.input_f32("qwen21.latent", latent.ne, latent.data.clone()),
                text: (!reuse).then(|| g.input_f32("qwen21.text", text.ne, text.data.clone())),
                timesteps,
                kv,
                refs: &refs,
                layout: condition.layout,
            };
            self.forward(g, &inputs)
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Full,
    Store,
    Reuse,
}
