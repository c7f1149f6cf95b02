#!/usr/bin/env python3
"""Reference fixtures for the CLIP tokenizer, prompt emphasis and 77-token chunking
(tests/clip_tokenizer.rs, tests/clip_prompt_chunks.rs).

The CLIP vocabulary is built the way OpenAI's `simple_tokenizer.py` builds it (and the way
HF's `vocab.json` of openai/clip-vit-large-patch14 was made): the 256 byte symbols in GPT-2
byte-to-unicode order, the same 256 with `</w>`, one token per merge result (the 48894 merges
of ../shared/tokenizers/clip.merges.txt, the same bytes as upstream's embedded
`clip_merges.hpp`), then `<|startoftext|>` 49406 and `<|endoftext|>` 49407.

Two references, because upstream sd-cli and HF differ on non-ASCII text:
  * HF `CLIPTokenizer` (transformers 5: NFC, Unicode `\\s+` -> " ", Unicode lowercase, the CLIP
    split regex, ByteLevel) built from that vocabulary: `hf_cases.json`.
  * A transcription of upstream's CLIPTokenizer (src/tokenizers/clip_tokenizer.cpp,
    bpe_tokenizer.cpp, tokenize_util.cpp): its `std::regex` runs on bytes in the C locale, so only
    ASCII is whitespace / letter / digit, lowercasing is ASCII-only and every non-ASCII byte
    counts as punctuation: `sdcpp_cases.json`.
The emphasis parser (upstream `parse_prompt_attention`, src/core/util.cpp) and the SD
conditioner's chunking (`FrozenCLIPEmbedderWithCustomWords::tokenize`, `Tokenizer::pad_tokens`)
are transcribed here too, with float32 arithmetic as upstream's `float`:
`emphasis_cases.json` and `chunk_cases.json`.

Needs: tokenizers, transformers, numpy. Deterministic (fixed seed).
Re-run: python3 tests/reference/clip_tokenizer_fixtures.py
"""
import json
import os
import random
import re

import numpy as np
from transformers import CLIPTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(CRATE, "tests", "fixtures", "clip_tokenizer")

BOS, EOS = 49406, 49407
F32 = np.float32


def find_merges():
    d = CRATE
    for _ in range(4):
        p = os.path.join(d, "shared", "tokenizers", "clip.merges.txt")
        if os.path.exists(p):
            return p
        d = os.path.dirname(d)
    raise SystemExit("clip.merges.txt not found in any shared/tokenizers above the crate")


def byte_symbols():
    """GPT-2 bytes_to_unicode as an ordered {byte: symbol} (printable bytes first)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def build_vocab(merges):
    symbols = list(byte_symbols().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens) == 49408
    return vocab


# ---------------------------------------------------------------- upstream transcription
ASCII_WS = b" \t\n\x0b\x0c\r"
SDCPP_SPLIT = re.compile(rb"'s|'t|'re|'ve|'m|'ll|'d|[A-Za-z]+|[0-9]|[^ \t\n\x0b\x0c\rA-Za-z0-9]+")


class SdCppClip:
    """upstream CLIPTokenizer::encode on bytes (C locale)."""

    def __init__(self, merges, vocab):
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.vocab = vocab
        self.enc = byte_symbols()

    @staticmethod
    def normalize(b):
        b = re.sub(rb"[ \t\n\x0b\x0c\r]+", b" ", b).strip(ASCII_WS)
        return b.lower()  # bytes.lower() is ASCII-only, like std::tolower in the C locale

    def bpe(self, token):
        word = list(token[:-1]) + [token[-1] + "</w>"]
        if len(word) == 1:
            return word
        while True:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            first, second = best
            new, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new.extend(word[i:])
                    break
                new.extend(word[i:j])
                i = j
                if i < len(word) - 1 and word[i + 1] == second:
                    new.append(first + second)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = new
            if len(word) == 1:
                break
        return word

    def encode(self, text, custom=None):
        """`custom`: {normalized name: ids}, matched as upstream's extra special tokens."""
        b = self.normalize(text.encode("utf-8"))
        specials = [b"<|startoftext|>", b"<|endoftext|>"] + [n for n in (custom or {})]
        ids = []
        for piece, special in split_with_special_tokens(b, specials):
            if special:
                if custom and piece in custom:
                    ids.extend(custom[piece])
                else:
                    ids.append(self.vocab[piece.decode()])
                continue
            for m in SDCPP_SPLIT.finditer(piece):
                sym = "".join(self.enc[c] for c in m.group(0))
                ids.extend(self.vocab[t] for t in self.bpe(sym))
        return ids


