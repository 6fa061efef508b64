#!/bin/bash
# Every device test of cuda.test, in four processes at once, so that one
# device call holds them: run in one process they took about 880 s of an
# H100 (fourteenth session), the longest test alone 262 s
# (TestNVRTCCompilesKernels), and a call may run 600 s. Each of the first
# parts is one or two long tests; the last is every other test, so a test
# added later runs there. The benchmarks and measuring aids are left out.
# On the device, from the folder holding cuda.test and shared/testdata
# (cuda-check.sh says how to build and carry them):
#   bash suite.sh     logs in $OUT/test-N.log, a line a part, then failures
# REQUIRE=0 lets the tests skip where there is no GPU (to check the parts
# on a machine without one).
set -u
cd "$(dirname "$0")"; D=$PWD
OUT=${OUT:-/tmp/weft-out}; mkdir -p "$OUT"
AIDS="TestBenchGGUF|TestSynthBenchModels|TestProfileDecode|TestMMQBench|TestTraceDecode|TestRequantBenchModels|TestStepOverhead|TestDrawCost"
PARTS=("TestNVRTCCompilesKernels" "TestOpsAgainstCPU" "TestExactAgainstCPU|TestKQuantOps")
part() { # the part's number, then its -test.run or -test.skip flags
  local n=$1; shift
  WEFT_CUDA_REQUIRE=${REQUIRE:-1} WEFT_SHARED=$D/shared ./cuda.test "$@" -test.count=1 -test.v > "$OUT/test-$n.log" 2>&1
  local rc=$?
  echo "part $n ($*): rc=$rc passed=$(grep -cE '^\s*--- PASS' "$OUT/test-$n.log")" \
    "skipped=$(grep -cE '^\s*--- SKIP' "$OUT/test-$n.log") failed=$(grep -cE '^\s*--- FAIL' "$OUT/test-$n.log")"
}
for i in "${!PARTS[@]}"; do part "$i" -test.run "^(${PARTS[$i]})\$" & done
all=$(IFS='|'; echo "${PARTS[*]}")
part "${#PARTS[@]}" -test.skip "^($all|$AIDS)\$" &
wait
grep -hE "^(--- FAIL|FAIL)|panic|    --- FAIL" "$OUT"/test-*.log | head -30
