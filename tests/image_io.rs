//! PNG reading against PIL-decoded fixtures, round trips, atomic replace, corrupt inputs.

use std::path::{Path, PathBuf};

use sd_cli::image_io::{
    format_text_chunks, read_png, read_png_from_bytes, read_png_text_chunks, read_png_text_pairs,
    write_generation_png, write_png_atomic, Channels, GenerationParams, Image, ImageIoError,
    TextKind, JSON_KEYWORD, PARAMETERS_KEYWORD,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/image_io")
        .join(name)
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("json")
}

fn test_image(w: u32, h: u32, ch: Channels) -> Image {
    let n = (w * h) as usize * ch.count();
    let data = (0..n).map(|i| ((i * 37 + 11) % 256) as u8).collect();
    Image::new(w, h, ch, data).expect("image")
}

fn only_tmp_free(dir: &Path) -> bool {
    std::fs::read_dir(dir).expect("dir").all(|e| {
        !e.expect("entry")
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")
    })
}

/// Every colour type/bit depth decodes to exactly PIL's 8-bit RGB(A) values (tolerance 0).
#[test]
fn decodes_all_color_types_like_pil() {
    let exp = expected();
    let images = exp["images"].as_object().expect("images");
    assert!(images.len() >= 8);
    for (name, e) in images {
        let img = read_png(&fixture(name)).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(img.width as u64, e["width"].as_u64().unwrap(), "{name}");
        assert_eq!(img.height as u64, e["height"].as_u64().unwrap(), "{name}");
        assert_eq!(
            img.channels.count() as u64,
            e["channels"].as_u64().unwrap(),
            "{name}"
        );
        let want: Vec<u8> = e["pixels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u8)
            .collect();
        let mismatches = img.data.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(img.data.len(), want.len(), "{name}");
        assert_eq!(
            mismatches, 0,
            "{name}: {mismatches} pixel bytes differ from PIL"
        );
    }
}

#[test]
fn reads_text_chunks_of_all_kinds_in_order() {
    let exp = expected();
    let want = exp["text_chunks"].as_array().unwrap();
    let got = read_png_text_chunks(&fixture("text_chunks.png")).expect("chunks");
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.kind.as_str(), w[0].as_str().unwrap());
        assert_eq!(g.keyword, w[1].as_str().unwrap());
        assert_eq!(g.text, w[2].as_str().unwrap(), "chunk {}", g.keyword);
    }
    let printed = format_text_chunks(&fixture("text_chunks.png"), &got);
    assert!(printed.contains("Chunk: zTXt\n  keyword: Comment\n"));
    assert!(printed.contains("    caf\u{e9} \u{732b}\n"));
}

#[test]
fn round_trip_rgb_and_rgba_with_metadata() {
    let dir = tempfile::tempdir().expect("tmp");
    for ch in [Channels::Rgb, Channels::Rgba] {
        let img = test_image(13, 9, ch);
        let mut p = GenerationParams::new();
        p.prompt = "a lovely cat, \u{732b}".into();
        p.negative_prompt = "blurry".into();
        p.seed = 43;
        p.sampler = "euler".into();
        p.scheduler = Some("discrete".into());
        p.diffusion_model = Some("pixart.safetensors".into());
        p.width = 13;
        p.height = 9;
        let path = dir.path().join(format!("out_{}.png", ch.count()));
        write_generation_png(&path, &img, Some(&p)).expect("write");
        let back = read_png(&path).expect("read");
        assert_eq!(back, img);
        let pairs = read_png_text_pairs(&path).expect("text");
        let params = &pairs
            .iter()
            .find(|(k, _)| k == PARAMETERS_KEYWORD)
            .expect("parameters")
            .1;
        assert!(params.starts_with(
            "a lovely cat, \u{732b}\nNegative prompt: blurry\nSteps: 20, CFG scale: 7.000000, "
        ));
        assert!(params.contains(
            "Seed: 43, Size: 13x9, Model: pixart.safetensors, RNG: cuda, Sampler: euler discrete, "
        ));
        let json = &pairs
            .iter()
            .find(|(k, _)| k == JSON_KEYWORD)
            .expect("json")
            .1;
        assert_eq!(GenerationParams::from_json(json).expect("parse"), p);
        // Non-Latin-1 text must go to iTXt, Latin-1 text to tEXt.
        let chunks = read_png_text_chunks(&path).expect("chunks");
        assert!(chunks.iter().all(|c| c.kind == TextKind::ITXt
            || c.keyword == JSON_KEYWORD
            || c.kind == TextKind::TEXt));
        assert_eq!(
            chunks
                .iter()
                .find(|c| c.keyword == PARAMETERS_KEYWORD)
                .unwrap()
                .kind,
            TextKind::ITXt
        );
    }
    assert!(only_tmp_free(dir.path()));
}

