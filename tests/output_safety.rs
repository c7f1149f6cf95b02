//! Output safety: an existing output is replaced only by a complete file (temp file + rename),
//! and failed runs leave the old output and no temporaries behind. Split from
//! `hostile_corpus.rs`; shares its `tests/hostile/` helpers.

mod hostile;

use std::path::{Path, PathBuf};

use hostile::cli::{assert_clean_failure, sd_cli};
use hostile::gguf::G;
use sd_cli::image_io::read_png;
use sd_cli::weights::TensorStore;

fn tiny_safetensors(path: &Path, scale: f32) {
    use sd_cli::weights::safetensors::{write_safetensors, SafetensorsItem};
    let w: Vec<u8> = (0..64)
        .flat_map(|i| (i as f32 * scale).to_le_bytes())
        .collect();
    let items = [SafetensorsItem {
        name: "blocks.0.w",
        dtype: "F32",
        shape: &[2, 32],
        data: &w,
    }];
    write_safetensors(path, &Default::default(), &items).unwrap();
}

fn leftovers(dir: &Path, keep: &[&str]) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !keep.iter().any(|k| p.file_name().is_some_and(|n| n == *k)))
        .collect()
}

/// An existing output is replaced by rename (a reader holding the old file still sees the old,
/// complete bytes; the path gets a new inode), never truncated and rewritten in place.
#[test]
fn output_replaced_only_by_complete_file() {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // GGUF via convert.
    let (a, b, out) = (
        d.join("a.safetensors"),
        d.join("b.safetensors"),
        d.join("out.gguf"),
    );
    tiny_safetensors(&a, 1.0);
    tiny_safetensors(&b, 2.0);
    let conv = |m: &Path| {
        sd_cli(&[
            "-M",
            "convert",
            "-m",
            m.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ])
    };
    assert!(conv(&a).status.success());
    let old_bytes = std::fs::read(&out).unwrap();
    let mut old_handle = std::fs::File::open(&out).unwrap();
    let old_ino = std::fs::metadata(&out).unwrap().ino();
    assert!(conv(&b).status.success());
    let mut seen = Vec::new();
    old_handle.read_to_end(&mut seen).unwrap();
    assert_eq!(seen, old_bytes, "old GGUF was modified in place");
    assert_ne!(std::fs::metadata(&out).unwrap().ino(), old_ino);
    assert!(TensorStore::open(&out).is_ok());
    assert!(leftovers(d, &["a.safetensors", "b.safetensors", "out.gguf"]).is_empty());
    // PNG.
    use sd_cli::image_io::{write_png_atomic, Channels, Image};
    let png = d.join("img.png");
    let img = |v: u8| Image::new(4, 4, Channels::Rgb, vec![v; 48]).unwrap();
    write_png_atomic(&png, &img(1), &[]).unwrap();
    let old_png = std::fs::read(&png).unwrap();
    let mut h = std::fs::File::open(&png).unwrap();
    let ino = std::fs::metadata(&png).unwrap().ino();
    write_png_atomic(&png, &img(200), &[]).unwrap();
    let mut seen = Vec::new();
    h.read_to_end(&mut seen).unwrap();
    assert_eq!(seen, old_png, "old PNG was modified in place");
    assert_ne!(std::fs::metadata(&png).unwrap().ino(), ino);
    assert_eq!(read_png(&png).unwrap().data, vec![200; 48]);
}

/// A convert that fails after writing some tensors leaves the old output untouched and no
/// temporary file behind.
#[test]
fn failed_convert_keeps_old_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // f32 tensor first, then a Q8_K tensor: ggml cannot dequantize Q8_K, so `--type q8_0`
    // fails on the second tensor, after the first was written.
    let mut g = G::header(3, 2, 0);
    g.info("a", &[32, 2], 0, 0).info("b", &[256, 2], 15, 256);
    let model = d.join("m.gguf");
    std::fs::write(&model, g.data(32, 256 + 2 * 292)).unwrap();
    let out = d.join("out.gguf");
    std::fs::write(&out, b"previous contents").unwrap();
    let o = sd_cli(&[
        "-M",
        "convert",
        "-m",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--type",
        "q8_0",
    ]);
    assert_clean_failure(&o, "b", "convert of q8_K");
    assert_eq!(std::fs::read(&out).unwrap(), b"previous contents");
    assert!(
        leftovers(d, &["m.gguf", "out.gguf"]).is_empty(),
        "{:?}",
        leftovers(d, &["m.gguf", "out.gguf"])
    );
}

/// `-o` naming a directory or an unwritable place fails before any model is opened, even when
/// the model is huge (a 64 GiB sparse file) or does not exist.
#[test]
fn bad_output_fails_before_loading_models() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let huge = d.join("huge.safetensors");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(64 << 30).unwrap();
    drop(f);
    let file = d.join("plain.txt");
    std::fs::write(&file, b"x").unwrap();
    let targets: Vec<(String, &str)> = vec![
        (d.to_str().unwrap().to_string(), "directory"),
        (
            file.join("o.png").to_str().unwrap().to_string(),
            "not a directory",
        ),
        ("/proc/sd-cli-out.png".to_string(), "not writable"),
    ];
    for (out, why) in &targets {
        for (mode, model_flag) in [("img_gen", "--diffusion-model"), ("convert", "-m")] {
            let start = std::time::Instant::now();
            let o = sd_cli(&[
                "-M",
                mode,
                model_flag,
                huge.to_str().unwrap(),
                "-p",
                "x",
                "-o",
                out,
            ]);
            assert_clean_failure(&o, "-o/--output", &format!("{mode} -o {out}"));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(why), "{mode} -o {out}: {err}");
            assert!(start.elapsed().as_secs() < 10, "{mode} -o {out}: slow");
            let o = sd_cli(&[
                "-M",
                mode,
                model_flag,
                d.join("absent.gguf").to_str().unwrap(),
                "-p",
                "x",
                "-o",
                out,
            ]);
            assert_eq!(
                o.status.code(),
                Some(1),
                "{mode} -o {out} with absent model"
            );
        }
    }
}
