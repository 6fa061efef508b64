#!/bin/bash
# One device call that checks and measures the CUDA backend: every device
# test, weft check on the fixtures, tg128/pp512 of random-weight models
# of Llama-3.2-1B's and Llama-3-8B's shapes, decode and prefill at a
# depth, and the CLI and server on the default backend. Build on a
# machine with Go, put the outputs in one git-ignored folder (stripped:
# what a device call carries is limited to 64 MiB with the tree) and carry
# it:
#
#   D=.device/check; mkdir -p $D
#   CGO_ENABLED=0 go test -c -ldflags="-s -w" -o $D/cuda.test ./backend/cuda
#   CGO_ENABLED=0 go build -ldflags="-s -w" -o $D/weft ./cmd/weft
#   cp scripts/device/{cuda-check,suite}.sh backend/cuda/testdata/llama-3-8b.config.json $D/
#   cp ../shared/testdata/hf-configs/Llama-3.2-1B/config.json $D/llama-3.2-1b.config.json
#   mkdir -p $D/shared/testdata && cp -r ../shared/testdata/{gguf,llama2c}-stories260K $D/shared/testdata/
#   then on the device: bash .device/check/cuda-check.sh   (carry .device/check)
#
# TYPES (default "Q4_0 Q8_0 BF16") and SHAPES (default "1b 8b") choose the
# benchmark models, DEPTHS (default "4096 16384") the context depths of the
# decode runs with and without split attention; logs land in $OUT.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s]"; }
cd "$(dirname "$0")"; D=$PWD; M=/tmp/weft-models; mkdir -p "$M"
OUT=${OUT:-/tmp/weft-out}; mkdir -p "$OUT"
TYPES=${TYPES:-"Q4_0 Q8_0 BF16"}; SHAPES=${SHAPES:-"1b 8b"}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
./weft info

# Models in the background while the tests run (all at once, one
# goroutine a file; WEFT_BENCH_FAST=1 draws Q8_0/Q4_0 quants at random,
# seconds instead of minutes for the 8B shape).
CONFIGS=""
for s in $SHAPES; do
  cfg=llama-3.2-1b.config.json; [ "$s" = 8b ] && cfg=llama-3-8b.config.json
  CONFIGS="$CONFIGS${CONFIGS:+,}llama$s=$D/$cfg"
done
(WEFT_BENCH_FAST=1 WEFT_BENCH_SYNTH=$M WEFT_BENCH_CONFIGS=$CONFIGS WEFT_BENCH_TYPES=$(echo $TYPES | tr ' ' ,) \
  ./cuda.test -test.run TestSynthBenchModels > "$OUT/synth.log" 2>&1; echo done > "$M/.ready") &

OUT=$OUT bash suite.sh  # every device test, in four processes (suite.sh)
echo "$(el) device tests"
grep -hE "matrices in .*worst KL" "$OUT"/test-*.log | sed 's/^ *model_test.go:[0-9]*: /trained: /'  # TestTrainedQuantizedAgainstCPU

cd ../..
for m in testdata/models/llama3-tiny testdata/models/quant/llama3-tiny-Q4_0.gguf testdata/models/quant/llama-256-Q4_K.gguf; do
  "$D/weft" check -m "$m" 2>&1 | tail -2
done
"$D/weft" run -m "$D/shared/testdata/gguf-stories260K/stories260K.gguf" --backend cuda --temp 0 -n 40 2>&1 | tail -2; echo
cd "$D"

while [ ! -f "$M/.ready" ]; do sleep 5; done
echo "$(el) models written"
for f in "$M"/*.gguf; do
  ./weft bench -m "$f" --backend cuda -p 512 -n 128 -r 3 2>&1 | grep -E "pp512|tg128" | sed "s|^|$(basename "$f") |"
done

# Decode deep in a context: split attention (the default) against one
# block per head and row (WEFT_CUDA_SPLIT=0).
for f in "$M"/llama*-Q4_0.gguf; do
  for d in ${DEPTHS:-4096 16384}; do
    for sp in 1 0; do
      WEFT_CUDA_SPLIT=$sp ./weft bench -m "$f" --backend cuda -d "$d" -p 0 -n 64 -r 2 2>&1 | grep -E "tg64" | sed "s|^|$(basename "$f") split=$sp |"
    done
  done
done

# Prefill deep in a context, then the default (auto) backend from the CLI
# and the server.
for f in "$M"/llama*-Q4_0.gguf; do
  ./weft bench -m "$f" -d 4096 -p 512 -n 0 -r 2 2>&1 | grep pp512 | sed "s|^|$(basename "$f") |"
done
S=shared/testdata/gguf-stories260K/stories260K.gguf
./weft run -m $S -p "Once upon a time" -n 24 --temp 0 2>"$OUT/run.err"; echo; echo "run's stderr: $(cat "$OUT/run.err")"
./weft serve -m $S --addr 127.0.0.1:8099 2>"$OUT/serve.err" & SERVE=$!; sleep 4
python3 -c '
import json, urllib.request
req = urllib.request.Request("http://127.0.0.1:8099/v1/completions", data=json.dumps({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
print("serve:", json.load(urllib.request.urlopen(req))["choices"][0]["text"])'
kill $SERVE; wait $SERVE 2>/dev/null; grep -o 'backend=[^ ]*' "$OUT/serve.err" | head -1
echo "$(el) all done"