#[test]
fn latin1_parameters_use_text_chunk_and_no_metadata_means_no_chunks() {
    let dir = tempfile::tempdir().expect("tmp");
    let img = test_image(4, 4, Channels::Rgb);
    let mut p = GenerationParams::new();
    p.prompt = "caf\u{e9}".into();
    let path = dir.path().join("a.png");
    write_generation_png(&path, &img, Some(&p)).expect("write");
    let chunks = read_png_text_chunks(&path).expect("chunks");
    assert_eq!(chunks[0].kind, TextKind::TEXt);
    assert_eq!(chunks[0].text.lines().next(), Some("caf\u{e9}"));
    write_generation_png(&path, &img, None).expect("write");
    assert!(read_png_text_chunks(&path).expect("chunks").is_empty());
}

#[test]
fn atomic_replace_keeps_old_file_on_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("out.png");
    let first = test_image(8, 8, Channels::Rgb);
    write_png_atomic(&path, &first, &[]).expect("first");
    let second = test_image(16, 4, Channels::Rgba);
    write_png_atomic(&path, &second, &[("k".into(), "v".into())]).expect("replace");
    assert_eq!(read_png(&path).expect("read"), second);

    // A write that fails (bad keyword) leaves the previous file and no temp file behind.
    let err = write_png_atomic(&path, &first, &[("".into(), "v".into())]).unwrap_err();
    assert!(matches!(err, ImageIoError::Encode { .. }), "{err}");
    // A write that fails in the encoder (buffer too short) likewise.
    let bad = Image {
        width: 8,
        height: 8,
        channels: Channels::Rgb,
        data: vec![0; 10],
    };
    assert!(matches!(
        write_png_atomic(&path, &bad, &[]),
        Err(ImageIoError::BadBuffer { .. })
    ));
    assert_eq!(read_png(&path).expect("read"), second);
    assert!(only_tmp_free(dir.path()));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    // Missing directory: clear error naming the path, nothing created.
    let missing = dir.path().join("nope/out.png");
    let err = write_png_atomic(&missing, &first, &[]).unwrap_err();
    assert!(err.to_string().contains("nope/out.png"), "{err}");
}

#[test]
fn corrupt_inputs_give_errors_not_panics() {
    let good = std::fs::read(fixture("rgb8.png")).expect("fixture");
    let name = Path::new("x.png");
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("signature only", good[..8].to_vec()),
        ("not png", b"GIF89a this is not a png".to_vec()),
        ("truncated half", good[..good.len() / 2].to_vec()),
        ("truncated tail", good[..good.len() - 5].to_vec()),
    ];
    let mut bad_crc = good.clone();
    bad_crc[29] ^= 0xff; // inside IHDR's CRC
    cases.push(("bad ihdr crc", bad_crc));
    let mut flipped = good.clone();
    let idat = flipped.windows(4).position(|w| w == b"IDAT").expect("idat");
    for b in &mut flipped[idat + 6..idat + 20] {
        *b ^= 0x5a;
    }
    cases.push(("corrupt idat", flipped));
    let mut huge_len = good.clone();
    huge_len[33..37].copy_from_slice(&u32::MAX.to_be_bytes());
    cases.push(("huge chunk length", huge_len));
    for (what, bytes) in &cases {
        let r = std::panic::catch_unwind(|| read_png_from_bytes(bytes, name));
        let r = r.unwrap_or_else(|_| panic!("{what}: decoder panicked"));
        assert!(r.is_err(), "{what}: expected an error");
        let msg = r.unwrap_err().to_string();
        assert!(
            msg.contains("x.png"),
            "{what}: error does not name the file: {msg}"
        );
    }
    // Text-chunk reader on the same inputs: errors, no panics.
    let dir = tempfile::tempdir().expect("tmp");
    for (what, bytes) in &cases {
        let p = dir.path().join("c.png");
        std::fs::write(&p, bytes).expect("write");
        let r = std::panic::catch_unwind(|| read_png_text_chunks(&p));
        let r = r.unwrap_or_else(|_| panic!("{what}: text reader panicked"));
        if *what != "corrupt idat" && *what != "bad ihdr crc" {
            assert!(r.is_err(), "{what}: expected an error from the text reader");
        }
    }
}

#[test]
fn oversized_header_is_rejected_before_allocation() {
    // A valid-looking 100000x100000 RGB header with a tiny IDAT.
    let mut png = vec![0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&100_000u32.to_be_bytes());
    ihdr.extend_from_slice(&100_000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    push_chunk(&mut png, b"IHDR", &ihdr);
    push_chunk(
        &mut png,
        b"IDAT",
        &[0x78, 0x01, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    );
    push_chunk(&mut png, b"IEND", &[]);
    let err = read_png_from_bytes(&png, Path::new("big.png")).unwrap_err();
    assert!(
        matches!(err, ImageIoError::TooLarge { width: 100_000, .. }),
        "{err}"
    );
}

fn push_chunk(out: &mut Vec<u8>, kind: &[u8; 4], body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    let mut crc = 0xffff_ffffu32;
    for &b in &out[start..] {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    out.extend_from_slice(&(!crc).to_be_bytes());
}

#[test]
fn to_rgb_drops_alpha() {
    let img = Image::new(2, 1, Channels::Rgba, vec![1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    assert_eq!(img.to_rgb().data, vec![1, 2, 3, 5, 6, 7]);
    assert!(Image::new(2, 2, Channels::Rgb, vec![0; 11]).is_err());
}
