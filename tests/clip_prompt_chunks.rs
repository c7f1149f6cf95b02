//! Prompt emphasis (`parse_emphasis`) and the SD conditioner's 77-token chunks
//! (`tokenize_weighted`), as upstream sd-cli does them.
//!
//! The rules below are written down from upstream's source: `parse_prompt_attention`
//! (src/core/util.cpp), `FrozenCLIPEmbedderWithCustomWords::tokenize` (conditioning/
//! conditioner.hpp) and `Tokenizer::pad_tokens` (tokenizers/tokenizer.cpp). The fixtures
//! (tests/reference/clip_tokenizer_fixtures.py) hold a Python transcription of the same code run
//! on a few hundred handwritten and random prompts; that transcription was checked against
//! upstream's C++ compiled from the Aug 2026 snapshot (0 differences on 5162 prompts × 2 pads
//! × with / without custom words). Weights are compared bit for bit.

use sd_cli::tokenizers::clip::{tokenize_weighted, CLIP_CHUNK_LEN};
use sd_cli::tokenizers::{parse_emphasis, ClipTokenizer, CustomWords, PromptChunk};
use serde::Deserialize;

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/clip_tokenizer");
const BOS: i32 = 49406;
const EOS: i32 = 49407;
const A: i32 = 320;
const B: i32 = 321;
const CAT: i32 = 2368;
/// Upstream's multipliers are `float`: 1.1f and 1 / 1.1f.
const R: f32 = 1.1;
const S: f32 = 1.0 / 1.1;

fn parts(prompt: &str) -> Vec<(String, f32)> {
    parse_emphasis(prompt)
        .unwrap_or_else(|e| panic!("{prompt:?}: {e}"))
        .into_iter()
        .map(|p| (p.text, p.weight))
        .collect()
}

fn p(text: &str, weight: f32) -> (String, f32) {
    (text.to_string(), weight)
}

#[test]
fn emphasis_rules() {
    // Brackets: ( ) ×1.1, [ ] ÷1.1, (x:w) ×w; they nest and multiply.
    assert_eq!(
        parts("an (important) word"),
        [p("an ", 1.0), p("important", R), p(" word", 1.0)]
    );
    assert_eq!(parts("[a]"), [p("a", S)]);
    assert_eq!(parts("((a))"), [p("a", R * R)]);
    assert_eq!(parts("[(a:1.5)]"), [p("a", 1.5 * S)]);
    assert_eq!(parts("(a:-1)"), [p("a", -1.0)]);
    // The upstream doc example, in f32: "on" is 1/1.1·1.1 = 1 exactly, so it does not merge
    // with its 1.1 neighbours.
    assert_eq!(
        parts("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky)))."),
        [
            p("a ", 1.0),
            p("house", 1.3 * R * R),
            p(" ", R),
            p("on", S * R),
            p(" a ", R),
            p("hill", 0.5 * R),
            p(", sun, ", R),
            p("sky", R * R * R * R),
            p(".", R),
        ]
    );
    // Unclosed brackets apply to the end of the prompt; unmatched closers are text.
    assert_eq!(parts("(unbalanced"), [p("unbalanced", R)]);
    assert_eq!(parts("a [b"), [p("a ", 1.0), p("b", S)]);
    assert_eq!(parts("a) b]"), [p("a) b]", 1.0)]);
    // Equal neighbours merge; an empty prompt (or only brackets) is one empty part.
    assert_eq!(parts("(unnecessary)(parens)"), [p("unnecessaryparens", R)]);
    assert_eq!(parts(""), [p("", 1.0)]);
    assert_eq!(parts("()"), [p("", 1.0)]);
    // The weight is std::stof's longest number prefix; with no open "(" it is dropped.
    assert_eq!(parts("(a:1.2.3)"), [p("a", 1.2)]);
    assert_eq!(parts("(a:5.)"), [p("a", 5.0)]);
    assert_eq!(parts("a:1.5) b"), [p("a b", 1.0)]);
    // A weight must follow ':' directly and end at ')'; otherwise ':' is text.
    assert_eq!(parts("(a: 1.5)"), [p("a: 1.5", R)]);
    // Escapes: only \( loses its backslash.
    assert_eq!(parts("\\(a\\)"), [p("(a\\)", 1.0)]);
    assert_eq!(parts("\\[a\\] \\\\ \\x"), [p("\\[a\\] \\\\ \\x", 1.0)]);
    // BREAK: uppercase, no word character after it; anything may precede it.
    assert_eq!(
        parts("a BREAK b"),
        [p("a ", 1.0), p("BREAK", -1.0), p(" b", 1.0)]
    );
    assert_eq!(
        parts("aBREAK b"),
        [p("a", 1.0), p("BREAK", -1.0), p(" b", 1.0)]
    );
    assert_eq!(
        parts("a,BREAK,b"),
        [p("a,", 1.0), p("BREAK", -1.0), p(",b", 1.0)]
    );
    assert_eq!(
        parts("éBREAKé"),
        [p("é", 1.0), p("BREAK", -1.0), p("é", 1.0)]
    );
    assert_eq!(
        parts("BREAKfast Break break"),
        [p("BREAKfast Break break", 1.0)]
    );
    // A BREAK in brackets is scaled and no longer a break; two with nothing between merge.
    let scaled = parse_emphasis("(BREAK)").unwrap();
    assert_eq!(scaled[0].weight, -R);
    assert!(!scaled[0].is_break());
    let merged = parse_emphasis("BREAK[]BREAK").unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].text, "BREAKBREAK");
    assert!(!merged[0].is_break());
    assert!(parse_emphasis("x BREAK y").unwrap()[1].is_break());
    // Where upstream's std::stof throws (and sd-cli aborts): an error naming the weight.
    for bad in [
        "(a:.)",
        "(a:..5)",
        "(a:999999999999999999999999999999999999999)",
        "(a:0.000000000000000000000000000000000000001)",
    ] {
        let e = parse_emphasis(bad).expect_err(bad);
        assert!(e.to_string().contains("prompt weight"), "{e}");
    }
}

