"""Makes spm_wpm_reference.json: what the reference tokenizers give for the
shared test texts, checked by TestSPMReference and TestWPMReference.

- SentencePiece (the sentencepiece package) with Llama 2's tokenizer.model,
  no BOS, on War and Peace cut into lines and into paragraphs;
- Hugging Face's BERT WordPiece (the tokenizers package: lowercase, strip
  accents, Chinese characters apart) with the vocabulary of llama.cpp's
  ggml-vocab-bert-bge.gguf turned back into vocab.txt form, no [CLS]/[SEP],
  on the same lines and on the 83 multilingual conformance strings.

The novel's token ids would be megabytes, so they are kept as SHA-256 digests
of chunks of CHUNK texts, each text's ids written as decimal numbers joined
by spaces and ended by a newline. The multilingual ids are kept as they are.

Usage: python spm_wpm_reference.py TESTDATA_DIR OUT.json
(TESTDATA_DIR is the shared testdata folder.)
"""
import hashlib
import json
import struct
import sys

import sentencepiece
import tokenizers
from tokenizers import BertWordPieceTokenizer

CHUNK = 1000


def gguf_arrays(path, keys):
    """Reads the named array values of a GGUF file's metadata."""
    data = open(path, "rb").read()
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not GGUF")
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    pos = 4 + 4 + 8 + 8
    (n_kv,) = struct.unpack_from("<Q", data, 16)

    def string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        s = data[pos + 8 : pos + 8 + n].decode("utf-8")
        pos += 8 + n
        return s

    def value(t):
        nonlocal pos
        if t == 8:
            return string()
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            return [value(et) for _ in range(n)]
        fmt = scalar[t]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    out = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack_from("<I", data, pos)
        pos += 4
        v = value(t)
        if key in keys:
            out[key] = v
    return out


def bert_vocab(gguf_path):
    """llama.cpp stores BERT's "word" as "▁word" and "##piece" as "piece"."""
    kv = gguf_arrays(gguf_path, {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"})
    vocab = {}
    for i, (tok, typ) in enumerate(zip(kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"])):
        if typ == 1:
            tok = tok[1:] if tok.startswith("\u2581") else "##" + tok
        vocab[tok] = i
    return vocab


def digests(rows):
    out = []
    for i in range(0, len(rows), CHUNK):
        h = hashlib.sha256()
        for ids in rows[i : i + CHUNK]:
            h.update((" ".join(map(str, ids)) + "\n").encode())
        out.append(h.hexdigest())
    return out


def main():
    td, out_path = sys.argv[1], sys.argv[2]
    text = open(f"{td}/ollama-tokenizer/war-and-peace.txt", encoding="utf-8").read().replace("\r\n", "\n")
    lines = [l for l in text.split("\n") if l]
    paras = [p for p in (p.strip("\n") for p in text.split("\n\n")) if p]
    multi = [e["text"] for e in json.load(open(f"{td}/swift-transformers/multilingual-conformance/inputs.json", encoding="utf-8"))]

    sp = sentencepiece.SentencePieceProcessor(model_file=f"{td}/llama2-tokenizer/tokenizer.model")
    bert = BertWordPieceTokenizer(bert_vocab(f"{td}/llamacpp-vocab/ggml-vocab-bert-bge.gguf"),
                                  lowercase=True, clean_text=True, handle_chinese_chars=True)
    bert_ids = lambda xs: [e.ids for e in bert.encode_batch(xs, add_special_tokens=False)]

    ref = {
        "generator": "tokenizer/testdata/spm_wpm_reference.py",
        "sentencepiece": sentencepiece.__version__,
        "tokenizers": tokenizers.__version__,
        "chunk": CHUNK,
        "counts": {"lines": len(lines), "paragraphs": len(paras), "multilingual": len(multi)},
        "spm_lines": digests(sp.encode(lines)),
        "spm_paragraphs": digests(sp.encode(paras)),
        "wpm_lines": digests(bert_ids(lines)),
        "wpm_multilingual": bert_ids(multi),
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
