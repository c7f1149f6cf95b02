//! Hostile-input corpus: every class of corrupt safetensors / GGUF / tokenizer / PNG input
//! gives its specific error (never a panic), seeded random mutations of valid tiny files never
//! panic, samples of the corpus fail cleanly through the real binary, and outputs are replaced
//! only by complete files. The generators live in `tests/hostile/`; nothing binary is committed.
//! `cargo test --test hostile_corpus -- --nocapture` prints the case counts per class.

mod hostile;

use std::path::Path;

use hostile::cli::{assert_clean_failure, sd_cli};
use hostile::png::PngErr;
use hostile::tokenizers::{TokErr, PROMPTS};
use hostile::{mutate, no_panic, Case, Rng, Tally};
use sd_cli::image_io::{read_png, read_png_from_bytes, read_png_text_chunks, ImageIoError};
use sd_cli::tokenizers::{
    from_gguf_vocab, from_spiece_model, from_tokenizer_json, load_t5_tokenizer, T5Tokenizer,
    TokenizerError,
};
use sd_cli::weights::gguf::parse_gguf;
use sd_cli::weights::safetensors::parse_safetensors;
use sd_cli::weights::{TensorStore, WeightsError};

const MUTATIONS_PER_MODEL: usize = 600;

fn check_weights_cases(
    title: &str,
    cases: &[hostile::safetensors::WCase],
    parse: impl Fn(&[u8], &Path) -> Result<(), WeightsError>,
) -> Tally {
    let path = Path::new("hostile-input.bin");
    let mut tally = Tally::default();
    for c in cases {
        let what = format!("{title} {}: {}", c.case.class, c.case.name);
        let r = no_panic(&what, || parse(&c.case.bytes, path));
        match r {
            Ok(()) => panic!("{what}: accepted, expected {}", c.variant),
            Err(e) => {
                assert!((c.expect)(&e), "{what}: got {e:?}, expected {}", c.variant);
                assert!(e.to_string().contains("hostile-input.bin"), "{what}: {e}");
            }
        }
        tally.add(c.case.class);
    }
    tally.print(title);
    tally
}

#[test]
fn safetensors_corpus_gives_specific_errors() {
    let cases = hostile::safetensors::cases();
    let t = check_weights_cases("safetensors", &cases, |b, p| {
        parse_safetensors(b, p).map(|_| ())
    });
    assert!(t.total() >= 300, "only {} cases", t.total());
    assert!(t.0.len() >= 12, "only {} classes", t.0.len());
}

#[test]
fn gguf_corpus_gives_specific_errors() {
    let cases = hostile::gguf::cases();
    let t = check_weights_cases("gguf", &cases, |b, p| parse_gguf(b, p).map(|_| ()));
    assert!(t.total() >= 300, "only {} cases", t.total());
    assert!(t.0.len() >= 15, "only {} classes", t.0.len());
}

/// Files that are neither format: the store reports `BadMagic` naming the file.
#[test]
fn unrecognised_files_are_bad_magic() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(7);
    let mut inputs: Vec<Vec<u8>> = vec![
        vec![],
        b"G".to_vec(),
        b"GGU".to_vec(),
        b"gguf\x03\0\0\0".to_vec(),
        b"\x80\x02}q\x00(X".to_vec(), // a pickle without torch's legacy magic number
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(),
        b"\0\0\0\0\0\0\0\0[".to_vec(),
        b"<html><body>404</body></html>".to_vec(),
        b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n".to_vec(),
    ];
    for n in [9usize, 64, 1000] {
        for _ in 0..5 {
            let mut b: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            if b.len() > 8 && b[8] == b'{' {
                b[8] = b'}';
            }
            if b.starts_with(b"GGUF") {
                b[0] = 0;
            }
            inputs.push(b);
        }
    }
    for (i, b) in inputs.iter().enumerate() {
        let p = dir.path().join(format!("junk{i}.bin"));
        std::fs::write(&p, b).unwrap();
        match no_panic(&format!("junk {i}"), || TensorStore::open(&p)) {
            Err(WeightsError::BadMagic { path }) => assert_eq!(path, p),
            other => panic!("junk {i}: {other:?}"),
        }
    }
    eprintln!("bad_magic (store): {} cases", inputs.len());
    // A ZIP header is a PyTorch checkpoint's magic: a cut-off one is a broken archive.
    let p = dir.path().join("zip_header.ckpt");
    std::fs::write(&p, b"PK\x03\x04\x14\0\0\0\0\0").unwrap();
    match no_panic("zip header", || TensorStore::open(&p)) {
        Err(WeightsError::BadZip { path, .. }) => assert_eq!(path, p),
        other => panic!("zip header: {other:?}"),
    }
}

