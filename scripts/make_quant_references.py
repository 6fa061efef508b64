#!/usr/bin/env python3
"""Computes transformers reference logits for the quantized fixtures in testdata/models/quant.

The GGUF and MLX files there were written by weft's own tools (weft convert, weft
synth). This script dequantizes them with independent code, gguf-py's
GGUFReader + gguf.quants.dequantize for GGUF and a numpy unpacker for MLX affine
quantization, maps the tensors back to Hugging Face names and layouts, loads
them into the transformers model built from the matching config.json (float32,
eager attention, CPU), and records what transformers computes. The engine, fed the
very same quantized weights, must then agree to float32 accuracy.

Run where torch, transformers and numpy are installed, with llama.cpp's gguf-py on
the path:

    PYTHONPATH=path/to/gguf-py python3 scripts/make_quant_references.py --out DIR

For each fixture NAME (NAME.gguf, or the MLX directory NAME) this writes to DIR:
  NAME.reference.json  tokens (48-token prompt), generated (32 greedy ids), rows,
                       vocab, prompt_len, source, library versions
  NAME.logits.f32      little-endian float32 [80, vocab]: rows 0..47 are the
                       teacher-forced prompt logits (one forward, no BOS); row 48+i
                       is the logits after feeding generated[i] through the KV cache.

Layout facts undone here (the HF checkpoint is the ground truth):
  * llama q/k rows: GGUF stores each head's rows in interleaved-pair order
    (llama.cpp's convert_hf_to_gguf permute), HF in half-split order;
  * Gemma 3 RMSNorm gains: GGUF stores 1+w, HF stores w;
  * llama3 rope scaling: GGUF has a rope_freqs tensor, HF has it in config.json,
    so the tensor is skipped and the config is used.
The converted fixtures reuse the prompt of their F32 source. Each dequantized tensor
is checked against the source checkpoint (a mapping mistake shows as a relative
error near 1, quantization as 0.005 to 0.1), and the logits are compared with the
source's, a sanity figure for the quantization error. For GGUF a control model
holds the source weights quantized by gguf-py itself, to tell weft's quantizer
apart from how much the model amplifies quantization noise. The two synthetic
quantizations of one model (same seed) are compared with each other.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from make_hf_fixtures import (GEN_LEN, MIN_MARGIN, PROMPT_ATTEMPTS, PROMPT_LEN,
                              F32_REL_TOL, cached_rows, prompt_tokens, rel_diff,
                              uncached_rows)

HERE = os.path.dirname(os.path.abspath(__file__))
QUANT_DIR = os.path.join(HERE, "..", "testdata", "models", "quant")
MODELS_DIR = os.path.join(HERE, "..", "testdata", "models")

CONVERTED = ("llama3-tiny", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny")
# Synthetic models: name -> first prompt seed. Both quantizations of one model share
# a prompt, chosen so that every greedy step of both wins by MIN_MARGIN.
SYNTHETIC = {"llama-256": 25600, "qwen2-256": 25700}
MLX = ("llama3-tiny", "qwen3-tiny")
# A converted fixture was mapped wrongly, not merely quantized, when one of its
# dequantized tensors differs from the source by this much (‖a-b‖/‖b‖), or when an
# 8-bit one's prompt logits differ by this much (max |a-b| / max |b|). 4-bit logits
# are not gated: these small random models amplify 4-bit noise to order 1.
WEIGHT_LIMIT = 0.3
SANITY_LIMIT = 0.5
NOTE = "transformers on weft's dequantized weights"

# GGUF block tensor name -> HF module path inside model.layers.N; the FFN norm
# differs for Gemma 3, which has norms before and after each sublayer.
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
GEMMA3_BLOCK_NAMES = dict(BLOCK_NAMES, ffn_norm="pre_feedforward_layernorm",
                          post_attention_norm="post_attention_layernorm",
                          post_ffw_norm="post_feedforward_layernorm")
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# GGUF tensors with no HF counterpart, by architecture.
SKIPPED = {"llama": {"rope_freqs.weight"}}
# general.architecture -> config.json model_type
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}


def log(*args):
    print(*args, flush=True)


def unpermute(w, n_head):
    """Undoes llama.cpp's q/k permutation.

    w is [n_head*head_dim, ...] with each head's rows ordered (pair i, member j) at
    row i*2+j; HF (rotate-half) wants member j of pair i at row j*head_dim/2 + i.
    """
    rest = w.shape[1:]
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest)
            .swapaxes(1, 2).reshape(w.shape))


def hf_name(gguf_name, arch):
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4:
        table = GEMMA3_BLOCK_NAMES if arch == "gemma3" else BLOCK_NAMES
        if parts[2] in table:
            return f"model.layers.{parts[1]}.{table[parts[2]]}.{parts[3]}"
    elif len(parts) == 2 and parts[0] in TOP_NAMES:
        return f"{TOP_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"no Hugging Face name for GGUF tensor {gguf_name!r} ({arch})")


def read_gguf(path, config):
    """Dequantized tensors of a GGUF file under HF names, in HF layout (float32),
    and each one's GGUF type name."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    if MODEL_TYPES.get(arch) != config.model_type:
        raise ValueError(f"{path}: architecture {arch!r} does not match config model_type "
                         f"{config.model_type!r}")
    tensors, qtypes = {}, {}
    for t in reader.tensors:
        if t.name in SKIPPED.get(arch, ()):
            log(f"  skip {t.name} (the HF config carries this)")
            continue
        shape = [int(d) for d in reversed(t.shape)]  # GGUF lists dims innermost first
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        name = hf_name(t.name, arch)
        if arch == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = (config.num_attention_heads if t.name.split(".")[-2] == "attn_q"
                     else config.num_key_value_heads)
            w = unpermute(w, heads)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            w = w - 1.0
        if name in tensors:
            raise ValueError(f"{path}: two GGUF tensors map to {name}")
        tensors[name] = w
        qtypes[name] = t.tensor_type
    counts = {}
    for q in qtypes.values():
        counts[q.name] = counts.get(q.name, 0) + 1
    log(f"  {os.path.basename(path)}: {arch}, {len(tensors)} tensors, types {counts}")
    return tensors, qtypes


