#!/usr/bin/env python3
# The roofline's denominator (docs/performance.md): run on the device, where PyTorch is, in the same call as the
# benchmarks it divides: python3 scripts/device/bw.py
# Device-to-device copy bandwidth: a 1 GiB tensor copied 20 times, bytes read plus written over the median time.
import torch, statistics
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
ts = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); e.synchronize()
    ts.append(s.elapsed_time(e) / 1e3)
m = statistics.median(ts)
print(f"d2d copy: median {m*1e3:.3f} ms, {2*n/m/1e9:.0f} GB/s (read + write), min {min(ts)*1e3:.3f} ms")
