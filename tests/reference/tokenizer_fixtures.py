#!/usr/bin/env python3
"""Reference fixtures for the T5 tokenizer (tests/tokenizers.rs).

Writes tests/fixtures/tokenizers/:
  t5_cases.json      prompts with HF `tokenizers` ids (add_special_tokens=True), normalized text,
                     and Python's `lower().strip()` of the prompt
  t5_padded.json     PixArt-style encodings (truncate + pad) at max_length 300 and 120
  graphemes.json     random strings with their extended grapheme clusters (regex module \\X)
  spm/tiny.model     a tiny self-trained SentencePiece unigram model
  spm_cases.json     its ids from transformers' T5Tokenizer (HF pipeline) and from sentencepiece

Needs: tokenizers, transformers, sentencepiece, protobuf, regex. Deterministic (fixed seeds).
Re-run: python3 tests/reference/tokenizer_fixtures.py
"""
import json
import os
import random
import shutil
import tempfile

import regex
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "tokenizers")
T5_JSON = os.path.join(CRATE, "..", "shared", "tokenizers", "t5-v1_1.tokenizer.json")

HANDWRITTEN = [
    "",
    " ",
    "   ",
    "a",
    "A lovely cat",
    "a lovely cat",
    "a photo of an astronaut riding a horse on mars, highly detailed, 8k, trending on artstation",
    "A small cactus with a happy face in the Sahara desert.",
    "  leading and trailing spaces  ",
    "multiple     spaces    between   words",
    "tabs\tand\nnewlines\r\nand\rcarriage returns",
    "\t\t\n\n",
    "numbers 0123456789 3.14159 1,000,000 -42 +7 1e-5 2024-05-01 12:30",
    "punctuation!?.,;:'\"()[]{}<>@#$%^&*_-+=/\\|`~",
    "ellipsis… em—dash en–dash «quotes» „low“ ‘single’ “double”",
    "café naïve résumé façade jalapeño Zürich Ångström Ærøskøbing",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　ＡＢＣ　１２３！？",
    "ﬁ ﬂ ﬃ ① ② ⑳ ㎏ ㎞ ™ ½ ¼ ² ³ Ⅻ ㍿ ﹏ ℃ № ℡ ㈱",
    "漢字とひらがなとカタカナ、東京タワーの夜景",
    "一只可爱的猫坐在窗台上，阳光明媚",
    "한국어 문장입니다. 고양이가 귀엽다",
    "\u1100\u1161\u11a8 jamo sequence",
    "Привет, мир! Кошка на крыше",
    "Γειά σου Κόσμε ΟΔΟΣ",
    "مرحبا بالعالم قطة جميلة",
    "שלום עולם חתול",
    "नमस्ते दुनिया क्षत्रिय",
    "สวัสดีชาวโลก แมวน่ารัก",
    "emoji 😀😃😄 🐱🐶 ❤️ 👍🏽 👨‍👩‍👧‍👦 🇩🇪🇯🇵 1️⃣ #️⃣",
    "zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom\u00adsoft",
    "controls \x00\x01\x02\x07\x08\x0b\x0c\x1b\x1f\x7f\x80\x85\x9f end",
    "nbsp\u00a0thin\u2009ideographic\u3000narrow\u202fem\u2003space",
    "line\u2028separator\u2029paragraph",
    "the token </s> inside",
    "<pad> <unk> </s> <extra_id_0> <extra_id_99> <extra_id_100>",
    "a</s>b<pad>c",
    "</s",
    "<<extra_id_1>>",
    "▁ already ▁▁ meta ▁space▁",
    "ＡＢＣ\u0301 Ａ\u0301b e\u0301\u0302 a\u0300\u0301\u0302\u0303",
    "\u0600a \u06dd1 \u0890x",
    "a\u0903 x\u093f",
    "©\u200d© 👩\u200d©\u0301",
    "\r\n\u0301 \n\u0301",
    "UPPER lower MiXeD CamelCase snake_case kebab-case",
    "http://example.com/path?query=1&x=y#frag user@example.org",
    "$100 €50 £20 ¥1000 ₹500 ₿1",
    "math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ ∂ ∇ π θ λ μ",
    "arrows ← → ↑ ↓ ↔ ⇒ ⇔ and boxes ■ □ ▲ △ ● ○",
    "a" * 50,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "masterpiece, best quality, ultra-detailed, (1girl:1.2), [blue hair], {sunset}",
    "\U0001d400\U0001d401 mathematical bold, \U00010400 deseret, \U0001f600",
    "private use \ue000\uf8ff and nonchar \ufffe\uffff?",
    "Ǆ ǅ ǆ ǈ ǋ ẞ ß İ ı ŉ ǰ",
]