/// Parses `bytes`; when the parser accepts them, loads every tensor through the store too.
fn exercise_weights(bytes: &[u8], gguf: bool, scratch: &Path, what: &str) {
    let path = Path::new("mutant.bin");
    let r = no_panic(what, || {
        if gguf {
            parse_gguf(bytes, path).map(|_| ())
        } else {
            parse_safetensors(bytes, path).map(|_| ())
        }
    });
    match r {
        Err(e) => assert!(e.to_string().contains("mutant.bin"), "{what}: {e}"),
        Ok(()) => {
            std::fs::write(scratch, bytes).unwrap();
            no_panic(what, || {
                if let Ok(store) = TensorStore::open(scratch) {
                    for t in store.iter() {
                        let _ = store.load_bytes(t);
                        let _ = store.to_f32(t);
                    }
                }
            });
        }
    }
}

#[test]
fn weights_random_mutations_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("mutant.bin");
    let st_models: Vec<Vec<u8>> = hostile::safetensors::valid_models()
        .iter()
        .map(|(h, d)| hostile::safetensors::st(h, d))
        .collect();
    let gguf_models = hostile::gguf::valid_models();
    let mut tally = Tally::default();
    for (m, good) in st_models.iter().enumerate() {
        assert!(parse_safetensors(good, Path::new("x")).is_ok(), "model {m}");
        let donor = &st_models[(m + 1) % st_models.len()];
        let mut rng = Rng::new(1000 + m as u64);
        for i in 0..MUTATIONS_PER_MODEL {
            let (desc, bad) = mutate(&mut rng, good, donor, &hostile::safetensors::fields());
            exercise_weights(&bad, false, &scratch, &format!("st model {m} #{i}: {desc}"));
            tally.add("st_random_mutation");
        }
        for cut in 0..good.len() {
            exercise_weights(
                &good[..cut],
                false,
                &scratch,
                &format!("st model {m} cut {cut}"),
            );
            tally.add("st_every_truncation");
        }
    }
    for c in hostile::safetensors::number_edits() {
        exercise_weights(&c.bytes, false, &scratch, &c.name);
        tally.add(c.class);
    }
    for (m, (good, fields)) in gguf_models.iter().enumerate() {
        assert!(parse_gguf(good, Path::new("x")).is_ok(), "gguf model {m}");
        let donor = &gguf_models[(m + 1) % gguf_models.len()].0;
        let mut rng = Rng::new(2000 + m as u64);
        for i in 0..MUTATIONS_PER_MODEL {
            let (desc, bad) = mutate(&mut rng, good, donor, fields);
            exercise_weights(
                &bad,
                true,
                &scratch,
                &format!("gguf model {m} #{i}: {desc}"),
            );
            tally.add("gguf_random_mutation");
        }
        // Every length/count field set to every hostile value.
        for f in fields {
            let orig = u64::from_le_bytes({
                let mut a = [0u8; 8];
                a[..f.width as usize].copy_from_slice(&good[f.at..f.at + f.width as usize]);
                a
            });
            for v in hostile::interesting_u64(orig, good.len() as u64) {
                let mut bad = good.clone();
                bad[f.at..f.at + f.width as usize]
                    .copy_from_slice(&v.to_le_bytes()[..f.width as usize]);
                exercise_weights(
                    &bad,
                    true,
                    &scratch,
                    &format!("gguf model {m} field @{} = {v}", f.at),
                );
                tally.add("gguf_length_field_edit");
            }
        }
    }
    tally.print("weights mutations");
}

