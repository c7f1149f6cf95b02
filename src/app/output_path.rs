//! Output file naming, as upstream sd-cli's `save_results` does it, and the up-front checks
//! that an output path can be written (run before any model is loaded).
//!
//! Naming rules (examples/cli/main.cpp):
//! - A printf-style `%d` / `%03d` / `%5d` (up to 3 width digits) anywhere in `-o` marks a
//!   pattern: every result `i` is written to the pattern formatted with `begin + i`, and
//!   `%%` becomes `%`.
//! - Without a specifier, one result goes to the path itself; several results go to
//!   `<stem>_<begin + i><ext>` (e.g. `output_0.png`, `output_1.png`).
//! - A known image/video extension (.png .jpg .jpeg .jpe .webp .avi .webm, any case) is
//!   stripped first; when the extension is not an image format upstream can encode
//!   (png/jpg/webp), `.png` is appended: `out` → `out.png`, `out.foo` → `out.foo.png`,
//!   `out.avi` (for images) → `out.png`.
//! - `begin` is `--output-begin-idx`, default 0.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::image_io::OutputFormat;

fn lower_ext(path: &Path) -> Option<String> {
    path.extension()
        .map(|e| format!(".{}", e.to_string_lossy().to_ascii_lowercase()))
}

/// Splits `-o` into (base without a recognised extension, extension to use for images).
fn split_base_ext(output: &str) -> (String, String) {
    let path = Path::new(output);
    let ext_lower = lower_ext(path);
    let format = OutputFormat::from_extension(path);
    let strip = format.is_some() || matches!(ext_lower.as_deref(), Some(".avi") | Some(".webm"));
    let base = if strip {
        // Extension is ASCII-checked above; cut it off the original text to keep the rest intact.
        let ext_len = path.extension().map(|e| e.len() + 1).unwrap_or(0);
        output[..output.len() - ext_len].to_string()
    } else {
        output.to_string()
    };
    let ext = if format.is_none() {
        ".png".to_string()
    } else {
        path.extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default()
    };
    (base, ext)
}

/// One parsed piece of an output pattern.
enum Piece<'a> {
    Text(&'a str),
    Percent,
    Spec { width: usize, zero_pad: bool },
}

/// Scans printf-style specifiers the way upstream's regex `(?:[^%]|^)(?:%%)*(%\d{0,3}d)`
/// finds them: `%%` is a literal percent, `%` + up to three digits + `d` is a number.
fn scan(pattern: &str) -> Vec<Piece<'_>> {
    let bytes = pattern.as_bytes();
    let mut pieces = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            i += 1;
            continue;
        }
        if i + 1 < bytes.len() && bytes[i + 1] == b'%' {
            pieces.push(Piece::Text(&pattern[text_start..i]));
            pieces.push(Piece::Percent);
            i += 2;
            text_start = i;
            continue;
        }
        let mut j = i + 1;
        while j < bytes.len() && j - (i + 1) < 3 && bytes[j].is_ascii_digit() {
            j += 1;
        }
        if j < bytes.len() && bytes[j] == b'd' {
            let digits = &pattern[i + 1..j];
            pieces.push(Piece::Text(&pattern[text_start..i]));
            pieces.push(Piece::Spec {
                width: digits.parse().unwrap_or(0),
                zero_pad: digits.starts_with('0'),
            });
            i = j + 1;
            text_start = i;
        } else {
            i += 1;
        }
    }
    pieces.push(Piece::Text(&pattern[text_start..]));
    pieces
}

/// True when `-o` contains a `%d`-style specifier.
pub fn has_index_specifier(output: &str) -> bool {
    scan(output).iter().any(|p| matches!(p, Piece::Spec { .. }))
}

/// Formats every specifier of `pattern` with `index`, and `%%` as `%`.
pub fn format_index(pattern: &str, index: u64) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    for piece in scan(pattern) {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Percent => out.push('%'),
            Piece::Spec { width, zero_pad } => {
                if zero_pad {
                    out.push_str(&format!("{index:0width$}"));
                } else {
                    out.push_str(&format!("{index:width$}"));
                }
            }
        }
    }
    out
}

