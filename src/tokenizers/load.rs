//! Finding and loading the T5 tokenizer files that users already have.

use std::path::{Path, PathBuf};

use super::error::TokenizerError;
use super::sentencepiece_model::from_spiece_model;
use super::t5::T5Tokenizer;
use super::tokenizer_json::from_tokenizer_json;

/// Number of `<extra_id_N>` sentinels T5 adds after the SentencePiece vocabulary.
pub const T5_EXTRA_IDS: usize = 100;

const FILE_NAMES: [&str; 2] = ["tokenizer.json", "spiece.model"];

fn first_existing(dir: &Path) -> Option<PathBuf> {
    FILE_NAMES.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// Locates the T5 tokenizer for the T5 weights at `model_path`.
///
/// Order: the explicit `--t5xxl-tokenizer` file; `tokenizer.json` / `spiece.model` beside the
/// model file (or inside it, when `model_path` is a directory); the diffusers pipeline layout,
/// where weights in `<dir>/text_encoder/` pair with `<dir>/tokenizer/`.
pub fn find_t5_tokenizer(
    explicit: Option<&Path>,
    model_path: &Path,
) -> Result<PathBuf, TokenizerError> {
    find_tokenizer(
        explicit,
        model_path,
        &[],
        "Download `spiece.model` from the Hugging Face repo google/t5-v1_1-xxl, or \
         `tokenizer/spiece.model` or `tokenizer/tokenizer.json` from \
         PixArt-alpha/PixArt-Sigma-XL-2-1024-MS",
    )
}

/// Locates the umT5 tokenizer (Wan 2.x) for the umT5 weights at `model_path`: as
/// [`find_t5_tokenizer`], plus `google/umt5-xxl/` beside the weights, where the Wan-AI
/// repositories keep it next to `models_t5_umt5-xxl-enc-bf16.pth`.
pub fn find_umt5_tokenizer(
    explicit: Option<&Path>,
    model_path: &Path,
) -> Result<PathBuf, TokenizerError> {
    find_tokenizer(
        explicit,
        model_path,
        &["google/umt5-xxl"],
        "Download `tokenizer.json` (or `spiece.model`) from the Hugging Face repo \
         google/umt5-xxl (Wan-AI/Wan2.1-T2V-14B has it as `google/umt5-xxl/tokenizer.json`)",
    )
}

/// The search behind [`find_t5_tokenizer`] / [`find_umt5_tokenizer`]: `subdirs` are extra
/// folders below the weights' folder; `download` tells the user what to fetch.
fn find_tokenizer(
    explicit: Option<&Path>,
    model_path: &Path,
    subdirs: &[&str],
    download: &str,
) -> Result<PathBuf, TokenizerError> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        return Err(TokenizerError::NotFound(format!(
            "--t5xxl-tokenizer {}: no such file (expected a tokenizer.json or spiece.model)",
            p.display()
        )));
    }
    // The directory holding the weights (or the directory given as the model).
    let dir = if model_path.is_dir() {
        Some(model_path.to_path_buf())
    } else {
        model_path.parent().map(Path::to_path_buf)
    };
    let mut searched = Vec::new();
    if let Some(dir) = dir {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let mut candidates = vec![dir.clone()];
        candidates.extend(subdirs.iter().map(|s| dir.join(s)));
        if dir.file_name().is_some_and(|n| n == "text_encoder") {
            if let Some(root) = dir.parent() {
                candidates.push(root.join("tokenizer"));
            }
        }
        for candidate in candidates {
            if let Some(found) = first_existing(&candidate) {
                return Ok(found);
            }
            searched.push(candidate);
        }
    }
    let places = searched
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let beside = searched.first().map_or_else(
        || "the T5 file's folder".to_string(),
        |d| d.display().to_string(),
    );
    Err(TokenizerError::NotFound(format!(
        "no T5 tokenizer found for {model} (looked for tokenizer.json and spiece.model in: {places}). \
         {download}, and put it in {beside} next to the T5 weights, \
         or pass its path with --t5xxl-tokenizer <FILE>",
        model = model_path.display(),
    )))
}