// ---------------------------------------------------------------------------------------------
// Tokenizers

fn tok_kind(e: &TokenizerError) -> Option<TokErr> {
    match e {
        TokenizerError::Format { .. } => Some(TokErr::Format),
        TokenizerError::Unsupported { .. } => Some(TokErr::Unsupported),
        TokenizerError::Vocab { .. } => Some(TokErr::Vocab),
        _ => None,
    }
}

/// Encodes the test prompts; every id must index the vocabulary.
fn exercise_tokenizer(tok: &T5Tokenizer, what: &str) {
    let n = tok.model().len();
    for p in PROMPTS {
        let long = p.repeat(50);
        for text in [p.to_string(), long] {
            let enc = no_panic(what, || tok.encode(&text, 300, true));
            for &id in &enc.ids {
                assert!(
                    id >= 0 && (id as usize) < n,
                    "{what}: id {id} outside vocab {n} for {text:?}"
                );
            }
        }
    }
}

fn check_tok_cases(
    title: &str,
    cases: &[(Case, TokErr)],
    load: impl Fn(&[u8]) -> Result<T5Tokenizer, TokenizerError>,
) -> Tally {
    let mut tally = Tally::default();
    for (c, want) in cases {
        let what = format!("{title} {}: {}", c.class, c.name);
        match no_panic(&what, || load(&c.bytes)) {
            Ok(_) => panic!("{what}: accepted, expected {want:?}"),
            Err(e) => assert_eq!(tok_kind(&e), Some(*want), "{what}: got {e}"),
        }
        tally.add(c.class);
    }
    tally.print(title);
    tally
}

#[test]
fn tokenizer_json_corpus_gives_specific_errors() {
    let good = hostile::tokenizers::tokenizer_json(&[]);
    let tok = from_tokenizer_json(&good, "tokenizer.json").expect("valid tokenizer.json");
    exercise_tokenizer(&tok, "good tokenizer.json");
    let cases = hostile::tokenizers::json_cases();
    let t = check_tok_cases("tokenizer.json", &cases, |b| {
        from_tokenizer_json(std::str::from_utf8(b).expect("utf8"), "tokenizer.json")
    });
    assert!(t.total() >= 80, "{}", t.total());
}

#[test]
fn spiece_corpus_gives_specific_errors() {
    let good = hostile::tokenizers::good_spiece();
    let tok = from_spiece_model(&good, 100, "spiece.model").expect("valid spiece.model");
    exercise_tokenizer(&tok, "good spiece.model");
    let cases = hostile::tokenizers::spiece_cases();
    let t = check_tok_cases("spiece.model", &cases, |b| {
        from_spiece_model(b, 100, "spiece.model")
    });
    assert!(t.total() >= 60, "{}", t.total());
}

