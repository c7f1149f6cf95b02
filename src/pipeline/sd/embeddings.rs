//! Textual-inversion embeddings from `--embd-dir`: each file's name (without extension,
//! lowercased, as upstream) is a word a prompt may use; its vectors become extra token rows of
//! the text encoder whose width they have (SDXL files carry `clip_l` and `clip_g` tensors).
//!
//! Every embedding in the folder is read once at load (they are a few KiB each) and given ids
//! after the vocabulary; a file that cannot be read is skipped with a warning, so a stray file
//! only matters if a prompt names it.

use std::path::Path;

use crate::error::{Error, Result};
use crate::tokenizers::clip::CustomWords;
use crate::weights::TensorStore;

/// File extensions read as embeddings (upstream's list, case-sensitive as upstream).
const EXTENSIONS: [&str; 4] = ["safetensors", "pt", "ckpt", "gguf"];

/// Largest embedding file read (upstream's buffer for custom embeddings is 100 MiB): a whole
/// model left in the folder is skipped instead of becoming a huge "embedding".
const MAX_FILE_BYTES: u64 = 100 << 20;

/// One embedding: its word and how many vectors it stands for.
#[derive(Clone, Debug)]
struct Embedding {
    name: String,
    vectors: usize,
}

/// The embeddings of a run, as extra token rows per text encoder.
#[derive(Clone, Debug, Default)]
pub struct CustomEmbeddings {
    entries: Vec<Embedding>,
    /// Rows per encoder (0: the first CLIP, 1: bigG), [width, k] row-major.
    rows: [Vec<f32>; 2],
}

impl CustomEmbeddings {
    /// Reads every embedding in `dir` for encoders of widths `widths` (0 where absent).
    /// A folder that cannot be listed is a warning (upstream ignores it).
    pub fn load(dir: &Path, widths: [usize; 2]) -> Result<Self> {
        let listing = match std::fs::read_dir(dir) {
            Ok(l) => l,
            Err(e) => {
                log::warn!("--embd-dir {}: {e}; no embeddings loaded", dir.display());
                return Ok(Self::default());
            }
        };
        let mut files: Vec<_> = listing
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| EXTENSIONS.contains(&e))
            })
            .filter(|p| match std::fs::metadata(p) {
                Ok(m) if m.is_file() && m.len() <= MAX_FILE_BYTES => true,
                Ok(m) if m.is_file() => {
                    log::warn!(
                        "embedding {}: {} MiB is too large for an embedding; skipped",
                        p.display(),
                        m.len() >> 20
                    );
                    false
                }
                _ => false,
            })
            .collect();
        files.sort();
        let mut out = Self::default();
        for path in files {
            let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            // ASCII only, as upstream's `tolower` on bytes and the prompt's normalisation.
            match out.add(path.as_path(), &name.to_ascii_lowercase(), widths) {
                Ok(true) => {}
                Ok(false) => log::warn!(
                    "embedding {}: no vector of width {} or {}; skipped",
                    path.display(),
                    widths[0],
                    widths[1]
                ),
                Err(e) => log::warn!("embedding {}: {e}; skipped", path.display()),
            }
        }
        log::debug!("{} textual-inversion embedding(s)", out.entries.len());
        Ok(out)
    }

    /// Adds one file; false when none of its tensors fits an encoder.
    fn add(&mut self, path: &Path, name: &str, widths: [usize; 2]) -> Result<bool> {
        let store = TensorStore::open(path)?;
        // [encoder] -> (vectors, values)
        let mut found: [Option<(usize, Vec<f32>)>; 2] = [None, None];
        for t in store.iter() {
            let width = t.ne[0];
            let vectors = if t.n_dims == 1 { 1 } else { t.ne[1] };
            if t.n_dims > 2 || vectors == 0 {
                continue;
            }
            let named_g = t.name.contains("clip_g");
            let named_l = t.name.contains("clip_l");
            let target = if widths[0] == widths[1] {
                // Same widths (tiny models): the tensor's name decides, else the first.
                Some(usize::from(named_g && !named_l))
            } else {
                widths.iter().position(|&w| w == width && w != 0)
            };
            if let Some(k) = target.filter(|&k| widths[k] == width && found[k].is_none()) {
                found[k] = Some((vectors, store.to_f32(t)?));
            }
        }
        let vectors = match (&found[0], &found[1]) {
            (Some((a, _)), Some((b, _))) if a != b => {
                return Err(Error::Unsupported(format!(
                    "its CLIP-L and bigG parts have {a} and {b} vectors"
                )))
            }
            (Some((a, _)), _) | (None, Some((a, _))) => *a,
            (None, None) => return Ok(false),
        };
        self.remove(name);
        for (k, f) in found.into_iter().enumerate() {
            match f {
                Some((_, v)) => self.rows[k].extend(v),
                // Keep both encoders' ids aligned: an encoder the file lacks gets zeros.
                None => self.rows[k].extend(std::iter::repeat_n(0.0, vectors * widths[k])),
            }
        }
        self.entries.push(Embedding {
            name: name.to_string(),
            vectors,
        });
        Ok(true)
    }

    /// The tokenizer's custom words (ids from `vocab` on) and each encoder's extra token rows
    /// in the order of those ids.
    pub fn words(&self, vocab: usize) -> Result<(CustomWords, [Vec<f32>; 2])> {
        let base = i32::try_from(vocab)
            .map_err(|_| Error::Unsupported(format!("a vocabulary of {vocab} tokens")))?;
        let mut words = CustomWords::new(base);
        for e in &self.entries {
            words.add(&e.name, e.vectors)?;
        }
        let mut rows: [Vec<f32>; 2] = [Vec::new(), Vec::new()];
        for w in words.iter() {
            let Some(i) = self.entries.iter().position(|e| e.name == w.name) else {
                continue;
            };
            for (k, out) in rows.iter_mut().enumerate() {
                let width = self.rows[k].len() / self.total_vectors().max(1);
                let start = self.first_vector(i) * width;
                out.extend_from_slice(
                    &self.rows[k][start..start + self.entries[i].vectors * width],
                );
            }
        }
        Ok((words, rows))
    }

    /// Drops the entry of a file met earlier whose name is equal after lowercasing: files come
    /// in byte order, so the later one wins, as in upstream's map of stems (keeping both would
    /// misalign the rows of the tokenizer's one word for them).
    fn remove(&mut self, name: &str) {
        let Some(i) = self.entries.iter().position(|e| e.name == name) else {
            return;
        };
        log::warn!("two embeddings are named {name:?}; the later file (in byte order) is used");
        let (first, vectors) = (self.first_vector(i), self.entries[i].vectors);
        let total = self.total_vectors();
        for rows in &mut self.rows {
            let width = rows.len() / total;
            rows.drain(first * width..(first + vectors) * width);
        }
        self.entries.remove(i);
    }

    fn total_vectors(&self) -> usize {
        self.entries.iter().map(|e| e.vectors).sum()
    }

    /// Index of entry `i`'s first vector in the load-order rows.
    fn first_vector(&self, i: usize) -> usize {
        self.entries[..i].iter().map(|e| e.vectors).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
