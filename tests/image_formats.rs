//! JPEG, WebP and BMP in, JPEG and WebP out, with metadata (tests/reference/
//! image_formats_fixtures.py, Pillow 13): decoding against Pillow's pixels, EXIF orientation,
//! A1111's EXIF UserComment, round trips through `-M metadata`, the binary with `-o x.jpg` /
//! `.webp` and `--init-img x.jpg`, and hostile files.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use sd_cli::image_io::{
    read_image, read_image_from_bytes, read_png, read_text_metadata, write_generation_image,
    write_png_atomic, Channels, GenerationParams, Image, ImageFormat, ImageIoError, TextKind,
};

fn fixture(name: &str) -> PathBuf {
    fixture_path("image_formats").join(name)
}

fn max_diff(a: &Image, b: &Image) -> u8 {
    assert_eq!(
        (a.width, a.height, a.channels),
        (b.width, b.height, b.channels)
    );
    a.data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

#[test]
fn bmp_and_lossless_webp_decode_exactly() {
    let upright = read_png(&fixture("upright.png")).unwrap();
    let bmp = read_image(&fixture("photo.bmp")).unwrap();
    assert_eq!(bmp, upright);
    let rgba = read_image(&fixture("rgba.webp")).unwrap();
    assert_eq!(rgba.channels, Channels::Rgba);
    assert_eq!(rgba, read_png(&fixture("rgba.png")).unwrap());
    // PNG goes through the same entry point.
    assert_eq!(read_image(&fixture("upright.png")).unwrap(), upright);
}

#[test]
fn exif_orientation_is_applied() {
    let upright = read_png(&fixture("upright.png")).unwrap();
    let webp = read_image(&fixture("rot6.webp")).unwrap();
    assert_eq!(
        (webp.width, webp.height),
        (12, 8),
        "shown upright, not as stored"
    );
    assert_eq!(webp, upright);
    // JPEG decoders differ by a few levels (libjpeg-turbo in Pillow, zune-jpeg here).
    let jpeg = read_image(&fixture("rot6.jpg")).unwrap();
    let pil = read_png(&fixture("rot6_pil.png")).unwrap();
    let d = max_diff(&jpeg, &pil);
    eprintln!("rot6.jpg vs Pillow: max difference {d} levels");
    assert!(d <= 6, "{d}");
    assert!(max_diff(&jpeg, &upright) <= 24, "upright like the original");
}

#[test]
fn a1111_exif_user_comment_is_read() {
    let want = std::fs::read_to_string(fixture("a1111.txt")).unwrap();
    let (format, chunks) = read_text_metadata(&fixture("a1111.jpg")).unwrap();
    assert_eq!(format, ImageFormat::Jpeg);
    let exif = chunks
        .iter()
        .find(|c| c.kind == TextKind::Exif)
        .expect("a UserComment");
    assert_eq!(exif.text, want);
}

fn params() -> GenerationParams {
    let mut p = GenerationParams::new();
    p.prompt = "a lovely cat <lora:x:0.8>, café 猫".into();
    p.negative_prompt = "blurry & <bad>".into();
    p.seed = 42;
    p
}

fn test_image(channels: Channels) -> Image {
    let (w, h) = (24u32, 16u32);
    let n = channels.count();
    let data = (0..w * h * n as u32)
        .map(|i| ((i * 37 + i / 7) % 251) as u8)
        .collect();
    Image::new(w, h, channels, data).unwrap()
}

#[test]
fn outputs_carry_their_metadata_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let p = params();
    for (name, format) in [
        ("out.png", ImageFormat::Png),
        ("out.JPG", ImageFormat::Jpeg),
        ("out.webp", ImageFormat::WebP),
    ] {
        for channels in [Channels::Rgb, Channels::Rgba] {
            let path = dir.path().join(name);
            let img = test_image(channels);
            write_generation_image(&path, &img, Some(&p)).unwrap();
            let (got_format, chunks) = read_text_metadata(&path).unwrap();
            assert_eq!(got_format, format, "{name}");
            let a1111: Vec<&str> = chunks
                .iter()
                .filter(|c| c.keyword == "parameters" || c.kind == TextKind::Exif)
                .map(|c| c.text.as_str())
                .collect();
            assert!(!a1111.is_empty(), "{name}: {chunks:?}");
            assert!(
                a1111.iter().all(|t| *t == p.to_a1111()),
                "{name}: {a1111:?}"
            );
            let json = chunks
                .iter()
                .find(|c| c.keyword == "sd-cli-json")
                .unwrap_or_else(|| panic!("{name}: no JSON record"));
            assert_eq!(
                GenerationParams::from_json(&json.text).unwrap(),
                p,
                "{name}"
            );
            let back = read_image(&path).unwrap();
            match format {
                // JPEG keeps no alpha and is lossy.
                ImageFormat::Jpeg => {
                    assert_eq!(back.channels, Channels::Rgb);
                    let psnr_db = psnr(&back.data, &img.to_rgb().data);
                    assert!(psnr_db > 20.0, "{name}: {psnr_db}");
                }
                _ => assert_eq!(back, img, "{name} is lossless"),
            }
            // No metadata when disabled.
            write_generation_image(&path, &img, None).unwrap();
            assert!(read_text_metadata(&path).unwrap().1.is_empty(), "{name}");
        }
    }
}