#[test]
fn gguf_vocab_corpus_gives_specific_errors() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let toks = s(&["<pad>", "</s>", "<unk>", "▁", "a"]);
    let ok = from_gguf_vocab(toks.clone(), vec![0.0; 5], vec![3, 3, 2, 1, 1], None).expect("valid");
    exercise_tokenizer(&ok, "gguf vocab");
    let cases: Vec<(&str, Result<T5Tokenizer, TokenizerError>, TokErr)> = vec![
        (
            "fewer scores",
            from_gguf_vocab(toks.clone(), vec![0.0; 4], vec![1; 5], None),
            TokErr::Vocab,
        ),
        (
            "more types",
            from_gguf_vocab(toks.clone(), vec![0.0; 5], vec![1; 6], None),
            TokErr::Vocab,
        ),
        (
            "empty",
            from_gguf_vocab(vec![], vec![], vec![], None),
            TokErr::Vocab,
        ),
        (
            "nan score",
            from_gguf_vocab(
                toks.clone(),
                vec![0.0, 0.0, 0.0, f32::NAN, 0.0],
                vec![3, 3, 2, 1, 1],
                None,
            ),
            TokErr::Vocab,
        ),
        (
            "inf score",
            from_gguf_vocab(
                toks.clone(),
                vec![f32::NEG_INFINITY; 5],
                vec![3, 3, 2, 1, 1],
                None,
            ),
            TokErr::Vocab,
        ),
        (
            "no unk",
            from_gguf_vocab(s(&["</s>", "a"]), vec![0.0; 2], vec![3, 1], None),
            TokErr::Vocab,
        ),
        (
            "no eos",
            from_gguf_vocab(s(&["<unk>", "a"]), vec![0.0; 2], vec![2, 1], None),
            TokErr::Vocab,
        ),
        (
            "bad charsmap",
            from_gguf_vocab(
                toks.clone(),
                vec![0.0; 5],
                vec![3, 3, 2, 1, 1],
                Some(&[9, 0, 0, 0, 1]),
            ),
            TokErr::Format,
        ),
        (
            "empty-trie charsmap",
            from_gguf_vocab(
                toks.clone(),
                vec![0.0; 5],
                vec![3, 3, 2, 1, 1],
                Some(&[0, 0, 0, 0]),
            ),
            TokErr::Format,
        ),
    ];
    for (what, r, want) in &cases {
        match r {
            Ok(_) => panic!("gguf vocab {what}: accepted"),
            Err(e) => assert_eq!(tok_kind(e), Some(*want), "gguf vocab {what}: {e}"),
        }
    }
    // Odd piece types (any i32) and odd token text are accepted or rejected, never a panic.
    let mut rng = Rng::new(5);
    for i in 0..200 {
        let n = 1 + rng.below(8);
        let mut t: Vec<String> = (0..n)
            .map(|_| {
                ["<unk>", "</s>", "", "▁", "a", "\u{0}", "<0x41>", "ab"][rng.below(8)].to_string()
            })
            .collect();
        t.push("</s>".into());
        let scores: Vec<f32> = (0..t.len())
            .map(|_| (rng.next_u64() % 100) as f32 / -10.0)
            .collect();
        let types: Vec<i32> = (0..t.len()).map(|_| rng.next_u64() as i32 % 8).collect();
        if let Ok(tok) = no_panic(&format!("gguf vocab random {i}"), || {
            from_gguf_vocab(t.clone(), scores, types, None)
        }) {
            exercise_tokenizer(&tok, &format!("gguf vocab random {i}"));
        }
    }
    eprintln!(
        "gguf vocab: {} cases + 200 random vocabularies",
        cases.len()
    );
}

#[test]
fn tokenizer_random_mutations_never_panic() {
    let json = hostile::tokenizers::tokenizer_json(&[]).into_bytes();
    let spm = hostile::tokenizers::good_spiece();
    let fixture = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenizers/spm/tiny.model"
    ))
    .unwrap();
    let mut tally = Tally::default();
    let mut rng = Rng::new(42);
    for i in 0..1500 {
        let (desc, bad) = mutate(&mut rng, &json, &spm, &[]);
        let what = format!("tokenizer.json #{i}: {desc}");
        if let Ok(text) = std::str::from_utf8(&bad) {
            if let Ok(tok) = no_panic(&what, || from_tokenizer_json(text, "t.json")) {
                exercise_tokenizer(&tok, &what);
            }
        }
        tally.add("json_random_mutation");
    }
    for (name, good, n) in [("spiece", &spm, 1500usize), ("tiny.model", &fixture, 150)] {
        for i in 0..n {
            let (desc, bad) = mutate(&mut rng, good, &json, &[]);
            let what = format!("{name} #{i}: {desc}");
            if let Ok(tok) = no_panic(&what, || from_spiece_model(&bad, 100, "s.model")) {
                exercise_tokenizer(&tok, &what);
            }
            tally.add("spm_random_mutation");
        }
    }
    tally.print("tokenizer mutations");
}

// ---------------------------------------------------------------------------------------------
// PNG