def split_with_special_tokens(text, specials):
    """upstream split_with_special_tokens: the earliest occurrence, the first listed on a tie."""
    out, pos = [], 0
    while pos < len(text):
        best, tok = len(text), None
        for s in specials:
            p = text.find(s, pos)
            if p != -1 and p < best:
                best, tok = p, s
        if best > pos:
            out.append((text[pos:best], False))
        if tok is None:
            break
        out.append((tok, True))
        pos = best + len(tok)
    return out


RE_ATTENTION = re.compile(
    r"\\\(|\\\)|\\\[|\\\]|\\\\|\\|\(|\[|:([+-]?[.\d]+)\)|\)|\]|\bBREAK\b|[^\\()\[\]:B]+|:|\bB", re.ASCII)
RE_STOF = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")


def stof(s):
    """std::stof: the longest float prefix; throws (None here) without one or out of float range."""
    m = RE_STOF.match(s)
    if not m:
        return None
    with np.errstate(over="ignore"):
        v = F32(float(m.group(0)))
    if np.isinf(v):
        return None
    if abs(v) < np.finfo(F32).tiny and any(c in "123456789" for c in m.group(0)):
        return None  # ERANGE on underflow
    return v


def parse_prompt_attention(text):
    """upstream parse_prompt_attention (util.cpp); None where upstream's std::stof throws."""
    res = []
    round_b, square_b = [], []
    round_m, square_m = F32(1.1), F32(1) / F32(1.1)

    def multiply(start, m):
        for p in range(start, len(res)):
            res[p][1] = F32(res[p][1] * m)

    rest = text
    while True:
        m = RE_ATTENTION.search(rest)
        if not m:
            break
        t, w = m.group(0), m.group(1)
        if t == "(":
            round_b.append(len(res))
        elif t == "[":
            square_b.append(len(res))
        elif w is not None:
            if round_b:
                v = stof(w)
                if v is None:
                    return None
                multiply(round_b.pop(), v)
        elif t == ")" and round_b:
            multiply(round_b.pop(), round_m)
        elif t == "]" and square_b:
            multiply(square_b.pop(), square_m)
        elif t == "\\(":
            res.append([t[1:], F32(1)])
        elif re.search(r"\s*\bBREAK\b\s*", t, re.ASCII):
            res.append(["BREAK", F32(-1)])
        else:
            res.append([t, F32(1)])
        rest = rest[m.end():]
    for p in round_b:
        multiply(p, round_m)
    for p in square_b:
        multiply(p, square_m)
    if not res:
        res.append(["", F32(1)])
    i = 0
    while i + 1 < len(res):
        if res[i][1] == res[i + 1][1]:
            res[i][0] += res[i + 1][0]
            del res[i + 1]
        else:
            i += 1
    return res


