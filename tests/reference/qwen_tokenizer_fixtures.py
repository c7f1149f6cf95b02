#!/usr/bin/env python3
"""Reference fixtures for the Qwen2 byte-level BPE tokenizer (tests/qwen_tokenizer.rs).

The Qwen2 vocabulary is the 256 byte symbols (GPT-2 byte-to-unicode order) followed by one token
per merge result in merge order, then the special tokens from 151643 (`<|endoftext|>`) on; this
is checked here (no duplicate merge results, 256 + 151387 = 151643). The HF tokenizer is built
from that vocabulary and the real merges (../shared/tokenizers/qwen2.merges.txt) with
transformers' `Qwen2Tokenizer` (NFC, the Qwen2 split regex, ByteLevel) plus the Qwen special
tokens.

Writes tests/fixtures/qwen_tokenizer/:
  cases.json          [{text, ids}] from the full tokenizer (a few hundred varied prompts)
  template.json       the Qwen Image 2.1 t2i template for a few prompts: ids and drop_idx
  tiny/tokenizer.json a small tokenizer (first 744 merges, vocab 1000 + 26 added tokens) saved
                      by transformers, plus tiny/vocab.json + tiny/merges.txt of the same vocab
  tiny_cases.json     [{text, ids}] from the tiny tokenizer

Needs: tokenizers, transformers. Deterministic (fixed seed).
Re-run: python3 tests/reference/qwen_tokenizer_fixtures.py
"""
import json
import os
import random

from tokenizers import AddedToken
from transformers import Qwen2Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "qwen_tokenizer")


def find_merges():
    d = CRATE
    for _ in range(4):
        p = os.path.join(d, "shared", "tokenizers", "qwen2.merges.txt")
        if os.path.exists(p):
            return p
        d = os.path.dirname(d)
    raise SystemExit("qwen2.merges.txt not found in any shared/tokenizers above the crate")


# Qwen2 / Qwen2.5 / Qwen3(-VL) added tokens in id order from 151643; the last four are not
# "special" (they stay in decoded text) but are matched before BPE like the others.
SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
NON_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

SYS = "Comprehend and analyze the provided prompt."


def byte_symbols():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in keep] + [out[b] for b in range(256) if b not in keep]


def build(merges):
    vocab = {}
    for s in byte_symbols():
        vocab[s] = len(vocab)
    for m in merges:
        a, b = m.split(" ")
        assert a in vocab and b in vocab, m
        assert a + b not in vocab, f"duplicate merge result {m}"
        vocab[a + b] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges])
    for s in SPECIALS:
        if s not in tok.get_vocab():
            tok.add_tokens([AddedToken(s, special=s not in NON_SPECIAL, normalized=False)])
    for i, s in enumerate(SPECIALS):
        assert tok.convert_tokens_to_ids(s) == len(vocab) + i, s
    return tok, vocab