#[test]
fn png_corpus_gives_specific_errors() {
    let good = hostile::png::good_png();
    let img = read_png_from_bytes(&good, Path::new("good.png")).expect("valid png");
    assert_eq!((img.width, img.height), (3, 2));
    let mut tally = Tally::default();
    for (c, want) in hostile::png::cases() {
        let what = format!("png {}: {}", c.class, c.name);
        let r = no_panic(&what, || {
            read_png_from_bytes(&c.bytes, Path::new("hostile.png"))
        });
        let e = match r {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => e,
        };
        let ok = match want {
            PngErr::Decode => matches!(e, ImageIoError::Decode { .. }),
            PngErr::TooLarge => matches!(e, ImageIoError::TooLarge { .. }),
            PngErr::DecodeOrTooLarge => matches!(
                e,
                ImageIoError::Decode { .. } | ImageIoError::TooLarge { .. }
            ),
        };
        assert!(ok, "{what}: got {e:?}, expected {want:?}");
        assert!(e.to_string().contains("hostile.png"), "{what}: {e}");
        tally.add(c.class);
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.png");
    for c in hostile::png::text_cases() {
        std::fs::write(&p, &c.bytes).unwrap();
        let what = format!("png text {}: {}", c.class, c.name);
        let r = no_panic(&what, || read_png_text_chunks(&p));
        assert!(
            matches!(r, Err(ImageIoError::Decode { .. })),
            "{what}: {r:?}"
        );
        tally.add(c.class);
    }
    tally.print("png");
    assert!(tally.total() >= 200, "{}", tally.total());
}

#[test]
fn png_random_mutations_never_panic() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/image_io");
    let mut files: Vec<Vec<u8>> = vec![hostile::png::good_png()];
    for e in std::fs::read_dir(fixtures).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "png") {
            files.push(std::fs::read(&p).unwrap());
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("m.png");
    let mut rng = Rng::new(99);
    let mut n = 0;
    for (f, good) in files.iter().enumerate() {
        let donor = &files[(f + 1) % files.len()];
        for i in 0..300 {
            let (desc, bad) = mutate(&mut rng, good, donor, &[]);
            let what = format!("png {f} #{i}: {desc}");
            let _ = no_panic(&what, || read_png_from_bytes(&bad, Path::new("m.png")));
            std::fs::write(&scratch, &bad).unwrap();
            let _ = no_panic(&what, || read_png_text_chunks(&scratch));
            n += 1;
        }
    }
    eprintln!("png mutations: {n} cases over {} files", files.len());
}

// ---------------------------------------------------------------------------------------------
// Regressions named after what they found

/// Endless or oversized inputs were read whole with `fs::read` (unbounded allocation).
#[test]
fn hostile_unbounded_read_of_endless_device() {
    let zero = Path::new("/dev/zero");
    if !zero.exists() {
        return;
    }
    assert!(matches!(read_png(zero), Err(ImageIoError::Decode { .. })));
    assert!(matches!(
        read_png_text_chunks(zero),
        Err(ImageIoError::Decode { .. })
    ));
    assert!(matches!(
        load_t5_tokenizer(zero),
        Err(TokenizerError::Format { .. })
    ));
}

/// tokenizer.json could emit ids past the vocabulary (added tokens, post-processor), which the
/// text encoder would use to index its embedding table.
#[test]
fn hostile_tokenizer_json_id_outside_vocab() {
    let added = r#"[{"id":4294967295,"content":"x","special":true}]"#;
    let text = hostile::tokenizers::tokenizer_json(&[("added_tokens", added)]);
    assert!(matches!(
        from_tokenizer_json(&text, "t.json"),
        Err(TokenizerError::Vocab { .. })
    ));
}

/// An empty safetensors tensor with a huge other dimension was accepted (its ggml strides
/// overflow).
#[test]
fn hostile_safetensors_empty_tensor_huge_dim() {
    let h = r#"{"w":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}}"#;
    let r = parse_safetensors(&hostile::safetensors::st(h, &[]), Path::new("x"));
    assert!(matches!(r, Err(WeightsError::BadShape { .. })), "{r:?}");
}

