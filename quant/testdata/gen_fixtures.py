#!/usr/bin/env python3
"""Builds the reference fixtures of weft's quant package from gguf-py.

For every type gguf-py (llama.cpp's gguf-py/gguf/quants.py) can dequantize,
it makes a few blocks of pseudo-random bytes from a fixed seed, with the fp16
scale fields set to finite values of moderate size so that the outputs are
finite, and records gguf-py's float32 output. The i-quant types also get
blocks whose grid indices run through every entry of their lattice table.
For every type gguf-py can quantize, it records gguf-py's bytes for rows of
pseudo-random float32 (plus edge cases). numpy's own conversions of the plain
integer and float64 types are recorded too.

Writes OUT/fixtures.json (type table and an index of records) and
OUT/fixtures.bin (the records' bytes, little-endian).

Usage: gen_fixtures.py GGUF_PY_DIR OUT_DIR SOURCE_COMMIT
"""

import importlib
import json
import os
import sys
import types

import numpy as np

SEED = 20250220
QK_K = 256


def load_gguf(gguf_py_dir):
    """Imports gguf.constants and gguf.quants without gguf/__init__.py, which
    pulls in the reader, writer and their optional dependencies."""
    pkg = types.ModuleType("gguf")
    pkg.__path__ = [os.path.join(gguf_py_dir, "gguf")]
    sys.modules["gguf"] = pkg
    return importlib.import_module("gguf.constants"), importlib.import_module("gguf.quants")


# Byte offsets of the fp16 scale fields in each block (ggml-common.h).
FP16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "TQ1_0": [52], "TQ2_0": [64],
    "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
    "IQ1_S": [0], "IQ4_NL": [0], "IQ4_XS": [0],
    "IQ1_M": [], "MXFP4": [], "BF16": [], "F16": [], "F32": [],
}


class Blob:
    def __init__(self):
        self.parts, self.size = [], 0

    def add(self, arr):
        b = np.ascontiguousarray(arr).tobytes()
        off = self.size
        self.parts.append(b)
        self.size += len(b)
        return [off, len(b)]


def scale_value(rng, i):
    """A finite fp16 scale: block 1 negative, block 2 subnormal, others
    random magnitudes between 2^-12 and 2 of either sign."""
    if i == 1:
        return np.float16(-0.0371)
    if i == 2:
        return np.float16(2.0 ** -20)
    mag = 2.0 ** rng.uniform(-12, 1)
    return np.float16(mag if rng.random() < 0.5 else -mag)