def tokenize_chunks(clip, text, pad, custom):
    """FrozenCLIPEmbedderWithCustomWords::tokenize + pad_tokens(77, 77, overflow expand)."""
    parsed = parse_prompt_attention(text)
    if parsed is None:
        return None
    tokens, weights = [], []
    for t, w in parsed:
        if t == "BREAK" and w == F32(-1):
            n = (75 - len(tokens) % 75) % 75
            tokens += [EOS] * n
            weights += [F32(1)] * n
            continue
        ids = clip.encode(t, custom)
        tokens += ids
        weights += [w] * len(ids)
    chunks = []
    offset = 0
    while True:
        take = tokens[offset:offset + 75]
        ids = [BOS] + take + [EOS]
        ws = [F32(1)] + weights[offset:offset + 75] + [F32(1)]
        ids += [pad] * (77 - len(ids))
        ws += [F32(1)] * (77 - len(ws))
        chunks.append({"ids": ids, "weights": [float(x) for x in ws]})
        offset += 75
        if offset >= len(tokens):
            break
    return chunks


# ---------------------------------------------------------------- prompts
HANDWRITTEN = [
    "", " ", "   ", "a", "A", "a photo of a cat", "A Photo Of A CAT",
    "a photo of an astronaut riding a horse on mars, highly detailed, 8k, trending on artstation",
    "  leading and trailing  ", "many     spaces   between", "tabs\tnew\nlines\r\ncr\rvt\x0bff\x0c",
    "\t\n", "numbers 0123456789 3.14159 1,000,000 -42 +7 1e-5 2024-05-01 12:30", "1234567890",
    "punctuation!?.,;:'\"()[]{}<>@#$%^&*_-+=/\\|`~", "!!! ??? ... --- ,,, ;;",
    "don't I'm you're we've they'll she'd it's DON'T I'M YOU'RE WE'VE THEY'LL SHE'D IT'S",
    "'s 't 're 've 'm 'll 'd 'x ''s !'s 'S's rock'n'roll o'clock", "''''", "'", "a'", "'a",
    "<|startoftext|>", "<|endoftext|>", "a<|endoftext|>b", "<|startoftext|>a photo<|endoftext|>",
    "<|ENDOFTEXT|>", "<|endof", "x <|endoftext|> y", "<|startoftext|><|startoftext|>",
    "snake_case_var kebab-case CamelCase x2 v1.2.3 100% #hashtag @user e-mail",
    "http://example.com/path?q=1&x=y#frag user@example.org",
    "masterpiece, best quality, ultra-detailed, (illustration), 1girl, solo, long hair, blue eyes",
    "a" * 60, "ab" * 40, "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "café naïve résumé façade jalapeño Zürich Ångström Ærøskøbing Über ÉCOLE",
    "cafe\u0301 nai\u0308ve", "ΟΔΟΣ Σίσυφος σ ς", "İstanbul ß ẞ ǅ ﬁ ﬂ", "\u212b \u2126 \u212a K",
    "漢字とひらがなとカタカナ、東京タワーの夜景", "一只可爱的猫坐在窗台上，阳光明媚", "한국어 문장입니다",
    "Привет, мир! Кошка", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "emoji 😀😃 🐱🐶 ❤️ 👍🏽 👨‍👩‍👧 🇩🇪 1️⃣", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３！",
    "① ½ ² ³ Ⅻ ٣ ๓ ௫", "x²+y³ 3½", "nbsp\u00a0thin\u2009ideo\u3000narrow\u202fem\u2003end",
    "line\u2028sep\u2029para\u0085nel", "zero\u200bwidth\u200cjoin\u200dx\ufeffbom\u00adsoft",
    "controls \x01\x02\x07\x1b\x1f\x7f end", "\u0301 leading combining", "e\u0302\u0323 vs \u1ec7",
    "$100 €50 £20 ¥1000 ₹500", "math: ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷ π θ", "arrows ← → and boxes ■ □",
    "ellipsis… em—dash «quotes» “double” ‘single’", "a,b.c;d:e!f?g", "(word) [word] {word} <word>",
    "BREAK", "a BREAK b", "a\\(b\\)c",
]