/// Fuzz finding (target `png`, found within 4 min): the png crate 0.17 panicked ("range end
/// index 3 out of range for slice of length 1" in palette expansion) on an indexed image whose
/// PLTE chunk is 28 bytes long. This is the crash input as found; it must now be a Decode error.
#[test]
fn fuzz_png_palette_not_multiple_of_3_panic() {
    let hex = concat!(
        "89504e470d0a1a0a0000000d4948445200000007000000050203000000f4f41e4b0000001c504c54",
        "450a141ec8643200ff00ffffff5a0e83110000000489504e470d0a1a0a89504e470d000017494441",
        "54789c63f85dc0666666666666666666666666664c54450a14bb51bd9f0203000000f4f41e4b0000",
        "00000c504c54450a14000c504c000000000000000c",
    );
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let r = no_panic("png crash input", || {
        read_png_from_bytes(&bytes, Path::new("crash.png"))
    });
    assert!(
        matches!(r, Err(ImageIoError::Decode { ref message, .. }) if message.contains("PLTE")),
        "{r:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("crash.png");
    std::fs::write(&p, &bytes).unwrap();
    let _ = no_panic("png crash input, text reader", || read_png_text_chunks(&p));
}

// ---------------------------------------------------------------------------------------------
// Through the binary

#[test]
fn binary_fails_cleanly_on_corpus_samples() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out_gguf = d.join("out.gguf");
    let mut runs = 0;
    // The first and the last case of every class, through the real binary.
    let sample = |cases: Vec<hostile::safetensors::WCase>| {
        let mut by_class: std::collections::BTreeMap<&str, Vec<Case>> = Default::default();
        for c in cases {
            by_class.entry(c.case.class).or_default().push(c.case);
        }
        let mut picked = Vec::new();
        for (_, mut v) in by_class {
            let last = v.pop();
            if !v.is_empty() {
                picked.push(v.swap_remove(0));
            }
            picked.extend(last);
        }
        picked
    };
    let mut all: Vec<(Case, &str)> = Vec::new();
    all.extend(
        sample(hostile::safetensors::cases())
            .into_iter()
            .map(|c| (c, "safetensors")),
    );
    all.extend(
        sample(hostile::gguf::cases())
            .into_iter()
            .map(|c| (c, "gguf")),
    );
    for (i, (c, ext)) in all.iter().enumerate() {
        let name = format!("bad_{}_{i}.{ext}", c.class);
        let p = d.join(&name);
        std::fs::write(&p, &c.bytes).unwrap();
        let what = format!("{ext} {}: {}", c.class, c.name);
        let o = sd_cli(&[
            "-M",
            "convert",
            "-m",
            p.to_str().unwrap(),
            "-o",
            out_gguf.to_str().unwrap(),
        ]);
        assert_clean_failure(&o, &name, &format!("convert {what}"));
        assert!(!out_gguf.exists(), "{what}: convert left an output behind");
        runs += 1;
        if i % 3 == 0 {
            let o = sd_cli(&[
                "--diffusion-model",
                p.to_str().unwrap(),
                "-p",
                "x",
                "-o",
                d.join("o.png").to_str().unwrap(),
            ]);
            assert_clean_failure(&o, &name, &format!("img_gen {what}"));
            runs += 1;
        }
    }
    // PNG metadata mode.
    let mut pngs: Vec<Case> = hostile::png::cases()
        .into_iter()
        .map(|(c, _)| c)
        .filter(|c| c.class != "png_too_large")
        .step_by(6)
        .collect();
    pngs.extend(hostile::png::text_cases().into_iter().step_by(25));
    for (i, c) in pngs.iter().enumerate() {
        let name = format!("bad_{i}.png");
        let p = d.join(&name);
        std::fs::write(&p, &c.bytes).unwrap();
        let o = sd_cli(&["-M", "metadata", "--image", p.to_str().unwrap()]);
        // The text reader walks chunks only: a valid chunk walk with a broken image is fine.
        if o.status.code() != Some(0) {
            assert_clean_failure(&o, &name, &format!("metadata {}: {}", c.class, c.name));
        }
        assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
        runs += 1;
    }
    eprintln!("binary runs: {runs}");
    assert!(runs >= 60, "{runs}");
}
