//! Previews while sampling (`--preview proj|vae|tae`, `--preview-path`, `--preview-interval`,
//! `--preview-noisy`) on the tiny SD1 pipeline (tests/fixtures/sd_pipeline): the last `vae`
//! preview is the output picture (euler's last denoised estimate is its result), the last
//! `proj` preview is upstream's SD projection of diffusers' final latent, the interval picks the
//! steps, and families without a projection say so.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use sd_cli::image_io::read_image;
use sd_cli::pipeline::preview::SD_PROJECTION;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sd1(out: &Path, extra: &[&str]) -> Output {
    let folder = fixture_path("sd_pipeline/sd1");
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(["-m", s(&folder), "-p", "A lovely cat, holding a sign."])
        .args([
            "-n",
            "blurry, low quality",
            "--steps",
            "4",
            "--cfg-scale",
            "5",
        ])
        .args([
            "-W", "24", "-H", "16", "-s", "42", "--rng", "cpu", "-t", "2",
        ])
        .args([
            "--sampling-method",
            "euler",
            "--scheduler",
            "discrete",
            "-v",
        ])
        .args(["-o", s(out)])
        .args(extra)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    err
}

#[test]
fn last_vae_preview_is_the_picture() {
    let dir = tempfile::tempdir().unwrap();
    let (out, prev) = (dir.path().join("out.png"), dir.path().join("prev.png"));
    ok(&sd1(
        &out,
        &["--preview", "vae", "--preview-path", s(&prev)],
    ));
    assert_eq!(read_image(&prev).unwrap(), read_image(&out).unwrap());
}

#[test]
fn proj_preview_is_the_projected_latent_and_interval_picks_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (out, prev) = (dir.path().join("out.png"), dir.path().join("p.webp"));
    let err = ok(&sd1(
        &out,
        &[
            "--preview",
            "proj",
            "--preview-path",
            s(&prev),
            "--preview-interval",
            "3",
        ],
    ));
    // Steps 3 and 4 (the last), not 1 or 2.
    for (step, want) in [(1, false), (2, false), (3, true), (4, true)] {
        assert_eq!(
            err.contains(&format!("preview of step {step}:")),
            want,
            "{err}"
        );
    }
    // diffusers' final latent (divided by the VAE scale) back in the sampler's space.
    let mut latent = tensor(
        &open_fixture("sd_pipeline/sd1/reference.safetensors"),
        "latent",
    );
    latent.data.iter_mut().for_each(|v| *v *= 0.18215);
    let want = image_bytes(&SD_PROJECTION.project(&latent));
    let got = read_image(&prev).unwrap();
    let size = (latent.ne[0] as u32, latent.ne[1] as u32);
    assert_eq!((got.width, got.height), size, "one pixel per latent pixel");
    let worst = got
        .data
        .iter()
        .zip(&want)
        .map(|(a, b)| a.abs_diff(*b))
        .max();
    assert!(
        worst <= Some(1),
        "proj preview vs projected reference latent: {worst:?}"
    );
}

#[test]
fn noisy_previews_and_bad_flags() {
    let dir = tempfile::tempdir().unwrap();
    let (out, prev) = (dir.path().join("out.png"), dir.path().join("n.png"));
    ok(&sd1(
        &out,
        &[
            "--preview",
            "vae",
            "--preview-noisy",
            "--preview-path",
            s(&prev),
        ],
    ));
    assert_ne!(read_image(&prev).unwrap(), read_image(&out).unwrap());
    let o = sd1(&out, &["--preview", "proj", "--preview-interval", "0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--preview-interval"));
}

/// `--taesd-preview-only`: TAESD draws the previews, the VAE the final picture (as without
/// `--taesd`), each matching diffusers' decode of the same run.
#[test]
fn taesd_preview_only_keeps_the_vae_for_the_picture() {
    let dir = tempfile::tempdir().unwrap();
    let (out, prev) = (dir.path().join("out.png"), dir.path().join("tae.png"));
    let taesd = fixture_path("sd_pipeline/taesd");
    ok(&sd1(
        &out,
        &[
            "--taesd",
            s(&taesd),
            "--taesd-preview-only",
            "--preview",
            "tae",
            "--preview-path",
            s(&prev),
        ],
    ));
    let vae = image_bytes(&tensor(
        &open_fixture("sd_pipeline/sd1/reference.safetensors"),
        "image",
    ));
    let tae = image_bytes(&tensor(
        &open_fixture("sd_pipeline/taesd/reference.safetensors"),
        "image",
    ));
    let picture = psnr(&read_image(&out).unwrap().data, &vae);
    let preview = psnr(&read_image(&prev).unwrap().data, &tae);
    eprintln!("picture vs diffusers VAE: {picture:.1} dB; last preview vs TAESD: {preview:.1} dB");
    assert!(picture >= 60.0 && preview >= 60.0);
}
