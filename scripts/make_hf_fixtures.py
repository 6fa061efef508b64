#!/usr/bin/env python3
"""Builds the tiny random-weight reference models in testdata/models.

Each model is a real Hugging Face checkpoint (config.json, generation_config.json,
safetensors) made with transformers, plus the logits transformers itself computes
for a fixed token sequence, so the Go engine can be checked against the reference
implementation without downloading anything.

Run where torch and transformers are installed (CPU is enough):

    PYTHONUNBUFFERED=1 python3 scripts/make_hf_fixtures.py --out /tmp/hf-fixtures

Every weight is drawn again from normal(0, 0.2) (RMSNorm gains as 1 + normal(0, 0.2),
except Gemma 3, whose checkpoints store w and whose model computes 1 + w), so that
logits are far from uniform and greedy decoding is decided by clear margins.

One exception, Gemma 3: its tied embedding is scaled by sqrt(hidden) on the way in,
so with unit-gain post-sublayer norms the residual stream stays dominated by the
current token's own embedding and, through the tied head, every greedy step just
repeats the last token. The stored post_attention_layernorm and
post_feedforward_layernorm weights are therefore drawn from normal(shift, 0.2), with
the smallest shift from GEMMA3_POST_NORM_SHIFTS whose greedy continuation is varied
(or, when none is, the most varied one); the shift is written to reference.json.

Per model directory this writes, beside the checkpoint:
  reference.json  tokens (the 48-token prompt), generated (32 greedy ids), rows,
                  vocab, prompt_len, dtype, library versions, rope inverse frequencies
  logits.f32      little-endian float32 [rows, vocab]: rows 0..47 are the
                  teacher-forced logits of the prompt (one forward, no BOS added);
                  row 48+i is the logits after feeding generated[i] through the KV
                  cache, and generated[i] is the argmax of row 47+i.
"""

import argparse
import copy
import inspect
import json
import os
import shutil
import sys
import traceback

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

PROMPT_LEN = 48
GEN_LEN = 32
STD = 0.2
# A cached and an uncached run of the same float32 model must agree this closely
# (max |a-b| / max |b| over all rows).
F32_REL_TOL = 1e-4
# Prompts are re-drawn (a bounded number of times) until every greedy step wins by
# at least this logit margin, so an engine that sums in another order still agrees
# on the argmax.
MIN_MARGIN = 0.02
PROMPT_ATTEMPTS = 40
# bfloat16 logits of magnitude 4..8 are spaced 2^-5 apart, so ties are common; the
# bf16 prompt is re-drawn until every greedy step wins by about two such steps.
BF16_MIN_MARGIN = 0.06
GEMMA3_POST_NORM_SHIFTS = (0.0, 2.0, 4.0, 8.0)
GEMMA3_POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")
# A greedy continuation counts as varied with at least this many distinct ids in 32.
MIN_DISTINCT = 20
MAX_DIR_BYTES = 3 * 1024 * 1024

V5 = int(transformers.__version__.split(".")[0]) >= 5


def log(*args):
    print(*args, flush=True)


def has_field(cls, name):
    """Whether a config class takes `name` (5.x dataclass field or 4.x __init__ arg)."""
    if name in getattr(cls, "__dataclass_fields__", {}):
        return True
    return name in inspect.signature(cls.__init__).parameters


def rope_kwargs(cls, theta, scaling=None):
    """Rope settings in the form the installed transformers expects.

    5.x keeps theta and the scaling recipe together in rope_parameters; 4.x used
    rope_theta plus rope_scaling.
    """
    if has_field(cls, "rope_parameters"):
        params = {"rope_type": "default", "rope_theta": float(theta)}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    kw = {"rope_theta": float(theta)}
    if scaling:
        kw["rope_scaling"] = dict(scaling)
    return kw


def llama3_config():
    from transformers import LlamaConfig

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        **rope_kwargs(LlamaConfig, 500000.0, scaling),
    )


def qwen2_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        **rope_kwargs(Qwen2Config, 1000000.0),
    )