/// Largest tokenizer file read (real ones are a few MB; Qwen's tokenizer.json is ~11 MB).
pub const MAX_TOKENIZER_FILE_BYTES: u64 = 256 << 20;

/// Reads at most [`MAX_TOKENIZER_FILE_BYTES`] of `path`; a larger file or an endless device
/// (`/dev/zero`) is an error, not an unbounded allocation.
fn read_capped(path: &Path) -> Result<Vec<u8>, TokenizerError> {
    use std::io::Read;
    let io_err = |source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_TOKENIZER_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    if bytes.len() as u64 > MAX_TOKENIZER_FILE_BYTES {
        return Err(TokenizerError::Format {
            path: path.display().to_string(),
            reason: format!("file is larger than {MAX_TOKENIZER_FILE_BYTES} bytes"),
        });
    }
    Ok(bytes)
}

/// Loads a T5 tokenizer from a `tokenizer.json` (HF) or a `spiece.model` (SentencePiece).
/// The format is recognised by content: JSON starts with `{`.
pub fn load_t5_tokenizer(path: &Path) -> Result<T5Tokenizer, TokenizerError> {
    let bytes = read_capped(path)?;
    let name = path.display().to_string();
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        let text = std::str::from_utf8(&bytes).map_err(|_| TokenizerError::Format {
            path: name.clone(),
            reason: "JSON file is not UTF-8".into(),
        })?;
        from_tokenizer_json(text, &name)
    } else {
        from_spiece_model(&bytes, T5_EXTRA_IDS, &name)
    }
}

#[cfg(test)]
mod tests {
    use super::{find_t5_tokenizer, find_umt5_tokenizer};
    use std::fs;

    #[test]
    fn umt5_search_and_message() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let weights = tmp.path().join("models_t5_umt5-xxl-enc-bf16.pth");
        fs::write(&weights, b"x").expect("write");
        let msg = find_umt5_tokenizer(None, &weights)
            .expect_err("nothing there yet")
            .to_string();
        assert!(
            msg.contains("google/umt5-xxl") && msg.contains("--t5xxl-tokenizer"),
            "{msg}"
        );
        assert!(!msg.contains("t5-v1_1"), "{msg}");
        // The Wan-AI repository layout.
        let wan = tmp.path().join("google/umt5-xxl");
        fs::create_dir_all(&wan).expect("mkdir");
        fs::write(wan.join("tokenizer.json"), b"{}").expect("write");
        assert_eq!(
            find_umt5_tokenizer(None, &weights).expect("Wan layout"),
            wan.join("tokenizer.json")
        );
        assert!(find_t5_tokenizer(None, &weights).is_err());
    }

    #[test]
    fn search_order_and_message() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let te = root.join("text_encoder");
        fs::create_dir_all(&te).expect("mkdir");
        let weights = te.join("model.safetensors");
        fs::write(&weights, b"x").expect("write");

        let err = find_t5_tokenizer(None, &weights).expect_err("nothing there yet");
        let msg = err.to_string();
        assert!(
            msg.contains("google/t5-v1_1-xxl") && msg.contains("--t5xxl-tokenizer"),
            "{msg}"
        );
        assert!(
            msg.contains("PixArt-alpha/PixArt-Sigma-XL-2-1024-MS"),
            "{msg}"
        );

        let tok_dir = root.join("tokenizer");
        fs::create_dir_all(&tok_dir).expect("mkdir");
        fs::write(tok_dir.join("spiece.model"), b"x").expect("write");
        assert_eq!(
            find_t5_tokenizer(None, &weights).expect("diffusers"),
            tok_dir.join("spiece.model")
        );
        assert_eq!(
            find_t5_tokenizer(None, &te).expect("dir"),
            tok_dir.join("spiece.model")
        );

        fs::write(te.join("tokenizer.json"), b"{}").expect("write");
        assert_eq!(
            find_t5_tokenizer(None, &weights).expect("beside"),
            te.join("tokenizer.json")
        );

        let explicit = root.join("mine.model");
        assert!(find_t5_tokenizer(Some(&explicit), &weights).is_err());
        fs::write(&explicit, b"x").expect("write");
        assert_eq!(
            find_t5_tokenizer(Some(&explicit), &weights).expect("explicit"),
            explicit
        );
    }
}
