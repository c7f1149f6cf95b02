//! Output naming and the up-front check that every output can be written.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::app::output_path::{check_output_path, output_path_for};
use crate::app::{Mode, OutputConfig, PreviewSettings};
use crate::cli::args::Cli;
use crate::cli::error::{invalid, CliError};

pub(super) fn resolve(cli: &Cli, warnings: &mut Vec<String>) -> Result<OutputConfig, CliError> {
    let o = &cli.output;
    let mut pattern = o.output.clone();
    if cli.mode == Mode::Convert && pattern == "output.png" {
        pattern = "output.gguf".into();
    }
    let begin_idx = match o.output_begin_idx {
        None => 0,
        Some(v) if v >= 0 => v as u64,
        Some(v) => {
            warnings.push(format!("--output-begin-idx {v} is negative; using 0"));
            0
        }
    };
    let mut out = OutputConfig {
        pattern,
        begin_idx,
        embed_metadata: !o.disable_image_metadata,
        create_parent_dirs: false,
        preview: preview(o)?,
        taesd_preview_only: o.taesd_preview_only,
    };
    if cli.mode == Mode::Metadata {
        return Ok(out);
    }
    if out.pattern.trim().is_empty() {
        return Err(CliError::Missing("-o/--output must not be empty".into()));
    }
    // Upstream would quietly write `<dir>.png` next to an existing directory; refuse.
    if Path::new(&out.pattern).is_dir() {
        return Err(CliError::Output {
            path: PathBuf::from(&out.pattern),
            reason: "it is a directory; give a file name such as out.png".into(),
        });
    }
    let total = if matches!(cli.mode, Mode::ImgGen | Mode::Adetailer) {
        cli.generation.batch_count.max(1) as u64
    } else {
        1
    };
    // Distinct parents only: a big batch into one directory probes it once.
    let mut seen = BTreeSet::new();
    for i in 0..total {
        let path = if cli.mode == Mode::Convert {
            PathBuf::from(&out.pattern)
        } else {
            output_path_for(&out.pattern, begin_idx, i, total)
        };
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        if !seen.insert(parent) && !path.exists() {
            continue;
        }
        let must_create = check_output_path(&path).map_err(|e| CliError::Output {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        out.create_parent_dirs |= must_create;
    }
    Ok(out)
}

/// `--preview` and its flags.
fn preview(o: &crate::cli::args::OutputArgs) -> Result<Option<PreviewSettings>, CliError> {
    if o.preview == "none" {
        return Ok(None);
    }
    let method = o
        .preview
        .parse()
        .map_err(|reason: String| invalid("--preview", &o.preview, &reason))?;
    if o.preview_interval < 1 {
        return Err(invalid(
            "--preview-interval",
            o.preview_interval,
            "must be at least 1",
        ));
    }
    if o.preview_path.is_dir() {
        return Err(invalid(
            "--preview-path",
            o.preview_path.display(),
            "is a directory; give a file name such as preview.png",
        ));
    }
    Ok(Some(PreviewSettings {
        method,
        path: o.preview_path.clone(),
        interval: o.preview_interval as u32,
        noisy: o.preview_noisy,
    }))
}