def qwen3_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        head_dim=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        use_sliding_window=False,
        **rope_kwargs(Qwen3Config, 1000000.0),
    )


def gemma3_config(num_layers=3, layer_types=None):
    from transformers import Gemma3TextConfig

    if layer_types is None:
        layer_types = ["sliding_attention", "sliding_attention", "full_attention"]
    kw = dict(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        sliding_window=8,
        layer_types=layer_types,
        query_pre_attn_scalar=32,
        tie_word_embeddings=True,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh",
    )
    if has_field(Gemma3TextConfig, "rope_parameters"):
        # 5.x: one rope recipe per attention type.
        kw["rope_parameters"] = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        }
    else:
        kw.update(rope_theta=1000000.0, rope_local_base_freq=10000.0)
    return Gemma3TextConfig(**kw)


# name, config builder, expected class, whether norm gains are stored as (gain - 1)
# (which is also the Gemma 3 family, whose post-sublayer norms are tuned; see above)
SPECS = [
    ("llama3-tiny", llama3_config, "LlamaForCausalLM", False),
    ("qwen2-tiny", qwen2_config, "Qwen2ForCausalLM", False),
    ("qwen3-tiny", qwen3_config, "Qwen3ForCausalLM", False),
    ("gemma3-tiny", gemma3_config, "Gemma3ForCausalLM", True),
]


def is_norm_gain(name, param):
    module = name.split(".")[-2] if "." in name else ""
    return param.ndim == 1 and name.endswith("weight") and "norm" in module


def build(config, seed, offset_norms, post_norm_shift=0.0, quiet=False):
    """A model from config with every parameter redrawn from normal(0, STD).

    post_norm_shift moves the mean of the Gemma 3 post-sublayer norm weights.
    """
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = torch.randn(tuple(p.shape), generator=g, dtype=torch.float32) * STD
            kind = "matrix" if p.ndim > 1 else "bias"
            if is_norm_gain(name, p):
                kind = "norm"
                if not offset_norms:
                    value += 1.0
                if name.split(".")[-2] in GEMMA3_POST_NORMS:
                    value += post_norm_shift
            p.copy_(value)
            if not quiet:
                log(f"  param {name:55s} {str(tuple(p.shape)):14s} {kind:6s} "
                f"mean {p.mean().item():+.4f} std {p.std().item():.4f}")
    params = {n for n, _ in model.named_parameters()}
    extra = [k for k in model.state_dict() if k not in params]
    if extra and not quiet:
        log("  state_dict entries that are not parameters:", extra)
    return model


def load(path, dtype):
    kw = {"dtype": dtype} if V5 else {"torch_dtype": dtype}
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **kw)
    return model.eval()


def save(model, path, **kw):
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kw["safe_serialization"] = True
    model.save_pretrained(path, **kw)


def prompt_tokens(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (PROMPT_LEN,), generator=g).tolist()


def margin(row):
    top = torch.topk(row.float(), 2).values
    return float(top[0] - top[1])


@torch.no_grad()
def cached_rows(model, tokens):
    """Prompt logits, then one row per greedy step fed back through the KV cache.

    Returns (rows [PROMPT_LEN+GEN_LEN, vocab] float32, generated ids, margins).
    """
    takes_cache_position = "cache_position" in inspect.signature(model.forward).parameters
    out = model(input_ids=torch.tensor([tokens]), use_cache=True)
    rows = [out.logits[0].float()]
    cache = out.past_key_values
    last = out.logits[0, -1]
    generated, margins = [], []
    for i in range(GEN_LEN):
        nxt = int(last.argmax())
        generated.append(nxt)
        margins.append(margin(last))
        pos = len(tokens) + i
        kw = dict(past_key_values=cache, use_cache=True, position_ids=torch.tensor([[pos]]))
        if takes_cache_position:
            kw["cache_position"] = torch.tensor([pos])
        out = model(input_ids=torch.tensor([[nxt]]), **kw)
        cache = out.past_key_values
        last = out.logits[0, -1]
        rows.append(last.float()[None])
    return torch.cat(rows), generated, margins


