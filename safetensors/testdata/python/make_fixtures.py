"""Cross-check the Go safetensors package against the Python libraries.

Run from the repository root with OUT set to an output folder:

    OUT=/tmp/out python3 safetensors/testdata/python/make_fixtures.py

1. Reads the Go writer's golden files (safetensors/testdata/go) with the
   safetensors library and checks dtype, shape and bytes of every tensor
   against what the Go test wrote; loads the Go-written two-shard tiny Llama
   with transformers and checks every weight.
2. Writes fixtures for the Go reader: alldtypes.safetensors written by
   safetensors.torch.save_file with a JSON sidecar of each tensor's dtype,
   shape and bytes, and a sharded tiny Llama written by transformers'
   save_pretrained (tinyllama.tar) with a sidecar of sha256 per tensor.
Everything checked is reported in report.txt; any mismatch exits non-zero.
"""

import hashlib
import json
import os
import sys
import tarfile
import tempfile

import numpy as np
import safetensors
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

OUT = os.environ["OUT"]
GO = os.path.join("safetensors", "testdata", "go")
report = []
failures = []


def log(msg):
    print(msg)
    report.append(msg)


def check(cond, msg):
    if not cond:
        failures.append(msg)
        log("FAIL " + msg)


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# The Go side: everyDType and goldenAllDTypes in roundtrip_test.go and
# golden_test.go. Tensor i of DTypes() holds pattern(6*size, i).
GO_DTYPES = ["F64", "I64", "U64", "F32", "I32", "U32", "F16", "BF16", "I16", "U16",
             "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2"]
SIZES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
         "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