fn decode_err(bytes: &[u8]) -> ImageIoError {
    read_image_from_bytes(bytes, Path::new("hostile.img")).expect_err("must not decode")
}

#[test]
fn hostile_files_are_errors() {
    for name in [
        "rot6.jpg",
        "rot6.webp",
        "photo.bmp",
        "rgba.webp",
        "a1111.jpg",
    ] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        for cut in [bytes.len() / 2, bytes.len() - 3, 20] {
            let e = decode_err(&bytes[..cut]);
            assert!(
                e.to_string().contains("hostile.img"),
                "{name} cut at {cut}: {e}"
            );
            let _ = read_text_metadata_of(&bytes[..cut]);
        }
    }
    // A WebP whose VP8X canvas is 2^24 × 2^24.
    let mut webp = b"RIFF\0\0\0\0WEBPVP8X".to_vec();
    webp.extend(10u32.to_le_bytes());
    webp.extend([0u8; 4]);
    webp.extend([0xff; 6]);
    let len = (webp.len() - 8) as u32;
    webp[4..8].copy_from_slice(&len.to_le_bytes());
    let e = decode_err(&webp);
    assert!(
        matches!(
            e,
            ImageIoError::TooLarge { .. } | ImageIoError::Decode { .. }
        ),
        "{e}"
    );
    // A BMP claiming 100000 × 100000 pixels.
    let mut bmp = std::fs::read(fixture("photo.bmp")).unwrap();
    bmp[18..22].copy_from_slice(&100_000i32.to_le_bytes());
    bmp[22..26].copy_from_slice(&100_000i32.to_le_bytes());
    let e = decode_err(&bmp);
    assert!(
        matches!(
            e,
            ImageIoError::TooLarge { .. } | ImageIoError::Decode { .. }
        ),
        "{e}"
    );
    // Unknown formats name themselves.
    let e = decode_err(b"GIF89a\x01\0\x01\0");
    assert!(
        e.to_string().contains("not a PNG, JPEG, WebP or BMP"),
        "{e}"
    );
}

/// The metadata reader on raw bytes (through a file), which must not panic.
fn read_text_metadata_of(bytes: &[u8]) -> Result<(), ImageIoError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m");
    std::fs::write(&p, bytes).unwrap();
    read_text_metadata(&p).map(|_| ())
}

fn sd_cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_binary_writes_jpeg_and_webp_and_reads_jpeg_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let folder = fixture_path("sd_pipeline/sd1");
    let base = [
        "-m",
        folder.to_str().unwrap(),
        "-p",
        "a cat",
        "--steps",
        "2",
        "-W",
        "24",
        "-H",
        "16",
        "-s",
        "7",
    ];
    for name in ["cat.jpg", "cat.webp"] {
        let out = dir.path().join(name);
        let o = sd_cli(&[&base[..], &["-o", out.to_str().unwrap()]].concat());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let img = read_image(&out).unwrap();
        assert_eq!((img.width, img.height), (24, 16));
        let o = sd_cli(&["-M", "metadata", "--image", out.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && text.contains("Steps: 2"),
            "{name}: {text}"
        );
    }
    // img2img from a JPEG equals img2img from the same pixels as PNG.
    let jpeg = fixture("rot6.jpg");
    let png = dir.path().join("same.png");
    write_png_atomic(&png, &read_image(&jpeg).unwrap(), &[]).unwrap();
    let mut outs = Vec::new();
    for init in [&jpeg, &png] {
        let out = dir.path().join(format!("i2i{}.png", outs.len()));
        let o = sd_cli(
            &[
                &base[..4],
                &[
                    "--steps",
                    "2",
                    "--init-img",
                    init.to_str().unwrap(),
                    "--strength",
                    "0.6",
                ],
                &["-o", out.to_str().unwrap()],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        outs.push(read_png(&out).unwrap());
    }
    assert_eq!(
        outs[0], outs[1],
        "--init-img JPEG and PNG of the same pixels"
    );
}

/// A small mutation run in every test pass (the `image` fuzz target goes further): flipped
/// bytes, cut files and spliced headers of every fixture decode or fail, never panic.
#[test]
fn mutated_files_never_panic() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("m");
    for name in [
        "rot6.jpg",
        "rot6.webp",
        "photo.bmp",
        "rgba.webp",
        "a1111.jpg",
    ] {
        let good = std::fs::read(fixture(name)).unwrap();
        for _ in 0..300 {
            let mut b = good.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % b.len();
                b[at] = next() as u8;
            }
            if next() % 4 == 0 {
                b.truncate((next() as usize) % b.len());
            }
            if let Ok(img) = read_image_from_bytes(&b, Path::new("m")) {
                assert_eq!(
                    img.data.len(),
                    img.width as usize * img.height as usize * img.channels.count()
                );
            }
            std::fs::write(&scratch, &b).unwrap();
            let _ = read_text_metadata(&scratch);
        }
    }
}