@torch.no_grad()
def uncached_rows(model, ids):
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def rel_diff(a, b):
    return float((a - b).abs().max() / b.abs().max()), float((a - b).abs().max())


@torch.no_grad()
def generate_check(model, tokens, generated, rows):
    """Cross-checks the hand-written greedy loop against model.generate."""
    gc = copy.deepcopy(model.generation_config)
    gc.do_sample = False
    gc.max_new_tokens = GEN_LEN
    gc.eos_token_id = None
    gc.pad_token_id = 0
    out = model.generate(
        torch.tensor([tokens]),
        attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
        generation_config=gc,
        output_logits=True,
        return_dict_in_generate=True,
    )
    seq = out.sequences[0, len(tokens):].tolist()
    steps = torch.cat([x.float() for x in out.logits])  # [n, vocab]: rows 47.. of ours
    n = min(len(seq), GEN_LEN)
    rel, _ = rel_diff(steps[:n], rows[PROMPT_LEN - 1:PROMPT_LEN - 1 + n])
    log(f"  generate(): {n} tokens, ids equal: {seq[:n] == generated[:n]}, "
        f"logits max rel diff vs ours {rel:.3e}")
    return seq[:n] == generated[:n]


def rope_buffers(model):
    out = {}
    for name, buf in model.named_buffers():
        if "inv_freq" in name and "original" not in name:
            out[name] = [float(x) for x in buf.float()]
    return out


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def show_saved(path):
    for fname in ("config.json", "generation_config.json", "model.safetensors.index.json"):
        fpath = os.path.join(path, fname)
        if os.path.exists(fpath):
            with open(fpath) as f:
                log(f"  --- {os.path.basename(path)}/{fname}\n{f.read()}")
    for fname in sorted(os.listdir(path)):
        log(f"  file {fname:40s} {os.path.getsize(os.path.join(path, fname)):9d} bytes")


def write_reference(path, tokens, generated, rows, dtype, model, extra):
    vocab = rows.shape[1]
    assert rows.shape == (PROMPT_LEN + GEN_LEN, vocab), rows.shape
    rows.numpy().astype("<f4").tofile(os.path.join(path, "logits.f32"))
    ref = {
        "tokens": tokens,
        "logits_file": "logits.f32",
        "rows": PROMPT_LEN + GEN_LEN,
        "vocab": vocab,
        "generated": generated,
        "prompt_len": PROMPT_LEN,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": dtype,
        "rope_inv_freq": rope_buffers(model),
    }
    ref.update(extra)
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


def reference(model, tokens, dtype, tol):
    """Runs the cached greedy loop and the uncached cross-check; returns the pieces."""
    rows, generated, margins = cached_rows(model, tokens)
    full = uncached_rows(model, tokens + generated)
    rel, absd = rel_diff(rows, full)
    log(f"  cache vs no-cache over {rows.shape[0]} rows: max rel diff {rel:.3e} (abs {absd:.3e})")
    if tol is not None and rel > tol:
        raise RuntimeError(f"cached and uncached logits differ: rel {rel:.3e} > {tol:.0e}")
    return rows, generated, margins, rel


def variety(generated, fed):
    """Distinct ids in a greedy continuation, and how many steps repeated the input."""
    copies = sum(1 for g, f in zip(generated, fed) if g == f)
    return len(set(generated)), copies


def pick_post_norm_shift(config, seed, tokens):
    """The smallest Gemma 3 post-norm shift whose greedy continuation is varied,
    else the one giving the most distinct greedy ids."""
    best = None
    for shift in GEMMA3_POST_NORM_SHIFTS:
        model = build(config, seed=seed, offset_norms=True, post_norm_shift=shift, quiet=True)
        _, generated, _ = cached_rows(model, tokens)
        distinct, copies = variety(generated, [tokens[-1]] + generated[:-1])
        log(f"  post-norm shift {shift}: {distinct} distinct greedy ids, {copies} repeats of the input")
        if best is None or distinct > best[1]:
            best = (shift, distinct)
        if distinct >= MIN_DISTINCT:
            return shift
    return best[0]