TORCH = {"F64": torch.float64, "I64": torch.int64, "U64": torch.uint64, "F32": torch.float32,
         "I32": torch.int32, "U32": torch.uint32, "F16": torch.float16, "BF16": torch.bfloat16,
         "I16": torch.int16, "U16": torch.uint16, "I8": torch.int8, "U8": torch.uint8,
         "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
NAME_OF = {v: k for k, v in TORCH.items()}


def pattern(n, seed):
    return bytes(((i * 7) + seed) & 0xFF for i in range(n))


def go_expected():
    exp = {}
    for i, dt in enumerate(GO_DTYPES):
        data = bytes([0, 1, 1, 0, 0, 1]) if dt == "BOOL" else pattern(6 * SIZES[dt], i)
        exp["t." + dt.lower()] = (dt, [2, 3], data)
    exp["scalar"] = ("F32", [], pattern(4, 99))
    exp["empty"] = ("BF16", [4, 0, 2], b"")
    exp['odd "name" <\u00e9>\\'] = ("I16", [1, 2], pattern(4, 200))
    return exp


def check_go_alldtypes():
    path = os.path.join(GO, "alldtypes.safetensors")
    exp = go_expected()
    with safe_open(path, framework="pt") as f:
        check(f.metadata() == {"format": "pt"}, f"{path}: metadata {f.metadata()}")
        keys = set(f.keys())
        check(keys == set(exp), f"{path}: keys {sorted(keys)}")
        for name in sorted(keys & set(exp)):
            t = f.get_tensor(name)
            dt, shape, data = exp[name]
            check(NAME_OF.get(t.dtype) == dt, f"{path}: {name}: dtype {t.dtype}, want {dt}")
            check(list(t.shape) == shape, f"{path}: {name}: shape {list(t.shape)}, want {shape}")
            check(raw_bytes(t) == data, f"{path}: {name}: bytes differ")
    log(f"ok   python safetensors reads {path}: {len(exp)} tensors, every dtype, metadata")


def check_go_tinyllama():
    d = os.path.join(GO, "tinyllama")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        check(not info.get(k), f"{d}: {k} = {info.get(k)}")
    with open(os.path.join(d, "model.safetensors.index.json")) as fh:
        order = list(json.load(fh)["weight_map"])
    params = dict(model.named_parameters())
    for k, name in enumerate(order):
        p = params[name].detach()
        i = np.arange(p.numel(), dtype=np.int64)
        want = (((i * 13 + k) % 251) - 125).astype(np.float32) / np.float32(256)
        got = p.reshape(-1).numpy()
        check(got.dtype == np.float32 and np.array_equal(got, want), f"{d}: {name}: values differ")
    logits = model(torch.tensor([[1, 2, 3]])).logits
    check(tuple(logits.shape) == (1, 3, 32) and torch.isfinite(logits).all().item(), f"{d}: forward pass {logits.shape}")
    log(f"ok   transformers loads {d}: {len(order)} weights from 2 shards, values exact, forward pass runs")


def make_python_alldtypes():
    tensors = {}
    for dt, tdt in TORCH.items():
        base = torch.arange(6, dtype=torch.int64).reshape(2, 3)
        if dt == "BOOL":
            t = base % 2 == 1
        elif dt in ("F8_E4M3", "F8_E5M2"):
            t = (base.to(torch.float32) / 4).to(tdt)
        else:
            t = (base * 3 - (0 if dt.startswith("U") else 5)).to(tdt)
        tensors["py." + dt.lower()] = t
    tensors["py.scalar"] = torch.tensor(2.5, dtype=torch.float32)
    tensors["py.empty"] = torch.zeros(0, 3, dtype=torch.float16)
    path = os.path.join(OUT, "alldtypes.safetensors")
    save_file(tensors, path, metadata={"format": "pt", "writer": "safetensors.torch.save_file"})
    side = {n: {"dtype": NAME_OF[t.dtype], "shape": list(t.shape), "hex": raw_bytes(t).hex()}
            for n, t in tensors.items()}
    with open(os.path.join(OUT, "alldtypes.json"), "w") as fh:
        json.dump(side, fh, indent=1, sort_keys=True)
        fh.write("\n")
    log(f"made alldtypes.safetensors with save_file: {len(tensors)} tensors")


def make_python_tinyllama():
    torch.manual_seed(0)
    with open(os.path.join(GO, "tinyllama", "config.json")) as fh:
        cfg = transformers.LlamaConfig(**json.load(fh))
    model = transformers.LlamaForCausalLM(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, max_shard_size="6KB")
        names = sorted(os.listdir(tmp))
        log(f"save_pretrained wrote {names}")
        side = {}
        for n in names:
            if n.endswith(".safetensors"):
                with safe_open(os.path.join(tmp, n), framework="pt") as f:
                    for k in f.keys():
                        t = f.get_tensor(k)
                        side[k] = {"file": n, "dtype": NAME_OF[t.dtype], "shape": list(t.shape),
                                   "sha256": hashlib.sha256(raw_bytes(t)).hexdigest()}
        check(any(n.endswith(".index.json") for n in names), "save_pretrained wrote no index")
        with tarfile.open(os.path.join(OUT, "tinyllama.tar"), "w") as tar:
            for n in names:
                if n.endswith(".safetensors") or n.endswith(".index.json"):
                    tar.add(os.path.join(tmp, n), arcname=n)
    with open(os.path.join(OUT, "tinyllama.json"), "w") as fh:
        json.dump(side, fh, indent=1, sort_keys=True)
        fh.write("\n")
    log(f"made tinyllama.tar with save_pretrained: {len(side)} tensors")


log(f"python {sys.version.split()[0]} torch {torch.__version__} safetensors {safetensors.__version__} "
    f"transformers {transformers.__version__}")
for step in (check_go_alldtypes, check_go_tinyllama, make_python_alldtypes, make_python_tinyllama):
    try:
        step()
    except Exception as e:  # report every step, not just the first failure
        check(False, f"{step.__name__}: {type(e).__name__}: {e}")
with open(os.path.join(OUT, "report.txt"), "w") as fh:
    fh.write("\n".join(report) + "\n")
sys.exit(1 if failures else 0)
