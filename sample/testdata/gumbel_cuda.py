"""Writes gumbel_cuda.json: sample.GumbelNoise and sample.SampleGumbel as
computed by PyTorch on a CUDA device, which the Go tests compare with the
Go implementation bit for bit.

The integer hash runs in NumPy (uint64 arithmetic wraps, as in Go and in a
kernel); the logarithms, the division by the temperature and the argmax run
on the GPU, in float64 and float32 as the Go code specifies.

    python3 gumbel_cuda.py OUT.json [GO_NOISE.bin REPORT.json]

With GO_NOISE.bin (float32 little-endian, GumbelNoise(seed, step, i) for the
seeds and steps of CHECK_SEEDS x CHECK_STEPS, i < CHECK_N, in that order) it
also counts, over that larger grid, the values on which CUDA, NumPy (the C
library's log) and Go disagree, and writes the counts to REPORT.json.
"""
import json
import sys

import numpy as np
import torch

GAMMA = np.uint64(0x9E3779B97F4A7C15)

FIXTURE_SEEDS = [1, 42, 2**64 - 1]
FIXTURE_STEPS = [0, 1, 1000]
FIXTURE_N = 256

# SampleGumbel: logits[i] = float32((i * 2654435761) % 1000) / 100 - 5.
DRAW_VOCAB, DRAW_SEED, DRAW_STEPS, DRAW_T = 32000, 7, 64, 0.7

CHECK_SEEDS = [1, 42, 2**64 - 1]
CHECK_STEPS = [0, 1, 2, 1000]
CHECK_N = 1 << 19


def mix(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniforms(seed, step, n):
    key = mix(np.array([seed], dtype=np.uint64) + GAMMA)
    skey = mix(key + np.uint64(step + 1) * GAMMA)
    i = np.arange(1, n + 1, dtype=np.uint64)
    h = mix(skey + i * GAMMA)
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def gumbel_cuda(u):
    t = torch.from_numpy(u).cuda()
    return (-torch.log(-torch.log(t))).float().cpu().numpy()


def gumbel_numpy(u):
    return (-np.log(-np.log(u))).astype(np.float32)


def main():
    np.seterr(over="ignore")
    fixture = {"noise": [], "draws": {}}
    for seed in FIXTURE_SEEDS:
        for step in FIXTURE_STEPS:
            g = gumbel_cuda(uniforms(seed, step, FIXTURE_N))
            fixture["noise"].append({"seed": seed, "step": step,
                                     "bits": g.view(np.uint32).tolist()})

    ids = np.arange(DRAW_VOCAB, dtype=np.uint64)
    ints = ((ids * np.uint64(2654435761)) % np.uint64(1000)).astype(np.float32)
    logits = torch.from_numpy(ints).cuda() / 100 - 5
    # An elementwise tensor division: PyTorch multiplies by the reciprocal
    # when it divides by a Python scalar, which is not what Go computes.
    scaled = logits / torch.full_like(logits, DRAW_T)
    tokens = []
    for step in range(DRAW_STEPS):
        g = torch.from_numpy(gumbel_cuda(uniforms(DRAW_SEED, step, DRAW_VOCAB))).cuda()
        tokens.append(int(torch.argmax(scaled + g)))
    fixture["draws"] = {"vocab": DRAW_VOCAB, "seed": DRAW_SEED, "temperature": DRAW_T,
                        "tokens": tokens}
    fixture["device"] = torch.cuda.get_device_name()
    fixture["torch"] = torch.__version__
    with open(sys.argv[1], "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")

    if len(sys.argv) < 4:
        return
    go = np.fromfile(sys.argv[2], dtype="<f4")
    report = {"values": 0, "cuda_vs_go": 0, "numpy_vs_go": 0, "cuda_vs_numpy": 0}
    k = 0
    for seed in CHECK_SEEDS:
        for step in CHECK_STEPS:
            u = uniforms(seed, step, CHECK_N)
            c, n, g = gumbel_cuda(u), gumbel_numpy(u), go[k:k + CHECK_N]
            k += CHECK_N
            report["values"] += CHECK_N
            report["cuda_vs_go"] += int(np.sum(c.view(np.uint32) != g.view(np.uint32)))
            report["numpy_vs_go"] += int(np.sum(n.view(np.uint32) != g.view(np.uint32)))
            report["cuda_vs_numpy"] += int(np.sum(c.view(np.uint32) != n.view(np.uint32)))
    with open(sys.argv[3], "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
