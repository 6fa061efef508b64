"""Writes cases.json: small tokenizer.json documents built with Hugging Face's
`tokenizers` library, and the ids that library gives for a few texts, to
check this package's reading of Metaspace prepend schemes, added tokens'
lstrip/rstrip, NFC and ignore_merges against the real thing.

Run: python3 gen.py OUTDIR   (needs `pip install tokenizers`)
"""
import json
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

BYTES = ["<0x%02X>" % b for b in range(256)]


def spm(scheme):
    vocab = {"<unk>": 0, "<s>": 1}
    for t in BYTES + ["▁", "a", "b", "▁a", "▁b", "ab", "▁▁"]:
        vocab[t] = len(vocab)
    merges = [("▁", "a"), ("▁", "b"), ("a", "b"), ("▁", "▁")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    return tok


def byte_level(regex=None, ignore_merges=False, nfc=False, added=()):
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["hello"] = len(vocab) if "hello" not in vocab else vocab["hello"]
    vocab["Ġworld"] = len(vocab)  # reachable only whole, with ignore_merges
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    if regex:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    for a in added:
        tok.add_tokens([a])
    return tok


LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPM_TEXTS = ["<s>a a", "a<s>b", " a", "a  b", "ab<s> b", "", "<s>", "x y"]
STRIP_TEXTS = ["a <|x|>  b", "a\t<|x|>\nb", "<|x|>", " <|x|> "]
BL_TEXTS = ["hello world", "caf\u0065\u0301 hello", "Hello  world!", "\u1100\u1161 x"]

CASES = {
    "spm-first": (lambda: spm("first"), SPM_TEXTS),
    "spm-always": (lambda: spm("always"), SPM_TEXTS),
    "spm-never": (lambda: spm("never"), SPM_TEXTS),
    "strip-none": (lambda: byte_level(added=[AddedToken("<|x|>", special=True)]), STRIP_TEXTS),
    "strip-left": (lambda: byte_level(added=[AddedToken("<|x|>", special=True, lstrip=True)]), STRIP_TEXTS),
    "strip-right": (lambda: byte_level(added=[AddedToken("<|x|>", special=True, rstrip=True)]), STRIP_TEXTS),
    "strip-both": (lambda: byte_level(added=[AddedToken("<|x|>", special=False, lstrip=True, rstrip=True)]), STRIP_TEXTS),
    "nfc": (lambda: byte_level(nfc=True), BL_TEXTS),
    "llama3-merges": (lambda: byte_level(regex=LLAMA3), BL_TEXTS),
    "llama3-ignore-merges": (lambda: byte_level(regex=LLAMA3, ignore_merges=True), BL_TEXTS),
}

out = {}
for name, (build, texts) in CASES.items():
    try:
        tok = build()
        out[name] = {
            "tokenizer": json.loads(tok.to_str()),
            "encodings": [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts],
        }
    except Exception as e:  # recorded, so that one call reports every case
        out[name] = {"error": repr(e)}
        print(name, repr(e), file=sys.stderr)
import tokenizers
print("tokenizers", tokenizers.__version__, file=sys.stderr)
with open(sys.argv[1] + "/cases.json", "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