def set_scales(name, blocks, rng):
    for i in range(blocks.shape[0]):
        for off in FP16_FIELDS[name]:
            blocks[i, off:off + 2] = np.frombuffer(scale_value(rng, i).tobytes(), np.uint8)
        if name == "IQ1_M":
            # d is spread over the top nibbles of the four u16 scale words.
            h = int(scale_value(rng, i).view(np.uint16))
            words = blocks[i, 48:56].copy().view("<u2")
            for k in range(4):
                words[k] = (int(words[k]) & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
            blocks[i, 48:56] = words.view(np.uint8)
        if name == "MXFP4":
            blocks[i, 0] = rng.integers(100, 150)


def put_u16(block, off, value, mask):
    old = int(block[off]) | int(block[off + 1]) << 8
    new = (old & ~mask & 0xFFFF) | (value & mask)
    block[off], block[off + 1] = new & 0xFF, new >> 8


def enumerate_grid(name, blocks):
    """Overwrites the grid indices of blocks so that together they name every
    lattice entry in order; signs and scales stay random."""
    nb = blocks.shape[0]
    if name == "IQ2_XXS":      # 256 entries, 32 per block: bytes 2+8ib+l
        for k in range(nb * 32):
            b, r = divmod(k, 32)
            blocks[b, 2 + 8 * (r // 4) + r % 4] = k % 256
    elif name == "IQ2_XS":     # 512 entries: low 9 bits of u16 2+2r
        for k in range(nb * 32):
            b, r = divmod(k, 32)
            put_u16(blocks[b], 2 + 2 * r, k % 512, 0x01FF)
    elif name == "IQ2_S":      # 1024 entries: qs[2+r] | qh[66+r/4] bits 2(r%4)
        for k in range(nb * 32):
            b, r = divmod(k, 32)
            idx = k % 1024
            blocks[b, 2 + r] = idx & 0xFF
            q = 66 + r // 4
            blocks[b, q] = (int(blocks[b, q]) & ~(3 << (2 * (r % 4)))) | ((idx >> 8) << (2 * (r % 4)))
    elif name == "IQ3_XXS":    # 256 entries, 64 per block: bytes 2+r
        for k in range(nb * 64):
            b, r = divmod(k, 64)
            blocks[b, 2 + r] = k % 256
    elif name == "IQ3_S":      # 512 entries: qs[2+r] | qh[66+r/8] bit r%8
        for k in range(nb * 64):
            b, r = divmod(k, 64)
            idx = k % 512
            blocks[b, 2 + r] = idx & 0xFF
            q = 66 + r // 8
            blocks[b, q] = (int(blocks[b, q]) & ~(1 << (r % 8))) | ((idx >> 8) << (r % 8))
    elif name == "IQ1_S":      # 2048 entries: qs[2+r] | u16 34+2(r/4) bits 3(r%4)
        for k in range(nb * 32):
            b, r = divmod(k, 32)
            idx = k % 2048
            blocks[b, 2 + r] = idx & 0xFF
            sh = 3 * (r % 4)
            put_u16(blocks[b], 34 + 2 * (r // 4), (idx >> 8) << sh, 7 << sh)
    elif name == "IQ1_M":      # 2048 entries: qs[r] | qh[32+r/2] bits 4(r%2)..+2
        for k in range(nb * 32):
            b, r = divmod(k, 32)
            idx = k % 2048
            blocks[b, r] = idx & 0xFF
            q, sh = 32 + r // 2, 4 * (r % 2)
            blocks[b, q] = (int(blocks[b, q]) & ~(7 << sh)) | ((idx >> 8) << sh)
    else:
        raise ValueError(name)


GRID_BLOCKS = {"IQ2_XXS": 8, "IQ2_XS": 16, "IQ2_S": 32, "IQ3_XXS": 4, "IQ3_S": 8, "IQ1_S": 64, "IQ1_M": 64}


def f16_specials():
    v = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.996, 65520.0, -65520.0, 1e5, 2.0 ** -14, 2.0 ** -24,
         2.0 ** -25, 2.0 ** -25 * 1.0000001, 1.5 * 2.0 ** -24, 2.5 * 2.0 ** -24, 3 * 2.0 ** -26,
         1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 2.0 ** -11 + 2.0 ** -23, 2048 + 1, 2048 + 3,
         float("inf"), float("-inf"), float("nan"), 6.1e-5, 6.0975e-5, 1e-8, 3.0e38, -3.0e38]
    return np.array(v, dtype=np.float32)


def bf16_specials():
    bits = [0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
            0x7FC00000, 0x7F800001, 0xFFA0F000, 0x00000001, 0x80008000, 0x00018000, 0x3F7FFFFF]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def quant_rows(rng, name):
    """Float32 inputs for a quantize fixture, a multiple of 256 elements."""
    rows = [rng.standard_normal(QK_K).astype(np.float32) * s for s in (1.0, 1e-3, 300.0)]
    rows.append(rng.uniform(-1, 1, QK_K).astype(np.float32))
    edge = rng.standard_normal(QK_K).astype(np.float32)
    edge[0:32] = 0                          # an all-zero block
    edge[32:64] = 0.25                      # a constant block
    edge[64:96] = 0
    edge[70] = -3.5                         # a lone negative peak
    edge[96:128] = np.arange(32, dtype=np.float32) - 16   # evenly spaced, ties
    edge[128:160] *= 1e-6
    edge[160:161] = -edge[160:192].max() * 4
    rows.append(edge)
    x = np.concatenate(rows)
    if name in ("F16", "BF16"):
        sp = f16_specials() if name == "F16" else bf16_specials()
        pad = (-len(sp)) % QK_K
        x = np.concatenate([x, sp, rng.standard_normal(pad).astype(np.float32)])
    return x


def main():
    gguf_py, out_dir, commit = sys.argv[1:4]
    constants, quants = load_gguf(gguf_py)
    QT = constants.GGMLQuantizationType
    rng = np.random.default_rng(SEED)
    blob = Blob()
    records = []

    type_table = {t.name: {"id": int(t), "block_size": constants.GGML_QUANT_SIZES[t][0],
                           "type_size": constants.GGML_QUANT_SIZES[t][1]} for t in QT}

    deq_types = [QT.F32, QT.F16] + sorted(quants._type_traits, key=int)
    for t in deq_types:
        bs, ts = constants.GGML_QUANT_SIZES[t]
        n = 6 if bs > 1 else 512
        blocks = rng.integers(0, 256, size=(n, ts), dtype=np.uint8)
        set_scales(t.name, blocks, rng)
        if t.name in GRID_BLOCKS:
            grid = rng.integers(0, 256, size=(GRID_BLOCKS[t.name], ts), dtype=np.uint8)
            set_scales(t.name, grid, rng)
            enumerate_grid(t.name, grid)
            blocks = np.concatenate([blocks, grid])
        raw = blocks.reshape(-1)
        want = np.asarray(quants.dequantize(raw, t), dtype=np.float32).reshape(-1)
        assert want.size == blocks.shape[0] * bs, t.name
        records.append({"source": "gguf-py", "op": "dequantize", "type": t.name, "count": int(want.size),
                        "in": blob.add(raw), "out": blob.add(want.astype("<f4"))})

    # numpy's conversions of the plain types gguf-py leaves to numpy.
    for name, dt in (("I8", "<i1"), ("I16", "<i2"), ("I32", "<i4"), ("I64", "<i8"), ("F64", "<f8")):
        if dt == "<f8":
            vals = np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-40, 40, 200),
                                   [1 + 2.0 ** -24, 1 + 3 * 2.0 ** -24, 1e39, -1e39, 1e-46, 0.0, -0.0]])
        else:
            info = np.iinfo(dt)
            vals = np.concatenate([rng.integers(info.min, info.max, 250, dtype=dt, endpoint=True),
                                   [info.min, info.max, 0, -1, 16777217 if info.bits > 16 else 1]])
        vals = np.asarray(vals).astype(dt)
        records.append({"source": "numpy", "op": "dequantize", "type": name, "count": int(vals.size),
                        "in": blob.add(vals), "out": blob.add(vals.astype("<f4"))})

    for t in [QT.F16] + sorted(quants._type_traits, key=int):
        x = quant_rows(rng, t.name)
        try:
            got = quants.quantize(x, t)
        except NotImplementedError:
            continue
        got = np.asarray(got).view(np.uint8).reshape(-1)
        records.append({"source": "gguf-py", "op": "quantize", "type": t.name, "count": int(x.size),
                        "in": blob.add(x.astype("<f4")), "out": blob.add(got)})

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "fixtures.bin"), "wb") as f:
        for p in blob.parts:
            f.write(p)
    meta = {
        "generator": "quant/testdata/gen_fixtures.py",
        "reference": "llama.cpp gguf-py at " + commit,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "seed": SEED,
        "types": type_table,
        "records": records,
    }
    with open(os.path.join(out_dir, "fixtures.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{len(records)} records, {blob.size} bytes")


if __name__ == "__main__":
    main()