WORDS = ["cat", "dog", "the", "a", "photo", "of", "portrait", "Cinematic", "HDR", "8K", "ultra-detailed",
         "sunset", "mountains", "Tokyo", "neon", "cyberpunk", "watercolor", "don't", "it's", "we'll",
         "O'Neil", "2024", "3.5", "100%", "#tag", "über", "naïve", "Ελλάδα", "Москва", "北京", "🐱", "…",
         "—", "x2", "v1.2.3", "ß", "İstanbul", "masterpiece", "best quality", "1girl", "BREAK", "break",
         "Bob", "B", "BB", "AND"]
SEPS = [" ", " ", " ", "  ", "\n", "\t", ", ", ". ", "! ", ": ", "; ", "\r\n", "\u3000", "\u00a0", "", "-"]
CHARS = (list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 \t\n\r'\".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`")
         + list("éüñçøåßäöЖжλπ中文字日本語한글😀👍🏽\u0301\u0308\u00a0\u2009\u3000\u200b\u0085\u2028²½"))


def generated(rng, n):
    out = []
    for _ in range(n):
        if rng.random() < 0.6:
            s = "".join(rng.choice(WORDS) + rng.choice(SEPS) for _ in range(rng.randint(1, 14)))
            if rng.random() < 0.3:
                s = s.strip()
        else:
            s = "".join(rng.choice(CHARS) for _ in range(rng.randint(1, 40)))
        out.append(s)
    return out


EMPHASIS_HANDWRITTEN = [
    "normal text", "an (important) word", "(unbalanced", "\\(literal\\]", "(unnecessary)(parens)",
    "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).", "[[[a]]]", "((a))", "(a:1.5)", "(a:-1)",
    "(a:+.5)", "(a:1.2.3)", "(a:5.)", "(a:.)", "(a:..5)", "a:1.5)", "a)", "a]", "[a", "(a]", "[a)",
    "(a[b)c]", "(a:1.1:1.2)", "(a: 1.5)", "(a:1.5 )", "(a:0)", "(a:00001.50000)", "(a:1e5)",
    "\\\\(a\\\\)", "\\", "a\\b", "\\\\", "\\[x\\]", "\\(x\\)", "(\\(x\\))", ":", "::", "(:)", "a:b",
    "BREAK", "a BREAK b", "aBREAK b", "a BREAKb", "BREAKfast", "a BREAK", "BREAK a", "a BREAK BREAK b",
    "a,BREAK,b", "(BREAK)", "[BREAK]", "BREAK[]BREAK", "a\tBREAK\nb", "abreak b", "Break", "B", "BB",
    "Bob and Bill", "(Bob:1.2)", "aB", "é BREAK ü", "BREAKé", "", " ", "()", "[]", "(())", "((a)",
    "(a))", "(((((((((((a)))))))))))", "[[[[[[[[[[a]]]]]]]]]]", "(a:99999999999999999999999999999999999999)",
    "(a:999999999999999999999999999999999999999)", "(a:0.000000000000000000000000000000000000001)",
    "(a:0.0000000000000000000000000000000000001)", "a (b:1.1) c (d) e", "(a)(b:1.1)",
    "(a:1.1)(b)", "[a][b]", "(a)[b]", "a ( b ) c", "(masterpiece:1.2), (best quality), [lowres], BREAK, 1girl",
]

FRAGMENTS = ["a", "cat", " ", " ", ", ", "photo of", "(", ")", "[", "]", ":", ":1.5)", ":0.8)", ":-0.5)",
             ":1.)", ":.)", "\\(", "\\)", "\\[", "\\]", "\\\\", "\\", "BREAK", " BREAK ", "B", "Bob",
             "é", "dog", "1", "x2", "\n", "AND", "my_emb", "MyEmb", "emb", "bad-hands", "embroidery",
             "EMB"]


def emphasis_generated(rng, n):
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 16))) for _ in range(n)]


CUSTOM_WORDS = [["bad-hands", 2], ["emb", 1], ["my_emb", 3], ["MyEmb", 1], ["embroid", 2], ["EMB", 2]]