def make_model(out, idx, name, make_config, cls_name, offset_norms, summary):
    log(f"=== {name}")
    config = make_config()
    shift = 0.0
    if offset_norms:
        shift = pick_post_norm_shift(config, 1000 + idx, prompt_tokens(100 * idx, config.vocab_size))
        log(f"  post-norm shift chosen: {shift}")
    model = build(config, seed=1000 + idx, offset_norms=offset_norms, post_norm_shift=shift)
    if type(model).__name__ != cls_name:
        raise RuntimeError(f"built {type(model).__name__}, want {cls_name}")
    log(f"  attn_implementation: {model.config._attn_implementation}")
    names = [n for n, _ in model.named_parameters()]
    if name == "qwen2-tiny" and not any(n.endswith("self_attn.q_proj.bias") for n in names):
        raise RuntimeError("Qwen2 model has no q/k/v biases")
    if model.config.tie_word_embeddings:
        same = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        log(f"  lm_head tied to embed_tokens: {same}")
        if not same:
            raise RuntimeError("tie_word_embeddings is set but lm_head is a separate tensor")
    path = os.path.join(out, name)
    save(model, path)
    show_saved(path)
    # The reference comes from the checkpoint as transformers reads it back, so the
    # fixture is exactly what its files say.
    loaded = load(path, torch.float32)
    probe = prompt_tokens(7, config.vocab_size)
    rel, _ = rel_diff(uncached_rows(loaded, probe), uncached_rows(model, probe))
    log(f"  reloaded checkpoint vs in-memory model: max rel diff {rel:.3e}")
    if rel > 1e-6:
        raise RuntimeError(f"reloaded checkpoint gives different logits (rel {rel:.3e})")
    best = None
    for attempt in range(PROMPT_ATTEMPTS):
        tokens = prompt_tokens(100 * idx + attempt, config.vocab_size)
        rows, generated, margins = cached_rows(loaded, tokens)
        if best is None or min(margins) > best[1]:
            best = (tokens, min(margins))
        if min(margins) >= MIN_MARGIN:
            break
    tokens = best[0]
    log(f"  prompt chosen after {attempt + 1} draw(s); smallest greedy margin {best[1]:.4f}")
    rows, generated, margins, rel = reference(loaded, tokens, "float32", F32_REL_TOL)
    try:
        gen_ok = generate_check(loaded, tokens, generated, rows)
    except Exception as e:  # a cross-check only; the fixture does not depend on it
        log(f"  generate() cross-check failed to run: {e!r}")
        gen_ok = None
    extra = {"model": name}
    if offset_norms:
        extra["post_norm_shift"] = shift
    write_reference(path, tokens, generated, rows, "float32", loaded, extra)
    size = dir_bytes(path)
    distinct, copies = variety(generated, [tokens[-1]] + generated[:-1])
    log(f"  generated: {generated} ({distinct} distinct, {copies} repeats of the input)")
    log(f"  logits row 0 std {rows[0].std():.3f}; dir size {size} bytes")
    if size > MAX_DIR_BYTES:
        raise RuntimeError(f"{path} is {size} bytes, over {MAX_DIR_BYTES}")
    summary[name] = {"bytes": size, "rel_diff": rel, "min_margin": min(margins),
                     "distinct_generated": distinct, "generate_matches": gen_ok,
                     "files": sorted(os.listdir(path))}
    return model, tokens, rows, generated


def make_sharded(out, model, tokens, rows, generated, summary):
    name = "llama3-tiny-sharded"
    log(f"=== {name}")
    path = os.path.join(out, name)
    save(model, path, max_shard_size="700KB")
    show_saved(path)
    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    if len(shards) < 3 or not os.path.exists(os.path.join(path, "model.safetensors.index.json")):
        raise RuntimeError(f"wanted 3+ shards with an index, got {sorted(os.listdir(path))}")
    loaded = load(path, torch.float32)
    srows, sgen, _, rel = reference(loaded, tokens, "float32", F32_REL_TOL)
    if sgen != generated or not torch.equal(srows, rows):
        raise RuntimeError("sharded checkpoint does not reproduce llama3-tiny exactly")
    log("  sharded logits identical to llama3-tiny: True")
    write_reference(path, tokens, sgen, srows, "float32", loaded, {"model": name})
    summary[name] = {"bytes": dir_bytes(path), "rel_diff": rel, "shards": len(shards),
                     "files": sorted(os.listdir(path))}


