#!/bin/bash
# Same-run A/B of two weft builds on random-weight models of Llama-3.2-1B's
# and Llama-3-8B's shapes, after the device tests of the new build (the
# only fair comparison: two H100s of one session differed by 9 %). Carry
# one folder holding weft (new), weft.old, cuda.test, the two config
# files and shared/testdata as for cuda-check.sh; then on the device:
#   bash .device/ab/ab.sh        (TESTS=0 skips the tests)
# TYPES (default "Q4_0 Q8_0 BF16"), SHAPES ("1b 8b"), DEPTHS ("0 4096")
# and ENVS (extra "VAR=value" settings, each a further run of the new
# build; "A=1+B=2" sets both in one run) choose what runs; PP=1 adds pp512 of the new build, and PP_ENVS
# (settings again) further pp512 runs of it, e.g. PP_ENVS=WEFT_MMQ=1;
# PAR (e.g. "4 8") adds tg128 of both builds with that many sequences
# decoding together (weft bench --parallel; both builds need it).
set -u
cd "$(dirname "$0")"; D=$PWD; M=/tmp/weft-models; mkdir -p "$M"; rm -f "$M/.ready"
OUT=${OUT:-/tmp/weft-out}; mkdir -p "$OUT"
TYPES=${TYPES:-"Q4_0 Q8_0 BF16"}; SHAPES=${SHAPES:-"1b 8b"}; DEPTHS=${DEPTHS:-"0 4096"}; ENVS=${ENVS:-}
CONFIGS=""
for s in $SHAPES; do
  cfg=llama-3.2-1b.config.json; [ "$s" = 8b ] && cfg=llama-3-8b.config.json
  CONFIGS="$CONFIGS${CONFIGS:+,}llama$s=$D/$cfg"
done
(WEFT_BENCH_FAST=1 WEFT_BENCH_SYNTH=$M WEFT_BENCH_CONFIGS=$CONFIGS WEFT_BENCH_TYPES=$(echo $TYPES | tr ' ' ,) \
  ./cuda.test -test.run TestSynthBenchModels > "$OUT/synth.log" 2>&1; echo done > "$M/.ready") &
if [ "${TESTS:-1}" = 1 ]; then
  WEFT_CUDA_REQUIRE=1 WEFT_SHARED=$D/shared ./cuda.test -test.skip "TestBenchGGUF|TestSynthBenchModels|TestProfileDecode|TestMMQBench" \
    -test.count=1 -test.v > "$OUT/test.log" 2>&1
  echo "device tests rc=$? passed=$(grep -cE '^\s*--- PASS' "$OUT/test.log")"
  grep -E "^(--- FAIL|FAIL)|panic|    --- FAIL" "$OUT/test.log" | head -20
fi
while [ ! -f "$M/.ready" ]; do sleep 2; done
tg() { # build, model, depth, env, more bench flags...
  local b=$1 f=$2 d=$3 e=$4; shift 4
  env ${e//+/ } ./$b bench -m "$f" --backend cuda -d "$d" -p 0 -n 128 -r 3 "$@" 2>&1 | grep -oE 'tg128[^|]*\|[^|]*' | awk -F'|' '{print $2}'
}
for f in "$M"/*.gguf; do
  for d in $DEPTHS; do
    line="$(basename "$f" .gguf) d=$d:"
    for rep in 1 2; do
      line="$line old $(tg weft.old "$f" "$d" X=1) new $(tg weft "$f" "$d" X=1) |"
    done
    for e in $ENVS; do line="$line $e $(tg weft "$f" "$d" "$e")"; done
    for n in ${PAR:-}; do
      line="$line x$n old $(tg weft.old "$f" "$d" X=1 --parallel "$n") new $(tg weft "$f" "$d" X=1 --parallel "$n")"
    done
    pp() { env "$@" ./weft bench -m "$f" --backend cuda -d "$d" -p 512 -n 0 -r 3 2>&1 | grep -oE 'pp512[^|]*\|[^|]*' | awk -F'|' '{print $2}'; }
    if [ "${PP:-0}" = 1 ]; then line="$line pp512 $(pp X=1)"; fi
    for e in ${PP_ENVS:-}; do line="$line pp512 $e $(pp "$e")"; done
    echo "$line"
  done
done