fn chunk(ids: &[i32], weights: &[f32], pad: i32) -> PromptChunk {
    let mut ids = ids.to_vec();
    let mut weights = weights.to_vec();
    ids.resize(CLIP_CHUNK_LEN, pad);
    weights.resize(CLIP_CHUNK_LEN, 1.0);
    PromptChunk { ids, weights }
}

fn rep<T: Clone>(x: T, n: usize) -> Vec<T> {
    vec![x; n]
}

#[test]
fn chunk_layouts() {
    let tok = ClipTokenizer::new().unwrap();
    let run = |prompt: &str, pad: i32| tokenize_weighted(&tok, prompt, pad).unwrap();

    // BREAK pads the tokens so far with EOS to 75; the next part starts a new chunk.
    assert_eq!(
        run("a BREAK b", EOS),
        [chunk(&[BOS, A], &[], EOS), chunk(&[BOS, B, EOS], &[], EOS)]
    );
    // SD2 pads chunks with 0, but a BREAK still pads with EOS.
    assert_eq!(
        run("a BREAK b", 0),
        [chunk(&[BOS, A], &[], EOS), chunk(&[BOS, B, EOS], &[], 0)]
    );
    // A leading BREAK and one right after another add nothing.
    assert_eq!(run("BREAK a BREAK BREAK", 0), [chunk(&[BOS, A], &[], EOS)]);

    // 75 tokens fill one chunk exactly; the 76th starts a second one (a hard cut, no comma
    // search as in A1111).
    let cats = |n: usize| vec!["cat"; n].join(" ");
    let full: Vec<i32> = [vec![BOS], rep(CAT, 75), vec![EOS]].concat();
    assert_eq!(run(&cats(75), EOS), [chunk(&full, &[], EOS)]);
    assert_eq!(
        run(&cats(76), 0),
        [chunk(&full, &[], 0), chunk(&[BOS, CAT, EOS], &[], 0)]
    );

    // Emphasis across the boundary: each token keeps its part's weight; BOS, EOS, pad are 1.
    let got = run(&format!("({}:1.5) a", cats(80)), EOS);
    let w0: Vec<f32> = [vec![1.0], rep(1.5, 75), vec![1.0]].concat();
    let w1: Vec<f32> = [vec![1.0], rep(1.5, 5), vec![1.0]].concat();
    let ids1: Vec<i32> = [vec![BOS], rep(CAT, 5), vec![A, EOS]].concat();
    assert_eq!(got, [chunk(&full, &w0, EOS), chunk(&ids1, &w1, EOS)]);

    // The empty prompt is one chunk.
    assert_eq!(run("", EOS), [chunk(&[BOS, EOS], &[], EOS)]);
}