def custom_ids(words, base):
    """{lowercased name: ids} of the custom words in matching order. Names that are equal after
    ASCII lowercasing: the one later in byte order wins (upstream's std::map of file stems is
    iterated in that order and overwrites). The survivors are listed, and their rows numbered
    consecutively from `base`, in byte order of their names, as the Rust side does; upstream
    numbers rows lazily in order of first use, which only renumbers the custom embedding table."""
    win = {}
    for name, rows in sorted(words, key=lambda w: w[0].encode()):
        win[name.encode().lower()] = (name, rows)
    out, nxt = {}, base
    for key, (name, rows) in sorted(win.items(), key=lambda kv: kv[1][0].encode()):
        out[key] = list(range(nxt, nxt + rows))
        nxt += rows
    return out


def long_prompts(rng):
    out = []
    for n in [74, 75, 76, 150, 151, 230]:
        out.append(" ".join(rng.choice(["cat", "dog", "red", "sky", "tree"]) for _ in range(n)))
    out.append("(" + " ".join(["house"] * 80) + ":1.3) sky")  # emphasis across the chunk boundary
    out.append(" ".join(["a"] * 70) + " (b c d e f g h:1.2) " + " ".join(["z"] * 10))
    out.append(" ".join(["a"] * 74) + " BREAK b")  # BREAK exactly at 75
    out.append(" ".join(["a"] * 75) + " BREAK b")
    out.append(" ".join(["a"] * 76) + " BREAK b")
    out.append("x BREAK " + " ".join(["y"] * 80) + " BREAK z")
    out.append(", ".join(["masterpiece", "best quality"] * 20))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = open(find_merges(), encoding="utf-8").read().split("\n")
    assert lines[0].startswith("#version") and lines[-1] == ""
    merges = [tuple(l.split(" ")) for l in lines[1:-1]]
    assert len(merges) == 48894
    vocab = build_vocab(merges)
    hf = CLIPTokenizer(vocab=vocab, merges=merges)
    assert hf.bos_token_id == BOS and hf.eos_token_id == EOS
    sd = SdCppClip(merges, vocab)

    rng = random.Random(77)
    texts = HANDWRITTEN + generated(rng, 260)
    hf_cases = [{"text": t, "ids": hf.encode(t, add_special_tokens=False)} for t in texts]
    sd_cases = [{"text": t, "ids": sd.encode(t)} for t in texts]
    same = sum(a["ids"] == b["ids"] for a, b in zip(hf_cases, sd_cases))

    emph = []
    for t in EMPHASIS_HANDWRITTEN + emphasis_generated(rng, 260):
        parts = parse_prompt_attention(t)
        if parts is None:
            emph.append({"text": t, "error": True})
        else:
            emph.append({"text": t, "parts": [[p, float(w)] for p, w in parts]})

    chunk_cases = []
    chunk_texts = EMPHASIS_HANDWRITTEN[:40] + long_prompts(rng) + emphasis_generated(rng, 60)
    for i, t in enumerate(chunk_texts):
        pad = EOS if i % 3 else 0
        words = CUSTOM_WORDS if i % 2 else []
        chunks = tokenize_chunks(sd, t, pad, custom_ids(words, 49408))
        case = {"text": t, "pad": pad, "custom": words}
        if chunks is None:
            case["error"] = True
        else:
            case["chunks"] = chunks
        chunk_cases.append(case)

    def dump(name, obj):
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")

    dump("hf_cases.json", hf_cases)
    dump("sdcpp_cases.json", sd_cases)
    dump("emphasis_cases.json", emph)
    dump("chunk_cases.json", chunk_cases)
    print(f"{len(texts)} tokenizer cases ({same} identical under HF and upstream rules), "
          f"{len(emph)} emphasis cases, {len(chunk_cases)} chunk cases")


if __name__ == "__main__":
    main()