/// The path of result `index` (0-based) out of `total` results, for `-o output`
/// and `--output-begin-idx begin`.
pub fn output_path_for(output: &str, begin: u64, index: u64, total: u64) -> PathBuf {
    let (base, ext) = split_base_ext(output);
    if has_index_specifier(output) {
        return PathBuf::from(format_index(&format!("{base}{ext}"), begin + index));
    }
    if total > 1 {
        PathBuf::from(format!("{base}_{}{ext}", begin + index))
    } else {
        PathBuf::from(format!("{base}{ext}"))
    }
}

/// Why an output path cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputProblem {
    IsDirectory,
    AncestorNotDirectory(PathBuf),
    NotWritable(PathBuf, String),
}

impl std::fmt::Display for OutputProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutputProblem::IsDirectory => {
                write!(f, "it is a directory; give a file name such as out.png")
            }
            OutputProblem::AncestorNotDirectory(p) => {
                write!(f, "'{}' exists and is not a directory", p.display())
            }
            OutputProblem::NotWritable(p, why) => {
                write!(f, "directory '{}' is not writable: {why}", p.display())
            }
        }
    }
}

/// Checks that a file can be written at `path`: not a directory, and its nearest existing
/// ancestor is a writable directory (missing parents are created at write time, as upstream
/// does). Returns whether parent directories must be created.
pub fn check_output_path(path: &Path) -> Result<bool, OutputProblem> {
    if path.is_dir() {
        return Err(OutputProblem::IsDirectory);
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut ancestor = parent.as_path();
    let mut must_create = false;
    loop {
        match fs::metadata(ancestor) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(OutputProblem::AncestorNotDirectory(ancestor.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                must_create = true;
                ancestor = match ancestor.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
            }
            Err(e) => {
                return Err(OutputProblem::NotWritable(
                    ancestor.to_path_buf(),
                    e.to_string(),
                ))
            }
        }
    }
    probe_writable(ancestor)
        .map_err(|e| OutputProblem::NotWritable(ancestor.to_path_buf(), e.to_string()))?;
    Ok(must_create)
}

/// Creates and removes a tiny file: the only portable, safe way to know the effective user
/// may create files there (permission bits alone ignore ACLs, read-only mounts, root).
fn probe_writable(dir: &Path) -> io::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let probe = dir.join(format!(".sd-cli-probe-{}-{nanos}", std::process::id()));
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    drop(f);
    fs::remove_file(&probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn naming_without_specifier() {
        assert_eq!(output_path_for("output.png", 0, 0, 1), p("output.png"));
        assert_eq!(output_path_for("output.png", 0, 1, 3), p("output_1.png"));
        assert_eq!(output_path_for("dir/a.PNG", 5, 0, 2), p("dir/a_5.PNG"));
        assert_eq!(output_path_for("out", 0, 0, 1), p("out.png"));
        assert_eq!(output_path_for("out.foo", 0, 0, 1), p("out.foo.png"));
        assert_eq!(output_path_for("out.avi", 0, 0, 1), p("out.png"));
        assert_eq!(output_path_for("v1.2/out", 0, 1, 2), p("v1.2/out_1.png"));
    }

    #[test]
    fn naming_with_specifier() {
        assert_eq!(output_path_for("img_%d.png", 0, 2, 3), p("img_2.png"));
        assert_eq!(output_path_for("img_%03d.png", 1, 2, 3), p("img_003.png"));
        assert_eq!(output_path_for("img_%3d.png", 0, 7, 8), p("img_  7.png"));
        assert_eq!(output_path_for("100%%_%d", 0, 4, 5), p("100%_4.png"));
        // `%%d` is a literal "%d", not a specifier; single output keeps the name.
        assert!(!has_index_specifier("a%%d.png"));
        assert_eq!(output_path_for("a%%d.png", 0, 0, 1), p("a%%d.png"));
        // Four width digits are not a specifier upstream either.
        assert!(!has_index_specifier("a%0004d.png"));
        assert!(has_index_specifier("%d"));
        assert!(has_index_specifier("x%%%d"));
        assert_eq!(format_index("x%%%d", 3), "x%3");
    }
}