#[test]
fn custom_words_become_consecutive_ids() {
    let mut tok = ClipTokenizer::new().unwrap();
    let mut words = CustomWords::new(tok.vocab_size() as i32);
    words.add("Style", 2).unwrap();
    words.add("bad-hands", 1).unwrap();
    tok.set_custom_words(words);
    let ids: Vec<_> = tok
        .custom_words()
        .iter()
        .map(|w| (w.name.to_string(), w.ids))
        .collect();
    // Byte order of the names: uppercase first.
    assert_eq!(
        ids,
        [
            ("Style".into(), 49408..49410),
            ("bad-hands".into(), 49410..49411)
        ]
    );
    let got = tokenize_weighted(&tok, "a (STYLE:1.2), Bad-Hands", EOS).unwrap();
    let comma = tok.encode(",")[0];
    assert_eq!(
        got,
        [chunk(
            &[BOS, A, 49408, 49409, comma, 49410, EOS],
            &[1.0, 1.0, 1.2, 1.2, 1.0, 1.0, 1.0],
            EOS
        )]
    );
}

#[derive(Deserialize)]
struct EmphasisCase {
    text: String,
    #[serde(default)]
    parts: Vec<(String, f64)>,
    #[serde(default)]
    error: bool,
}

#[test]
fn emphasis_matches_upstream_transcription() {
    let path = format!("{FIX}/emphasis_cases.json");
    let cases: Vec<EmphasisCase> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(cases.len() > 300);
    for c in &cases {
        match parse_emphasis(&c.text) {
            Err(e) => assert!(c.error, "{:?}: unexpected error {e}", c.text),
            Ok(got) => {
                assert!(!c.error, "{:?}: upstream throws, got {got:?}", c.text);
                let got: Vec<(String, u32)> = got
                    .into_iter()
                    .map(|p| (p.text, p.weight.to_bits()))
                    .collect();
                // JSON holds each f32 as the f64 of the same value.
                let want: Vec<(String, u32)> = c
                    .parts
                    .iter()
                    .map(|(t, w)| (t.clone(), (*w as f32).to_bits()))
                    .collect();
                assert_eq!(got, want, "{:?}", c.text);
            }
        }
    }
}

#[derive(Deserialize)]
struct FixtureChunk {
    ids: Vec<i32>,
    weights: Vec<f64>,
}

#[derive(Deserialize)]
struct ChunkCase {
    text: String,
    pad: i32,
    custom: Vec<(String, usize)>,
    #[serde(default)]
    chunks: Vec<FixtureChunk>,
    #[serde(default)]
    error: bool,
}

#[test]
fn chunks_match_upstream_transcription() {
    let path = format!("{FIX}/chunk_cases.json");
    let cases: Vec<ChunkCase> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(cases.len() > 100);
    let mut multi = 0;
    let mut tok = ClipTokenizer::new().unwrap();
    for c in &cases {
        let mut words = CustomWords::new(tok.vocab_size() as i32);
        for (name, rows) in &c.custom {
            words.add(name, *rows).unwrap();
        }
        tok.set_custom_words(words);
        let got = tokenize_weighted(&tok, &c.text, c.pad);
        if c.error {
            assert!(got.is_err(), "{:?}: upstream throws", c.text);
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{:?}: {e}", c.text));
        let want: Vec<PromptChunk> = c
            .chunks
            .iter()
            .map(|ch| PromptChunk {
                ids: ch.ids.clone(),
                weights: ch.weights.iter().map(|&w| w as f32).collect(),
            })
            .collect();
        assert_eq!(got, want, "{:?} (pad {})", c.text, c.pad);
        multi += usize::from(got.len() > 1);
    }
    assert!(multi > 10, "too few multi-chunk cases: {multi}");
}