def mlx_dequantize(packed, scales, biases, bits, group):
    """MLX affine dequantization: w = scale*q + bias per group of `group` inputs.

    packed is uint32 [out, in*bits/32], low bits first; scales and biases are
    [out, in/group].
    """
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    q = (packed[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(packed.shape[0], -1).astype(np.float32)
    if q.shape[1] != scales.shape[1] * group:
        raise ValueError(f"packed width {q.shape[1]} != {scales.shape[1]} groups of {group}")
    s = np.repeat(scales.astype(np.float32), group, axis=1)
    b = np.repeat(biases.astype(np.float32), group, axis=1)
    return s * q + b


def read_mlx(path, bits, group):
    from safetensors.numpy import load_file

    raw = {}
    for fname in sorted(os.listdir(path)):
        if fname.endswith(".safetensors"):
            raw.update(load_file(os.path.join(path, fname)))
    tensors = {}
    for name, arr in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if arr.dtype == np.uint32:
            if base is None or f"{base}.scales" not in raw or f"{base}.biases" not in raw:
                raise ValueError(f"{path}: packed tensor {name} without scales and biases")
            tensors[name] = mlx_dequantize(arr, raw[f"{base}.scales"], raw[f"{base}.biases"], bits, group)
        else:
            tensors[name] = arr.astype(np.float32)
    orphans = [n for n in raw if n.endswith((".scales", ".biases"))
               and n.rsplit(".", 1)[0] + ".weight" not in tensors]
    if orphans:
        raise ValueError(f"{path}: scales/biases with no packed weight: {orphans}")
    log(f"  {os.path.basename(path)}: {len(tensors)} tensors "
        f"({sum(a.dtype == np.uint32 for a in raw.values())} quantized, {bits}-bit, group {group})")
    return tensors


def weight_error(tensors, ref, label, against):
    """Worst per-tensor ‖a-b‖/‖b‖ of tensors against ref (same names and shapes).

    Quantization alone gives about 0.005 (8-bit) to 0.1 (4-bit); a row order or
    norm offset that was not undone gives 1 or more.
    """
    if set(tensors) != set(ref):
        raise ValueError(f"{label}: tensor names differ from {against}: "
                         f"{sorted(set(tensors) ^ set(ref))}")
    worst, worst_name = 0.0, None
    for name, w in tensors.items():
        if w.shape != ref[name].shape:
            raise ValueError(f"{label}: {name} has shape {w.shape}, {against} has {ref[name].shape}")
        err = float(np.linalg.norm(w - ref[name]) / np.linalg.norm(ref[name]))
        if err > worst:
            worst, worst_name = err, name
    log(f"  weights vs {against}: worst tensor rel error {worst:.3e} ({worst_name})")
    return worst


def requantized(ref, qtypes):
    """ref quantized and dequantized by gguf-py itself with the file's types."""
    import gguf

    return {n: np.array(gguf.quants.dequantize(gguf.quants.quantize(w, qtypes[n]), qtypes[n]),
                        dtype=np.float32).reshape(w.shape)
            for n, w in ref.items()}


def config_from_dict(d):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(d, f)
        return AutoConfig.from_pretrained(tmp)


def build(config, tensors, label):
    """The HF model of config holding exactly `tensors` (float32, eager attention)."""
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    expected = model.state_dict()
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(tensors) - allowed_missing)
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{label}: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings and "lm_head.weight" in tensors:
        raise ValueError(f"{label}: tied model has a separate lm_head.weight")
    for name, w in tensors.items():
        if tuple(expected[name].shape) != w.shape:
            raise ValueError(f"{label}: {name} has shape {w.shape}, model wants "
                             f"{tuple(expected[name].shape)}")
    result = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    if sorted(result.missing_keys) != sorted(set(expected) - set(tensors)) or result.unexpected_keys:
        raise ValueError(f"{label}: load_state_dict reported {result}")
    if config.tie_word_embeddings:
        if model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
            raise ValueError(f"{label}: lm_head is not tied to the embedding")
    log(f"  built {type(model).__name__}: {len(tensors)} tensors loaded"
        f"{', lm_head tied' if config.tie_word_embeddings else ''}")
    return model


def greedy(model, tokens, label):
    rows, generated, margins = cached_rows(model, tokens)
    full = uncached_rows(model, tokens + generated)
    rel, _ = rel_diff(rows, full)
    log(f"  {label}: cache vs no-cache max rel diff {rel:.3e}; smallest greedy margin "
        f"{min(margins):.4f}")
    if rel > F32_REL_TOL:
        raise RuntimeError(f"{label}: cached and uncached logits differ: rel {rel:.3e}")
    return rows, generated, min(margins)


def compare(rows, ref, n, label, against):
    """Sanity figures of rows[:n] against ref[:n]: max |a-b|/max |b|, worst row
    ‖a-b‖/‖b‖, and how many rows share the argmax."""
    a, b = rows[:n], ref[:n]
    rel_max, _ = rel_diff(a, b)
    row_l2 = float(((a - b).norm(dim=1) / b.norm(dim=1)).max())
    top1 = int((a.argmax(dim=1) == b.argmax(dim=1)).sum())
    log(f"  SANITY {label} vs {against}, first {n} rows: max rel {rel_max:.3e}, "
        f"worst row L2 rel {row_l2:.3e}, top-1 equal {top1}/{n}")
    return {"fixture": label, "against": against, "rel_max": rel_max, "row_l2": row_l2,
            "top1": f"{top1}/{n}"}


def source_reference(name):
    """reference.json, logits [rows, vocab] and float32 weights of a source model."""
    from safetensors.numpy import load_file

    d = os.path.join(MODELS_DIR, name)
    with open(os.path.join(d, "reference.json")) as f:
        ref = json.load(f)
    logits = np.fromfile(os.path.join(d, ref["logits_file"]), dtype="<f4")
    weights = {k: v.astype(np.float32) for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    return ref, torch.from_numpy(logits.reshape(ref["rows"], ref["vocab"])), weights


def write(out, fixture, model_file, tokens, generated, rows, margin, extra):
    vocab = rows.shape[1]
    assert rows.shape == (PROMPT_LEN + GEN_LEN, vocab), rows.shape
    rows.numpy().astype("<f4").tofile(os.path.join(out, f"{fixture}.logits.f32"))
    ref = {
        "tokens": tokens,
        "generated": generated,
        "rows": PROMPT_LEN + GEN_LEN,
        "vocab": vocab,
        "prompt_len": PROMPT_LEN,
        "source": fixture,
        "model_file": model_file,
        "logits_file": f"{fixture}.logits.f32",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "note": NOTE,
        "min_margin": margin,
    }
    ref.update(extra)
    with open(os.path.join(out, f"{fixture}.reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    log(f"  wrote {fixture}.reference.json and {fixture}.logits.f32")


def converted_jobs():
    """(fixture, model file, F32 source) of every fixture converted from a
    reference model, GGUF and MLX."""
    jobs = [(f"{m}-{q}", f"{m}-{q}.gguf", m) for m in CONVERTED for q in ("Q8_0", "Q4_0")]
    return jobs + [(f"{m}-mlx4", f"{m}-mlx4", m) for m in MLX]


def run_converted(out, sanity, fixture, model_file, src):
    log(f"=== {fixture}")
    path = os.path.join(QUANT_DIR, model_file)
    ref, ref_logits, ref_weights = source_reference(src)
    qtypes = None
    if model_file.endswith(".gguf"):
        config = AutoConfig.from_pretrained(os.path.join(MODELS_DIR, src))
        tensors, qtypes = read_gguf(path, config)
    else:
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        quant = cfg.pop("quantization")
        cfg.pop("quantization_config", None)
        config = config_from_dict(cfg)
        tensors = read_mlx(path, quant["bits"], quant["group_size"])
    werr = weight_error(tensors, ref_weights, fixture, f"{src}/model.safetensors")
    model = build(config, tensors, fixture)
    tokens = ref["tokens"]
    rows, generated, margin = greedy(model, tokens, fixture)
    fig = compare(rows, ref_logits, PROMPT_LEN, fixture, f"{src}/logits.f32")
    same = sum(int(a == b) for a, b in zip(generated, ref["generated"]))
    log(f"  generated {generated}; {same}/{GEN_LEN} equal to {src}'s")
    fig.update(generated_equal=f"{same}/{GEN_LEN}", weight_rel_max=werr)
    if qtypes is not None:
        # Control: the source weights quantized by gguf-py instead of weft. Its
        # logit error shows how much this tiny random model amplifies
        # quantization noise, independently of weft's quantizer.
        control = requantized(ref_weights, qtypes)
        diff = max(float(np.abs(control[n] - tensors[n]).max()) for n in tensors)
        same_elems = sum(int((control[n] == tensors[n]).sum()) for n in tensors)
        total = sum(w.size for w in tensors.values())
        log(f"  weft vs gguf-py quantization of the source: max |diff| {diff:.3e}, "
            f"{same_elems}/{total} elements identical")
        crow = uncached_rows(build(config, control, f"{fixture} (gguf-py control)"), tokens)
        cfig = compare(crow, ref_logits, PROMPT_LEN, f"{fixture} gguf-py control", f"{src}/logits.f32")
        fig.update(control_rel_max=cfig["rel_max"], control_top1=cfig["top1"],
                   weights_identical_to_gguf_py=f"{same_elems}/{total}")
    sanity.append(fig)
    if werr >= WEIGHT_LIMIT or (fixture.endswith("Q8_0") and fig["rel_max"] >= SANITY_LIMIT):
        raise RuntimeError(f"{fixture}: weights (rel {werr:.3f}) or logits (rel "
                           f"{fig['rel_max']:.3f}) far from {src}; the weight mapping is wrong")
    write(out, fixture, model_file, tokens, generated, rows, margin,
          {"prompt_from": f"{src}/reference.json"})


def run_synthetic(out, sanity, name, seed):
    """A synthetic GGUF model in two quantizations. There is no F32 source, so the
    two (same seed, same underlying weights) are compared with each other instead."""
    with open(os.path.join(QUANT_DIR, f"{name}.config.json")) as f:
        config = config_from_dict(json.load(f))
    models, weights = {}, {}
    for q in ("Q4_K", "Q6_K"):
        fixture = f"{name}-{q}"
        log(f"=== {fixture}")
        weights[q], _ = read_gguf(os.path.join(QUANT_DIR, f"{fixture}.gguf"), config)
        models[fixture] = build(config, weights[q], fixture)
    werr = weight_error(weights["Q4_K"], weights["Q6_K"], f"{name}-Q4_K", f"{name}-Q6_K")
    best = None
    for attempt in range(PROMPT_ATTEMPTS):
        tokens = prompt_tokens(seed + attempt, config.vocab_size)
        margin = min(min(cached_rows(m, tokens)[2]) for m in models.values())
        if best is None or margin > best[2]:
            best = (tokens, seed + attempt, margin)
        if margin >= MIN_MARGIN:
            break
    tokens, used_seed, _ = best
    log(f"  {name}: prompt seed {used_seed} after {attempt + 1} draw(s), smallest margin "
        f"over both {best[2]:.4f}")
    results = {}
    for fixture, model in models.items():
        rows, generated, margin = greedy(model, tokens, fixture)
        log(f"  {fixture} generated {generated}; logits row 0 std {rows[0].std():.3f}")
        results[fixture] = rows
        write(out, fixture, f"{fixture}.gguf", tokens, generated, rows, margin,
              {"prompt_seed": used_seed, "config": f"{name}.config.json"})
    q4, q6 = results[f"{name}-Q4_K"], results[f"{name}-Q6_K"]
    fig = compare(q4, q6, PROMPT_LEN, f"{name}-Q4_K", f"{name}-Q6_K")
    fig["weight_rel_max"] = werr
    sanity.append(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for the reference files")
    args = ap.parse_args()
    import gguf

    log(f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"numpy {np.__version__}, gguf-py from {os.path.dirname(gguf.__file__)}, "
        f"python {sys.version.split()[0]}")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    sanity, failures = [], []
    steps = [(run_converted, job) for job in converted_jobs()]
    steps += [(run_synthetic, item) for item in SYNTHETIC.items()]
    for step, job in steps:
        try:
            with torch.no_grad():
                step(args.out, sanity, *job)
        except Exception:
            failures.append(job[0])
            log(traceback.format_exc())
    log("=== sanity\n" + json.dumps(sanity, indent=1))
    if failures:
        log("FAILED:", failures)
        sys.exit(1)
    log(f"all references written to {args.out}")


if __name__ == "__main__":
    main()