def make_bf16(out, model, summary):
    name = "llama3-tiny-bf16"
    log(f"=== {name}")
    path = os.path.join(out, name)
    save(copy.deepcopy(model).to(torch.bfloat16), path)
    show_saved(path)
    loaded = load(path, torch.bfloat16)
    log(f"  loaded dtype: {next(loaded.parameters()).dtype}")
    best = None
    for attempt in range(PROMPT_ATTEMPTS):
        tokens = prompt_tokens(9000 + attempt, loaded.config.vocab_size)
        _, _, margins = cached_rows(loaded, tokens)
        if best is None or min(margins) > best[1]:
            best = (tokens, min(margins))
        if min(margins) >= BF16_MIN_MARGIN:
            break
    tokens = best[0]
    log(f"  prompt chosen after {attempt + 1} draw(s); smallest greedy margin {best[1]:.4f}")
    rows, generated, margins, rel = reference(loaded, tokens, "bfloat16", None)
    write_reference(path, tokens, generated, rows, "bfloat16", loaded, {"model": name})
    log(f"  generated: {generated}; smallest greedy margin {min(margins):.4f}")
    summary[name] = {"bytes": dir_bytes(path), "rel_diff": rel, "min_margin": min(margins),
                     "files": sorted(os.listdir(path))}


@torch.no_grad()
def sliding_window_probe(summary):
    """Finds which past positions a Gemma 3 sliding layer lets position p see.

    A one-layer, all-sliding model: the logits at p change when the token at p-d
    changes only if p-d is inside the window.
    """
    log("=== gemma3 sliding-window probe")
    config = gemma3_config(num_layers=1, layer_types=["sliding_attention"])
    model = build(config, seed=4242, offset_norms=True)
    base = prompt_tokens(4242, config.vocab_size)[:24]
    p = 20
    ref = uncached_rows(model, base)[p]
    seen = []
    for d in range(0, 12):
        ids = list(base)
        ids[p - d] = 3 + (ids[p - d] - 3 + 1) % (config.vocab_size - 3)
        if (uncached_rows(model, ids)[p] - ref).abs().max() > 1e-6:
            seen.append(d)
    log(f"  sliding_window={config.sliding_window}: position p sees p-d for d in {seen}")
    summary["gemma3_sliding_window_offsets_seen"] = seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to write the model folders into")
    args = ap.parse_args()
    log(f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"numpy {np.__version__}, python {sys.version.split()[0]}")
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.makedirs(args.out, exist_ok=True)
    for name in os.listdir(args.out):
        shutil.rmtree(os.path.join(args.out, name))

    summary, failures = {}, []
    for idx, (name, make_config, cls_name, offset_norms) in enumerate(SPECS):
        try:
            result = make_model(args.out, idx, name, make_config, cls_name, offset_norms, summary)
        except Exception:
            failures.append(name)
            log(traceback.format_exc())
            continue
        if name != "llama3-tiny":
            continue
        model, tokens, rows, generated = result
        for step, fn, fargs in (
            ("llama3-tiny-sharded", make_sharded, (model, tokens, rows, generated)),
            ("llama3-tiny-bf16", make_bf16, (model,)),
        ):
            try:
                fn(args.out, *fargs, summary)
            except Exception:
                failures.append(step)
                log(traceback.format_exc())
    try:
        sliding_window_probe(summary)
    except Exception:
        failures.append("sliding-window-probe")
        log(traceback.format_exc())

    summary["total_bytes"] = sum(dir_bytes(os.path.join(args.out, d)) for d in os.listdir(args.out))
    log("=== summary\n" + json.dumps(summary, indent=1))
    if failures:
        log("FAILED:", failures)
        sys.exit(1)
    log("all fixtures written")


if __name__ == "__main__":
    main()
