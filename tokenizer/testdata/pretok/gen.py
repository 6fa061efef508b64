"""Writes cases.json: how Python's `regex` module (the PCRE-like engine
Hugging Face tokenizers' regexes are written for) splits random strings
with each pre-tokenizer regex the tokenizer package implements by hand.

Run from this directory: python3 gen.py   (needs `pip install regex`)
A split keeps matches and the gaps between them (HF's "Isolated"); each is
written as the UTF-8 byte lengths of its pieces, by regex, in REGEXES order.
"""
import json
import random

import regex

REGEXES = [
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"[\p{P}\$\+<=>\^~\|]+",
    r"[\p{P}\$\+<=>\^~\|`]+",
    r"\p{N}",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    r" ?[^(\s|.,!?…。，、।۔،)]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

POOL = (
    list("abczAZstmdrevlSTMDREVL'''") + ["é", "ß", "ſ", "Ω", "Ж", "ǅ", "ʰ", "ا", "中", "日", "가", "あ", "ア", "ऄ"]
    + list("0159") + ["²", "٣", "Ⅳ", "½"]
    + [" "] * 8 + ["\t", "\n", "\n", "\r", "\u00a0", "\u3000", "\u2009"]
    + list('.,!?-()"_') + ["…", "。", "，", "、", "।", "‘", "’", "“", "！", "＄"]
    + list("$+<=>^~|`") + ["€", "😀", "©"]
    + ["\u0301", "\u0903", "\x00", "\x1b"]
)


def split(rx, text):
    out, i = [], 0
    for m in rx.finditer(text):
        if m.start() > i:
            out.append(text[i:m.start()])
        out.append(m.group())
        i = m.end()
    if i < len(text):
        out.append(text[i:])
    return [len(p.encode()) for p in out]


def main():
    rnd = random.Random(7)
    texts = ["Hello world", "  leading", "trailing   ", "a\t\tb", "you'll I'M", "123456 1234",
             "\n\n  x", "x \n y", "HelloWORLDFoo", "ǅa\u0301bcD", "\u0301Ab", "a/\n/b", "don't ſtop", "'s'S'sa", "  \n", "a  ", "$1.00!", "中文 ＄5"]
    texts += ["".join(rnd.choice(POOL) for _ in range(rnd.randint(1, 24))) for _ in range(200)]
    compiled = [(r, regex.compile(r.replace("$", r"\Z") if r.endswith("$") else r)) for r in REGEXES]
    cases = [{"text": t, "splits": [split(rx, t) for _, rx in compiled]} for t in texts]
    with open("cases.json", "w", encoding="utf-8") as f:
        json.dump({"regexes": REGEXES, "cases": cases}, f, ensure_ascii=False, separators=(",", ":"))


main()