HANDWRITTEN = [
    "", " ", "  ", "   ", "a", "A lovely cat", "a lovely cat holding a sign says 'qwen2.1.cpp'",
    "a photo of an astronaut riding a horse on mars, highly detailed, 8k, trending on artstation",
    "  leading and trailing spaces  ", "multiple     spaces    between   words",
    "tabs\tand\nnewlines\r\nand\rcarriage returns", "\t\t\n\n", "\n", "\n\n\n", " \n \n ", "a \n b", "a\n\n  b",
    "word   \n  next", "end with spaces   ", "end with newline\n", "x\r\n\r\ny",
    "numbers 0123456789 3.14159 1,000,000 -42 +7 1e-5 2024-05-01 12:30", "1234567890123",
    "punctuation!?.,;:'\"()[]{}<>@#$%^&*_-+=/\\|`~", "!!! ??? ... ---",
    "ellipsis… em—dash en–dash «quotes» „low“ ‘single’ “double”",
    "café naïve résumé façade jalapeño Zürich Ångström Ærøskøbing",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301", "\u212b \u2126 \u212a K", "\u1100\u1161\u11a8 jamo sequence",
    "ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　ＡＢＣ　１２３！？", "ﬁ ﬂ ﬃ ① ② ⑳ ㎏ ㎞ ™ ½ ¼ ² ³ Ⅻ ㍿ ﹏ ℃ № ℡ ㈱",
    "漢字とひらがなとカタカナ、東京タワーの夜景", "一只可爱的猫坐在窗台上，阳光明媚", "宇航员骑马，高清，8K",
    "한국어 문장입니다. 고양이가 귀엽다", "Привет, мир! Кошка на крыше", "Γειά σου Κόσμε ΟΔΟΣ",
    "مرحبا بالعالم قطة جميلة", "שלום עולם חתול", "नमस्ते दुनिया क्षत्रिय", "สวัสดีชาวโลก แมวน่ารัก",
    "emoji 😀😃😄 🐱🐶 ❤️ 👍🏽 👨‍👩‍👧‍👦 🇩🇪🇯🇵 1️⃣ #️⃣",
    "zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom\u00adsoft",
    "controls \x00\x01\x02\x07\x08\x0b\x0c\x1b\x1f\x7f\x80\x85\x9f end",
    "nbsp\u00a0thin\u2009ideographic\u3000narrow\u202fem\u2003space", "line\u2028separator\u2029paragraph",
    "don't I'm you're we've they'll she'd it's DON'T I'M YOU'RE WE'VE THEY'LL SHE'D IT'S",
    "'s 't 're 've 'm 'll 'd 'S 'T 'Re 'vE 'M 'Ll 'D 'x ''s", "'ſ 'ſt", "rock'n'roll o'clock",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "a<|im_end|>b",
    "<|im_start|><|im_start|>", "<|im_start", "im_start|>", "<|vision_start|><|image_pad|><|vision_end|>",
    "<think>\n\n</think>\n\n", "x<think>y</think>z", "<tool_call>{\"a\": 1}</tool_call>", "<|box_start|>(1,2)",
    "UPPER lower MiXeD CamelCase snake_case kebab-case", "http://example.com/path?query=1&x=y#frag user@example.org",
    "$100 €50 £20 ¥1000 ₹500 ₿1", "math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ ∂ ∇ π θ λ μ",
    "arrows ← → ↑ ↓ ↔ ⇒ ⇔ and boxes ■ □ ▲ △ ● ○", "a" * 50, "ab" * 40, " " * 17, "\n" * 9,
    "def f(x):\n    return x * 2\n\n\nclass A:\n\tpass\n", "if (a && b) { c(); }  // comment",
    "A neon sign reading \"OPEN 24/7\" above a rainy street, cinematic lighting, f/1.8, 35mm",
    "Transparent background, PNG, a glass of water", "<image1> Picture 1:", "snake_case_42_var",
    "\u0301 leading combining", "a\u0300\u0301\u0302\u0303", "e\u0302\u0323 vs \u1ec7", "\u00c5 \u0041\u030a",
    "\U0001F600\U0001F3FD", "\ud7a3\u11c2", "\u0e01\u0e34\u0e19", "\u05d0\u05b8", "x\u0308\u0308y",
]

WORDS = ["cat", "dog", "the", "a", "photo", "of", "portrait", "Cinematic", "HDR", "8K", "ultra-detailed",
         "sunset", "mountains", "river", "Tokyo", "neon", "cyberpunk", "watercolor", "oil", "painting",
         "don't", "it's", "we'll", "O'Neil", "rock'n'roll", "2024", "3.5", "100%", "#hashtag", "@user",
         "e-mail", "self-portrait", "über", "naïve", "Ελλάδα", "Москва", "北京", "東京", "서울", "🐱",
         "🚀", "…", "—", "(sepia)", "[red]", "{blue}", "<green>", "x2", "v1.2.3", "α", "β", "ß", "İstanbul"]
SEPS = [" ", " ", " ", "  ", "   ", "\n", "\n\n", " \n", "\n ", "\t", ", ", ". ", "! ", "? ", ": ",
        "; ", "\r\n", " \t ", "\u3000", "\u00a0", "", "-", "/"]
CHARS = (list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 \t\n\r'\".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`")
         + list("éüñçøåßäöЖжλπ中文字日本語한글😀👍🏽\u0301\u0308\u00a0\u2009\u3000\u200b\u0085\u2028"))


def generated(rng, n):
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            k = rng.randint(1, 18)
            s = "".join(rng.choice(WORDS) + rng.choice(SEPS) for _ in range(k))
            if rng.random() < 0.3:
                s = s.strip()
        elif kind < 0.8:
            s = "".join(rng.choice(CHARS) for _ in range(rng.randint(1, 40)))
        else:
            parts = []
            for _ in range(rng.randint(1, 6)):
                r = rng.random()
                if r < 0.3:
                    parts.append(rng.choice(SPECIALS))
                elif r < 0.6:
                    parts.append(rng.choice(WORDS))
                else:
                    parts.append(rng.choice(SEPS) * rng.randint(1, 3))
            s = "".join(parts)
        out.append(s)
    return out


