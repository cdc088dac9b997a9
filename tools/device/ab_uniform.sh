#!/usr/bin/env bash
# One device call (session 4): correctness of the uniform-plan decode kernel
# (tests, real SmolLM2 data from $CAPTURE (default .devcap), compute-sanitizer
# on the small cases) and an A/B of its decode step in the same run, Llama-3.1-8B
# shapes: int8 key scores (default) vs fp16 key scores (RATEKV_UNIFORM_KF16=1)
# vs the v9 uniform instances (RATEKV_UNIFORM_V9=1). Binaries prebuilt in $BIN
# (default .devbin).
# The two switches existed only in the working trees of device runs 1 and 2 of
# session 4 (removed once the A/B was decided, commit "cuda: uniform kernel");
# against later trees both settings run the same kernel.
set -uo pipefail
OUT=${OUT:-/tmp/ab_out}; mkdir -p "$OUT"
BIN=$(cd "${BIN:-.devbin}" && pwd); export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
LOG=$OUT/all.log
RAW=$(mktemp -d)
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }
say env; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee -a "$LOG"
say tests
RATEKV_CUDA_CAPTURE=${CAPTURE:-$PWD/.devcap} $BIN/test_cuda --gtest_filter="${TESTS:-CudaPackedDecode.*:CudaPacked*}" 2>&1 | grep -vE "^\[ RUN|^\[       OK" | tail -30 | tee -a "$LOG"
if [ -n "${SANITIZE:-1}" ]; then
  say memcheck
  compute-sanitizer --tool memcheck --error-exitcode 3 $BIN/test_cuda --gtest_filter=CudaPackedDecode.Small 2>&1 | tail -4 | tee -a "$LOG"
  say racecheck
  compute-sanitizer --tool racecheck --error-exitcode 3 $BIN/test_cuda --gtest_filter=CudaPackedDecode.Small 2>&1 | tail -3 | tee -a "$LOG"
fi
for cfg in ${POINTS:-"8 131072" "1 131072" "1 4096" "8 4096"}; do
  set -- $cfg
  for v in k8 kf16 v9 k8; do
    say "bench B=$1 T=$2 $v"
    unset RATEKV_UNIFORM_V9 RATEKV_UNIFORM_KF16
    [ $v = v9 ] && export RATEKV_UNIFORM_V9=1
    [ $v = kf16 ] && export RATEKV_UNIFORM_KF16=1
    $BIN/bench_cuda_decode --only-model llama-3.1-8b --only-B $1 --only-T $2 --no-prefill --out "$RAW/ab_${1}_${2}_$v.json" 2>&1 | grep -E "K[234]V[234]|fp16" | head -12 | tee -a "$LOG"
  done
done
python3 - "$RAW" "$OUT/ab_uniform.json" <<'PY'
import json, os, sys
rows = {f[:-5]: json.load(open(os.path.join(sys.argv[1], f))) for f in sorted(os.listdir(sys.argv[1]))}
json.dump(rows, open(sys.argv[2], "w"), indent=1)
PY
say done
