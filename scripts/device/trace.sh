#!/bin/bash
# Block traces of one decode step (backend/cuda/trace.go): random-weight
# models of Llama-3.2-1B's and Llama-3-8B's shapes, each traced with the
# plan as it is and under each setting of ENVS (default WEFT_CUDA_BREAK=0,
# the PDL chain unbroken; WEFT_CUDA_SERIAL=... breaks it elsewhere), so
# the placement of blocks under PDL can be compared. Build cuda.test as
# for cuda-check.sh, carry it with the two config files in one folder,
# then on the device: bash .device/trace/trace.sh   (carry .device/trace)
# TYPES (default "Q4_0 BF16") chooses the models; an ENVS entry may set
# several variables (A=1+B=2). The traces go to $OUT/traces.tgz (the
# device tool returns few files, and none with '=' in its name); each
# one's summary and the decode attention's phases are printed.
set -u
cd "$(dirname "$0")"; D=$PWD; M=/tmp/weft-models; mkdir -p "$M"
OUT=${OUT:-/tmp/weft-out}; mkdir -p "$OUT"
TYPES=${TYPES:-"Q4_0 BF16"}
WEFT_BENCH_FAST=1 WEFT_BENCH_SYNTH=$M WEFT_BENCH_CONFIGS=llama1b=$D/llama-3.2-1b.config.json,llama8b=$D/llama-3-8b.config.json \
  WEFT_BENCH_TYPES=$(echo $TYPES | tr ' ' ,) ./cuda.test -test.run TestSynthBenchModels > "$OUT/synth.log" 2>&1 || tail "$OUT/synth.log"
T=$(mktemp -d)
for f in "$M"/*.gguf; do
  for e in X=1 ${ENVS-WEFT_CUDA_BREAK=0}; do
    b=$(basename "$f" .gguf); [ "$e" = X=1 ] || b="$b-$(echo "${e#WEFT_CUDA_}" | tr '=+' '_-')"
    env ${e//+/ } WEFT_CUDA_TRACE=1 WEFT_TRACE=$f ./cuda.test -test.run TestTraceDecode -test.v > "$T/trace-$b.txt" 2>&1
    echo "$b: rc=$?"; grep -A12 "kernel *launches" "$T/trace-$b.txt"; grep phases "$T/trace-$b.txt"
    (cd "$T" && tar czf "$OUT/traces.tgz" .)
  done
done