def template(prompt):
    return (f"<|im_start|>system\n{SYS}<|im_end|>\n"
            f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")


def main():
    os.makedirs(os.path.join(OUT, "tiny"), exist_ok=True)
    merges = [l.rstrip("\n") for l in open(find_merges(), encoding="utf-8") if l.strip()]
    assert not merges[0].startswith("#")
    tok, vocab = build(merges)
    assert len(vocab) == 151643
    rng = random.Random(1234)
    texts = HANDWRITTEN + generated(rng, 340)
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False)} for t in texts]
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=0)

    sys_prefix = f"<|im_start|>system\n{SYS}<|im_end|>\n"
    drop_idx = len(tok.encode(sys_prefix, add_special_tokens=False))
    assert drop_idx == 14, drop_idx
    tmpl = []
    for p in ["a lovely cat", " ", "A neon sign reading \"OPEN\"\nin the rain, 夜景 🐱", "<|im_end|>"]:
        tmpl.append({"prompt": p, "ids": tok.encode(template(p), add_special_tokens=False),
                     "drop_idx": drop_idx})
    with open(os.path.join(OUT, "template.json"), "w", encoding="utf-8") as f:
        json.dump(tmpl, f, ensure_ascii=False, indent=0)

    # Tiny tokenizer: the first 744 merges (their parts are always earlier tokens).
    tiny, tiny_vocab = build(merges[:744])
    tiny_dir = os.path.join(OUT, "tiny")
    tiny.save_pretrained(tiny_dir)
    for extra in ["tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]:
        p = os.path.join(tiny_dir, extra)
        if os.path.exists(p):
            os.remove(p)
    with open(os.path.join(tiny_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(tiny_vocab, f, ensure_ascii=False)
    with open(os.path.join(tiny_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges[:744]) + "\n")
    tiny_cases = [{"text": t, "ids": tiny.encode(t, add_special_tokens=False)} for t in texts[:160]]
    with open(os.path.join(OUT, "tiny_cases.json"), "w", encoding="utf-8") as f:
        json.dump(tiny_cases, f, ensure_ascii=False, indent=0)
    print(f"{len(cases)} cases, drop_idx {drop_idx}, tiny vocab {len(tiny_vocab)}")




def write_nfc_tables(path):
    """Generates src/tokenizers/nfc_tables.rs from Python's unicodedata (run with --nfc-tables)."""
    import unicodedata as ud

    def canon(cp):
        d = ud.decomposition(chr(cp))
        if not d or d.startswith("<"):
            return None
        return [int(x, 16) for x in d.split()]

    def full(cp):
        d = canon(cp)
        if d is None:
            return [cp]
        out = []
        for x in d:
            out.extend(full(x))
        return out

    ccc, decomp, compose = [], [], []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or 0xAC00 <= cp <= 0xD7A3:
            continue
        c = ud.combining(chr(cp))
        if c:
            if ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == c:
                ccc[-1][1] = cp
            else:
                ccc.append([cp, cp, c])
        d = canon(cp)
        if d is not None:
            decomp.append((cp, full(cp)))
            if len(d) == 2 and ud.normalize("NFC", chr(d[0]) + chr(d[1])) == chr(cp):
                compose.append((d[0], d[1], cp))
    compose.sort()
    lines = [
        "//! Unicode NFC data generated from Python's unicodedata "
        f"(Unicode {ud.unidata_version}) by",
        "//! tests/reference/qwen_tokenizer_fixtures.py --nfc-tables. Do not edit.",
        "",
        "/// Canonical combining classes: (first, last, class) for every non-zero class.",
        "#[rustfmt::skip]",
        "pub(crate) const CCC: &[(u32, u32, u8)] = &[",
    ]
    for i in range(0, len(ccc), 6):
        lines.append("    " + " ".join(f"(0x{a:X}, 0x{b:X}, {c})," for a, b, c in ccc[i:i + 6]))
    lines.append("];")
    lines.append("")
    lines.append("/// Full canonical decompositions (Hangul syllables excluded: they are algorithmic).")
    lines.append("#[rustfmt::skip]")
    lines.append("pub(crate) const DECOMP: &[(u32, &[u32])] = &[")
    for i in range(0, len(decomp), 4):
        lines.append("    " + " ".join(
            f"(0x{cp:X}, &[{', '.join(f'0x{x:X}' for x in d)}])," for cp, d in decomp[i:i + 4]))
    lines.append("];")
    lines.append("")
    lines.append("/// Primary composites: (first, second, composed), sorted by (first, second).")
    lines.append("#[rustfmt::skip]")
    lines.append("pub(crate) const COMPOSE: &[(u32, u32, u32)] = &[")
    for i in range(0, len(compose), 5):
        lines.append("    " + " ".join(f"(0x{a:X}, 0x{b:X}, 0x{c:X})," for a, b, c in compose[i:i + 5]))
    lines.append("];")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{path}: {len(ccc)} ccc ranges, {len(decomp)} decompositions, {len(compose)} compositions")


if __name__ == "__main__" and "--nfc-tables" in os.sys.argv:
    write_nfc_tables(os.path.join(CRATE, "src", "tokenizers", "nfc_tables.rs"))


if __name__ == "__main__" and "--nfc-tables" not in os.sys.argv:
    main()