POOL_WORDS = [
    "cat", "dog", "photo", "portrait", "landscape", "city", "night", "neon", "forest", "river",
    "mountain", "sky", "cyberpunk", "watercolor", "oil", "painting", "detailed", "4k", "HDR",
    "café", "naïve", "東京", "猫", "고양이", "кошка", "γάτα", "قطة", "😀", "🐱", "ﬁsh", "①",
    "ｆｕｌｌ", "㎏", "e\u0301", "Ａ\u0301", "x\u0308\u0301", "</s>", "<extra_id_7>", "▁", "\u00a0",
    "don't", "it's", "x-ray", "3.5", "100%", "#hashtag", "@user", "snake_case", "\u200b",
]
POOL_SEPS = [" ", " ", " ", "  ", "\t", "\n", "\r\n", ", ", ". ", "\u3000", "", "   "]
POOL_CHARS = (
    list("abcxyzABCXYZ0189 .,!?-_'\"()")
    + list("éèêëàâäîïôöùûüçñåæøœ")
    + ["e\u0301"[1], "\u0308", "\u0327", "\u20dd", "\ufe0f", "\u200d", "\u200c", "\u00ad"]
    + list("日本語中文字한글ㄱㅏ각가각ｱｲｳﾞﾟＡＢＣ１２３")
    + list("ﬁﬂ①②㎏㎞™½²Ⅻ㍿℃№")
    + ["\U0001f600", "\U0001f1e9", "\U0001f1ea", "\U0001f3fb", "\U0001d400", "\u2764", "\u00a9"]
    + ["\t", "\n", "\r", "\x00", "\x01", "\x1f", "\x7f", "\x85", "\u2028", "\u3000", "\u00a0", "\ufeff"]
    + list("ابتשלוםनमस्तेสวัสดี")
    + ["\u0600", "\u0903", "\u093f", "\u0e33"]
)


def random_prompts(rng, n):
    out = []
    for i in range(n):
        if i % 2 == 0:
            k = rng.randint(1, 12)
            parts = []
            for _ in range(k):
                parts.append(rng.choice(POOL_WORDS))
                parts.append(rng.choice(POOL_SEPS))
            s = "".join(parts)
        else:
            s = "".join(rng.choice(POOL_CHARS) for _ in range(rng.randint(1, 30)))
        out.append(s)
    return out


def long_prompts(rng):
    words = [w for w in POOL_WORDS if w not in ("</s>", "<extra_id_7>")]
    base = (
        "A breathtaking panoramic view of an ancient city built into the side of a towering mountain, "
        "with waterfalls cascading between terraces, lush hanging gardens, golden light at sunset, "
        "flocks of birds, intricate stone carvings, volumetric fog, cinematic composition, "
    )
    out = [base * 2, base * 6, base * 12]
    for n in (150, 310, 400, 700):
        out.append(" ".join(rng.choice(words) for _ in range(n)))
    return out


def main():
    os.makedirs(os.path.join(OUT, "spm"), exist_ok=True)
    rng = random.Random(1234)
    tok = Tokenizer.from_file(T5_JSON)

    prompts = HANDWRITTEN + random_prompts(rng, 260)
    longs = long_prompts(rng)
    cases = []
    for p in prompts + longs:
        ids = tok.encode(p, add_special_tokens=True).ids
        case = {"text": p, "ids": ids, "clean": p.lower().strip()}
        if len(p) < 400:
            case["normalized"] = tok.normalizer.normalize_str(p)
        cases.append(case)
    with open(os.path.join(OUT, "t5_cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, separators=(",", ":"))

    padded = []
    for max_len in (300, 120):
        t = Tokenizer.from_file(T5_JSON)
        t.enable_truncation(max_length=max_len)
        t.enable_padding(length=max_len, pad_id=0, pad_token="<pad>")
        for p in ["", "a lovely cat", HANDWRITTEN[6]] + longs:
            e = t.encode(p, add_special_tokens=True)
            padded.append({"text": p, "max_len": max_len, "ids": e.ids, "mask": e.attention_mask})
    with open(os.path.join(OUT, "t5_padded.json"), "w", encoding="utf-8") as f:
        json.dump(padded, f, ensure_ascii=False, separators=(",", ":"))

    write_graphemes(random.Random(99))
    write_spm(prompts)
    print("wrote fixtures to", OUT, len(cases), "cases,", len(padded), "padded")


def write_graphemes(rng):
    # GB9c (Indic conjuncts) is not implemented on the Rust side (irrelevant to the normalizer, see
    # grapheme.rs), so linkers are left out of the pool.
    pool = [c for c in POOL_CHARS if c not in "\u094d"] + ["\U000e0020", "\U0001d165", "\u0d4e", "\u11a8"]
    cases = []
    for _ in range(400):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        cases.append({"text": s, "clusters": regex.findall(r"\X", s)})
    with open(os.path.join(OUT, "graphemes.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, separators=(",", ":"))


def write_spm(prompts):
    import sentencepiece as spm
    from transformers import T5Tokenizer

    corpus = os.path.join(OUT, "spm", "corpus.txt")
    lines = [p.replace("\n", " ") for p in prompts if p.strip()]
    base = (
        "the quick brown fox jumps over the lazy dog. a photo of a cat sitting on a chair. "
        "painting of a city at night with neon lights. café naïve ｆｕｌｌ ① ㎏ 東京 猫 고양이 кошка."
    )
    with open(corpus, "w", encoding="utf-8") as f:
        for i in range(200):
            f.write(base + " " + lines[i % len(lines)] + "\n")
    prefix = os.path.join(OUT, "spm", "tiny")
    spm.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=prefix,
        vocab_size=300,
        model_type="unigram",
        character_coverage=0.98,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        normalization_rule_name="nmt_nfkc",
        num_threads=1,
        seed_sentencepiece_size=100000,
    )
    os.remove(corpus)
    os.remove(prefix + ".vocab")
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    # transformers 5 converts a folder's spiece.model into its tokenizers-backed T5Tokenizer.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(prefix + ".model", os.path.join(tmp, "spiece.model"))
        hf = T5Tokenizer.from_pretrained(tmp, legacy=True)
    cases = []
    for p in prompts:
        hf_ids = hf(p, add_special_tokens=True)["input_ids"]
        sp_ids = sp.encode(p) + [1]
        cases.append({"text": p, "hf_ids": hf_ids, "spm_ids": sp_ids})
    with open(os.path.join(OUT, "spm_cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
