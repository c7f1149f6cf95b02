//! Hostile tokenizer.json and spiece.model inputs, and GGUF-style vocabularies.

use super::Case;

/// A valid minimal T5-style tokenizer.json; `parts` override top-level sections (raw JSON).
pub fn tokenizer_json(parts: &[(&str, &str)]) -> String {
    let mut sections = vec![
        ("model", r#"{"type":"Unigram","unk_id":2,"byte_fallback":false,"vocab":[["<pad>",0.0],["</s>",0.0],["<unk>",0.0],["▁",-1.0],["a",-2.0],["b",-2.5],["▁ab",-1.5],["<extra_id_0>",0.0]]}"#.to_string()),
        ("added_tokens", r#"[{"id":0,"content":"<pad>","special":true},{"id":1,"content":"</s>","special":true},{"id":2,"content":"<unk>","special":true},{"id":7,"content":"<extra_id_0>","special":true}]"#.to_string()),
        ("normalizer", r#"{"type":"Sequence","normalizers":[{"type":"Precompiled","precompiled_charsmap":"BAAAAAAAAAA="},{"type":"Replace","pattern":{"Regex":" {2,}"},"content":" "},{"type":"Strip","strip_left":true,"strip_right":true}]}"#.to_string()),
        ("pre_tokenizer", r#"{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}]}"#.to_string()),
        ("post_processor", r#"{"type":"TemplateProcessing","single":[{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],"special_tokens":{"</s>":{"id":"</s>","ids":[1],"tokens":["</s>"]}}}"#.to_string()),
    ];
    for (k, v) in parts {
        match sections.iter_mut().find(|(name, _)| name == k) {
            Some(s) => s.1 = v.to_string(),
            None => sections.push((k, v.to_string())),
        }
    }
    let body: Vec<String> = sections
        .iter()
        .filter(|(_, v)| v != "OMIT")
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// Expected error kind of a tokenizer case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokErr {
    Format,
    Unsupported,
    Vocab,
}

/// tokenizer.json corpus: (class, name, text, expected error).
pub fn json_cases() -> Vec<(Case, TokErr)> {
    use TokErr::*;
    let mut v = Vec::new();
    let mut add = |class: &'static str, name: &str, text: String, e: TokErr| {
        v.push((Case::new(class, name, text.into_bytes()), e));
    };
    let good = tokenizer_json(&[]);
    for cut in (1..good.len()).step_by(7) {
        if good.is_char_boundary(cut) {
            add(
                "json_truncated",
                &format!("cut {cut}"),
                good[..cut].to_string(),
                Format,
            );
        }
    }
    for (i, t) in [
        "{",
        "{]",
        "{\"model\":}",
        "{\"model\":1e999}",
        "{} x",
        "{\"a\":\"\\ud800\"}",
    ]
    .iter()
    .enumerate()
    {
        add("json_invalid", &format!("#{i}"), t.to_string(), Format);
    }
    add(
        "json_invalid",
        "nesting 10000",
        format!(
            "{{\"model\":{}1{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        ),
        Format,
    );
    add(
        "json_no_model",
        "model omitted",
        tokenizer_json(&[("model", "OMIT")]),
        Format,
    );
    add(
        "json_no_model",
        "root is object without model",
        "{}".into(),
        Format,
    );
    for m in [
        r#"{"type":"BPE","vocab":{}}"#,
        r#"{"type":"WordPiece"}"#,
        r#"{"type":"WordLevel"}"#,
        r#"{"type":""}"#,
    ] {
        add(
            "json_model_type",
            m,
            tokenizer_json(&[("model", m)]),
            Unsupported,
        );
    }
    for (i, m) in [
        r#"{"type":"Unigram","unk_id":0,"vocab":{}}"#,
        r#"{"type":"Unigram","unk_id":0,"vocab":[["a"]]}"#,
        r#"{"type":"Unigram","unk_id":0,"vocab":[[1,0.0]]}"#,
        r#"{"type":"Unigram","unk_id":0,"vocab":[["a","x"]]}"#,
        r#"{"type":"Unigram","unk_id":0,"vocab":[["a",0.0,1]]}"#,
        r#"{"type":"Unigram","unk_id":0,"vocab":null}"#,
        r#"{"type":"Unigram","unk_id":4294967296,"vocab":[["</s>",0.0]]}"#,
    ]
    .iter()
    .enumerate()
    {
        add(
            "json_bad_vocab",
            &format!("#{i}"),
            tokenizer_json(&[("model", m)]),
            Format,
        );
    }
    for (i, m) in [
        r#"{"type":"Unigram","unk_id":9,"vocab":[["</s>",0.0]]}"#,
        r#"{"type":"Unigram","unk_id":0,"vocab":[]}"#,
        r#"{"type":"Unigram","unk_id":4294967295,"vocab":[["</s>",0.0]]}"#,
    ]
    .iter()
    .enumerate()
    {
        add(
            "json_bad_unk",
            &format!("#{i}"),
            tokenizer_json(&[("model", m)]),
            Vocab,
        );
    }
    add(
        "json_bad_unk",
        "no unk_id",
        tokenizer_json(&[("model", r#"{"type":"Unigram","vocab":[["</s>",0.0]]}"#)]),
        Unsupported,
    );
    for (i, a) in [
        r#"[{"id":0}]"#,
        r#"[{"content":"x"}]"#,
        r#"[{"id":-1,"content":"x"}]"#,
        r#"[{"id":4294967296,"content":"x"}]"#,
        r#"[{"id":1.5,"content":"x"}]"#,
    ]
    .iter()
    .enumerate()
    {
        add(
            "json_bad_added",
            &format!("#{i}"),
            tokenizer_json(&[("added_tokens", a)]),
            Format,
        );
    }
    for a in [
        r#"[{"id":0,"content":"x","lstrip":true}]"#,
        r#"[{"id":0,"content":"x","normalized":true}]"#,
    ] {
        add(
            "json_added_unsupported",
            a,
            tokenizer_json(&[("added_tokens", a)]),
            Unsupported,
        );
    }
    // Ids outside the vocabulary would index past the embedding table later.
    for a in [
        r#"[{"id":8,"content":"x","special":true}]"#,
        r#"[{"id":4294967295,"content":"x","special":true}]"#,
        r#"[{"id":2147483648,"content":"</s>","special":true}]"#,
    ] {
        add(
            "json_id_out_of_vocab",
            a,
            tokenizer_json(&[("added_tokens", a)]),
            Vocab,
        );
    }
    for ids in ["[8]", "[4294967295]", "[1,99]"] {
        let p = format!(
            r#"{{"type":"TemplateProcessing","single":[{{"Sequence":{{"id":"A"}}}},{{"SpecialToken":{{"id":"</s>"}}}}],"special_tokens":{{"</s>":{{"ids":{ids}}}}}}}"#
        );
        add(
            "json_id_out_of_vocab",
            &format!("post ids {ids}"),
            tokenizer_json(&[("post_processor", &p)]),
            Vocab,
        );
    }
    for n in [
        r#"{"type":"NFKC"}"#,
        r#"{"type":"Lowercase"}"#,
        r#"{"type":"Replace","pattern":{"Regex":"a+"},"content":""}"#,
    ] {
        add(
            "json_normalizer_unsupported",
            n,
            tokenizer_json(&[("normalizer", n)]),
            Unsupported,
        );
    }
    for (i, n) in [
        r#"{"kind":"NFKC"}"#,
        r#"{"type":"Sequence"}"#,
        r#"{"type":"Precompiled"}"#,
        r#"{"type":"Precompiled","precompiled_charsmap":"!!!"}"#,
        r#"{"type":"Precompiled","precompiled_charsmap":"AQ=="}"#,
        r#"{"type":"Precompiled","precompiled_charsmap":"/////wAAAAA="}"#,
        r#"{"type":"Precompiled","precompiled_charsmap":"AwAAAAAAAAA="}"#,
        r#"{"type":"Precompiled","precompiled_charsmap":"BAAAAAAAAAD/"}"#,
        r#"{"type":"Replace","content":"x"}"#,
        r#"{"type":"Replace","pattern":{"Glob":"x"}}"#,
    ]
    .iter()
    .enumerate()
    {
        add(
            "json_bad_normalizer",
            &format!("#{i}"),
            tokenizer_json(&[("normalizer", n)]),
            Format,
        );
    }
    for p in [
        r#"{"type":"ByteLevel"}"#,
        r#"{"type":"Metaspace","replacement":"_","prepend_scheme":"sometimes"}"#,
    ] {
        add(
            "json_pre_tokenizer_unsupported",
            p,
            tokenizer_json(&[("pre_tokenizer", p)]),
            Unsupported,
        );
    }
    for p in [
        r#"{"type":"Metaspace","replacement":"ab"}"#,
        r#"{"type":"Metaspace","replacement":""}"#,
        r#"{"type":"Sequence"}"#,
        r#"{}"#,
    ] {
        add(
            "json_bad_pre_tokenizer",
            p,
            tokenizer_json(&[("pre_tokenizer", p)]),
            Format,
        );
    }
    add(
        "json_post_unsupported",
        "RobertaProcessing",
        tokenizer_json(&[("post_processor", r#"{"type":"RobertaProcessing"}"#)]),
        Unsupported,
    );
    for p in [
        r#"{"type":"TemplateProcessing"}"#,
        r#"{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"</s>"}}],"special_tokens":{}}"#,
        r#"{"type":"TemplateProcessing","single":[{"Other":{}}]}"#,
        r#"{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"</s>"}}],"special_tokens":{"</s>":{"ids":[-1]}}}"#,
    ] {
        add(
            "json_bad_post_processor",
            p,
            tokenizer_json(&[("post_processor", p)]),
            Format,
        );
    }
    let no_eos = r#"{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0.0],["a",0.0]]}"#;
    add(
        "json_no_eos",
        "no </s>",
        tokenizer_json(&[
            ("model", no_eos),
            ("added_tokens", "[]"),
            ("post_processor", "null"),
        ]),
        Format,
    );
    v
}

/// Protobuf writer for SentencePiece `ModelProto` files.
#[derive(Default)]
pub struct Pb(pub Vec<u8>);

impl Pb {
    pub fn varint(&mut self, mut v: u64) -> &mut Pb {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return self;
            }
            self.0.push(b | 0x80);
        }
    }
    pub fn key(&mut self, field: u64, wire: u8) -> &mut Pb {
        self.varint(field << 3 | wire as u64)
    }
    pub fn bytes(&mut self, field: u64, b: &[u8]) -> &mut Pb {
        self.key(field, 2).varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    pub fn f32(&mut self, field: u64, v: f32) -> &mut Pb {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn piece(&mut self, text: &[u8], score: f32, kind: u64) -> &mut Pb {
        let mut p = Pb::default();
        p.bytes(1, text).f32(2, score).key(3, 0).varint(kind);
        self.bytes(1, &p.0)
    }
}

/// A valid minimal spiece.model: (<unk> UNKNOWN, </s> CONTROL, a few normal pieces, a charsmap).
pub fn spiece(
    pieces: &[(&[u8], f32, u64)],
    unk_id: Option<i64>,
    charsmap: Option<&[u8]>,
) -> Vec<u8> {
    let mut m = Pb::default();
    for (t, s, k) in pieces {
        m.piece(t, *s, *k);
    }
    let mut trainer = Pb::default();
    trainer.key(35, 0).varint(0);
    if let Some(u) = unk_id {
        trainer.key(40, 0).varint(u as u64);
    }
    m.bytes(2, &trainer.0);
    if let Some(c) = charsmap {
        let mut n = Pb::default();
        n.bytes(2, c);
        m.bytes(3, &n.0);
    }
    m.0
}

pub const GOOD_PIECES: &[(&[u8], f32, u64)] = &[
    (b"<pad>", 0.0, 3),
    (b"</s>", 0.0, 3),
    (b"<unk>", 0.0, 2),
    ("▁".as_bytes(), -1.0, 1),
    (b"a", -2.0, 1),
    ("▁ab".as_bytes(), -1.5, 1),
];

pub fn good_spiece() -> Vec<u8> {
    spiece(GOOD_PIECES, None, Some(&[4, 0, 0, 0, 0, 0, 0, 0, b'x', 0]))
}

/// spiece.model corpus: (case, expected error).
pub fn spiece_cases() -> Vec<(Case, TokErr)> {
    use TokErr::*;
    let mut v = Vec::new();
    let good = good_spiece();
    // Cuts on a top-level field boundary give a shorter valid message (then a vocabulary
    // error or success); every other cut breaks the protobuf framing.
    let mut boundaries = vec![0usize];
    let mut pos = 0;
    while pos < good.len() {
        pos += 1; // key (all top-level keys here are one byte)
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let b = good[pos];
            pos += 1;
            len |= ((b & 0x7f) as usize) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        pos += len;
        boundaries.push(pos);
    }
    for cut in 1..good.len() {
        if !boundaries.contains(&cut) {
            v.push((
                Case::new("spm_truncated", format!("cut {cut}"), good[..cut].to_vec()),
                Format,
            ));
        }
    }
    let raw: &[(&str, &[u8])] = &[
        ("varint runs off the end", &[0x0a, 0x80]),
        (
            "11-byte varint",
            &[
                0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
        ),
        ("length past end", &[0x0a, 0x10, 1, 2]),
        (
            "length 2^63",
            &[
                0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
            ],
        ),
        ("wire type 3", &[0x0b]),
        ("wire type 4", &[0x0c]),
        ("wire type 6", &[0x0e]),
        ("wire type 7", &[0x0f]),
        ("empty", &[]),
        ("only trainer spec", &[0x12, 0x00]),
        ("piece without text", &[0x0a, 0x05, 0x15, 0, 0, 0, 0]),
        ("piece not UTF-8", &[0x0a, 0x03, 0x0a, 0x01, 0xff]),
        ("fixed32 cut", &[0x0a, 0x03, 0x15, 0, 0]),
        ("nested bad wire", &[0x0a, 0x01, 0x0f]),
    ];
    for (name, b) in raw {
        v.push((Case::new("spm_malformed", *name, b.to_vec()), Format));
    }
    for (name, c) in [
        ("charsmap short", &[1u8, 0][..]),
        ("trie past end", &[64, 0, 0, 0, 1, 2]),
        ("trie not x4", &[3, 0, 0, 0, 0, 0, 0]),
        ("trie empty", &[0, 0, 0, 0]),
        ("strings not UTF-8", &[4, 0, 0, 0, 0, 0, 0, 0, 0xff]),
    ] {
        v.push((
            Case::new("spm_bad_charsmap", name, spiece(GOOD_PIECES, None, Some(c))),
            Format,
        ));
    }
    for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut p = GOOD_PIECES.to_vec();
        p[4].1 = s;
        v.push((
            Case::new(
                "spm_bad_score",
                format!("score {s}"),
                spiece(&p, None, None),
            ),
            Vocab,
        ));
    }
    let no_unk: Vec<_> = GOOD_PIECES.iter().filter(|p| p.2 != 2).copied().collect();
    v.push((
        Case::new("spm_no_unk", "unk_id -1", spiece(&no_unk, Some(-1), None)),
        Vocab,
    ));
    v.push((
        Case::new(
            "spm_no_unk",
            "unk_id 2^31-1",
            spiece(&no_unk, Some(i32::MAX as i64), None),
        ),
        Vocab,
    ));
    let no_eos: Vec<_> = GOOD_PIECES
        .iter()
        .filter(|p| p.0 != b"</s>")
        .copied()
        .collect();
    v.push((
        Case::new("spm_no_eos", "no </s>", spiece(&no_eos, None, None)),
        Vocab,
    ));
    v
}

/// Strings every loaded tokenizer must encode without panicking.
pub const PROMPTS: &[&str] = &[
    "",
    " ",
    "a",
    "ab ab  ab",
    "</s>",
    "<extra_id_0><unk></s>",
    "ＡＢＣ é\u{301} ﬁ",
    "\u{0}\u{1}\u{7f}",
    "e\u{301}\u{301}\u{301}\u{301}\u{301}\u{301}",
    "🧑‍🚀🏳️‍🌈",
    "x\u{200b}y\t\n\r",
    "▁▁▁",
];
