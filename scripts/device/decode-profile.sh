#!/bin/bash
# Where a decode step's time goes, by difference: tg128 of random-weight
# models of Llama-3.2-1B's and Llama-3-8B's shapes with every launch, then
# with one kernel class left out (WEFT_CUDA_OMIT: the results are wrong,
# the time is what that class costs in place); then mvbench.cu's one-row
# products in a chain. Build as for cuda-check.sh (weft and cuda.test in
# one carried folder with the two config files and mvbench.cu), then on
# the device: bash .device/prof/decode-profile.sh   (carry .device/prof)
# TYPES (default "Q4_0") chooses the models; OMITS the classes.
set -u
cd "$(dirname "$0")"; D=$PWD; M=/tmp/weft-models; mkdir -p "$M"
OUT=${OUT:-/tmp/weft-out}; mkdir -p "$OUT"
TYPES=${TYPES:-"Q4_0"}
(nvcc -O3 -arch=sm_90a -o /tmp/mvbench mvbench.cu > "$OUT/nvcc.log" 2>&1 || cat "$OUT/nvcc.log") &
WEFT_BENCH_FAST=1 WEFT_BENCH_SYNTH=$M WEFT_BENCH_CONFIGS=llama1b=$D/llama-3.2-1b.config.json,llama8b=$D/llama-3-8b.config.json \
  WEFT_BENCH_TYPES=$(echo $TYPES | tr ' ' ,) ./cuda.test -test.run TestSynthBenchModels > "$OUT/synth.log" 2>&1 || tail "$OUT/synth.log"
wait
OMITS=${OMITS:-"none rmsnorm rope_store attention matvec3 matvec_glu matvec_q,matvec1_ rmsnorm,rope_store,attention,argmax matvec"}
for f in "$M"/*.gguf; do
  for o in $OMITS; do
    [ "$o" = none ] && o=""
    r=$(WEFT_CUDA_OMIT=$o ./weft bench -m "$f" --backend cuda -p 0 -n 128 -r 3 2>&1 | grep tg128 | grep -oE '[0-9]+\.[0-9]+ ± [0-9.]+' | head -1)
    printf "%-28s omit=%-40s %s\n" "$(basename "$f")" "${o:-none}" "$r"
  done
done
/tmp/mvbench | tee "$OUT/mvbench.log"
