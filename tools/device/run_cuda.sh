#!/usr/bin/env bash
# One device call: build the CUDA path (the top-level CMake, targets test_cuda
# and bench_cuda_decode only), run its
# tests, compute-sanitizer memcheck + racecheck on the small cases, the decode
# benchmark and the torch SDPA flash baseline in the same run, the 32-layer
# memory demonstration. Everything lands in $OUT (all.log, build.log,
# test_cuda.json, cuda_decode_bench.json, sdpa_flash.json, demo.json, table.md).
# Usage (repo root): tools/device/run_cuda.sh
# CAPTURE=DIR: real SmolLM2 K/V/Q for CudaPackedDecode.RealSmolLM2 (default
# .devcap when present; made here by `ratekv capture --queries`, see
# docs/cuda_results.md), passed as RATEKV_CUDA_CAPTURE.
# PREBUILT=DIR: use test_cuda and bench_cuda_decode already built in DIR
# (same toolkit, sm_90; e.g. copied from a build-*/bin or tests dir) instead
# of building here.
# DEPS=DIR (the carried .devdeps): build with tools/device/build.sh against those
# Debian packages (the GPU machine lacks fmt, spdlog, GoogleTest, …) in
# /tmp/ratekv-build instead of the plain configure below.
# STAGES="tests sanitize bench sdpa demo sass engine ncu" (default: all but sass,
# engine and ncu) picks stages; engine = test_engine's packed-cache prefill
# tests and the memory-plan test (needs DEPS); ncu = Nsight Compute on the
# packed K3V3 and Block-GTQ decode kernels at B=8, T=128K, Llama-3.1-8B shapes
# (one launch each, --clock-control none, full cache flush), summarised by
# tools/device/ncu_summary.py into ncu_summary.json / .md (raw CSV pages stay
# in $OUT/ncu_raw.tgz; READ_CEILING_JSON names a bench JSON of an earlier call
# when the bench stage is not in this one); BENCH_ARGS are passed to bench_cuda_decode;
# SDPA_ARGS to sdpa_baseline.py (e.g. --prefill).
set -uo pipefail
OUT=${OUT:-/tmp/ratekv_cuda_out}
STAGES=${STAGES:-"tests sanitize bench sdpa demo"}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=/tmp/ratekv-cuda-build
LOG=$OUT/all.log
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
say "env"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; nvcc --version | tail -2; cmake --version | head -1; } 2>&1 | tee -a "$LOG"
say "build"
if [ -n "${PREBUILT:-}" ]; then
  B=$(cd "$PREBUILT" && pwd); echo "prebuilt binaries in $B" | tee -a "$LOG"
  export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}  # shared libraries carried beside them (libfmt)
elif [ -n "${DEPS:-}" ]; then
  B=${BUILD:-/tmp/ratekv-build}
  TG="test_cuda bench_cuda_decode"; has engine && TG="$TG test_engine"
  if ! DEPS="$DEPS" BUILD="$B" TARGETS="$TG" "$ROOT/tools/device/build.sh" > "$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log" | tee -a "$LOG"; exit 1
  fi
  tail -3 "$OUT/build.log" | tee -a "$LOG"
  source $B/env.sh
  cp $B/tests/test_cuda $B/bench/bench_cuda_decode $B/
  [ -x $B/tests/test_engine ] && cp $B/tests/test_engine $B/
elif ! { cmake -S "$ROOT" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DRATEKV_CUDA=ON -DCMAKE_CUDA_FLAGS=-Xptxas=-v && cmake --build $B -j16 --target test_cuda bench_cuda_decode && cp $B/tests/test_cuda $B/bench/bench_cuda_decode $B/; } > "$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log" | tee -a "$LOG"; exit 1
else
grep -E "Compiling entry|registers|spill" "$OUT/build.log" | grep -B1 -A1 registers | grep -E "registers|spill" | tee -a "$LOG"
fi
if has sass; then
  say "sass"
  # Opcode counts of one page iteration (head_dim 128): GQA-8 kernel uniform K2/K3/K4 and general, 16-row kernel.
  cuobjdump -sass "$B/test_cuda" 2>&1 | python3 "$ROOT/tools/device/sass_counts.py" --main-loop \
    gqa8_decode_kernelILi128ELi2E gqa8_decode_kernelILi128ELi3E gqa8_decode_kernelILi128ELi4E gqa8_decode_kernelILi128ELi0E \
    packed_decode_kernelILi128EE > "$OUT/sass_counts.txt" 2>&1; cat "$OUT/sass_counts.txt" | tee -a "$LOG"
fi
if has tests; then
  if [ -x "$B/test_cache_format" ]; then
    say "format tests"
    $B/test_cache_format 2>&1 | tail -3 | tee -a "$LOG"
  fi
  say "cuda tests"
  CAP=${CAPTURE:-$ROOT/.devcap}
  [ -d "$CAP" ] && export RATEKV_CUDA_CAPTURE=$(cd "$CAP" && pwd)
  timeout ${TEST_TIMEOUT:-300} $B/test_cuda --gtest_filter="${TEST_FILTER:-*}" --gtest_output=json:"$OUT/test_cuda.json" > "$OUT/test_cuda.log" 2>&1
  grep -vE "^\[ RUN|^\[       OK|rel err|move the reference" "$OUT/test_cuda.log" | tail -40 | tee -a "$LOG"
fi
if has sanitize; then
  SMALL='CudaPackedDecode.Small:CudaPackedDecode.SmallZeroBit:CudaPackedDecode.SmallWide:CudaVqDecode.Small'
  say "compute-sanitizer memcheck (small decode: packed, 0-bit sides, 5..8-bit generic, vq; append; prefill)"
  PRE='CudaPackedPrefill.MatchesReferenceQuantizerAndTouchesOnlyItsTokens:CudaPackedPrefill.RejectsBadArguments'
  compute-sanitizer --tool memcheck --error-exitcode 3 $B/test_cuda --gtest_filter="$SMALL:CudaPackedAppend.*:$PRE" 2>&1 | tail -6 | tee -a "$LOG"
  say "compute-sanitizer racecheck (small decode cases + prefill)"
  compute-sanitizer --tool racecheck --error-exitcode 3 $B/test_cuda --gtest_filter="$SMALL:$PRE" 2>&1 | tail -4 | tee -a "$LOG"
fi
if has bench; then
  say "benchmark"
  $B/bench_cuda_decode --out "$OUT/cuda_decode_bench.json" ${BENCH_ARGS:-} 2>&1 | tee -a "$LOG"
fi
if has sdpa; then
  say "torch SDPA flash baseline"
  PYTHONUNBUFFERED=1 python3 "$ROOT/tools/device/sdpa_baseline.py" --out "$OUT/sdpa_flash.json" ${SDPA_ARGS:-} 2>&1 | tee -a "$LOG"
fi
if has engine && [ -x $B/test_engine ]; then
  say "test_engine: packed-cache prefill paths (packed_prefill's tensor-core variant, fp32 inputs)"
  EF=${ENGINE_FILTER:-'Engine.MatchesCpuPackedCacheK4V4:Engine.ChunkedPrefill*:Engine.PrefillModesAndDecodeAgreeWithPrefill:Engine.MemoryPlanIsWhatTheEngineAllocates'}
  timeout 240 $B/test_engine --gtest_filter="$EF" > "$OUT/test_engine.log" 2>&1
  grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|Failure|rel L2|agree|outside the plan" "$OUT/test_engine.log" | tail -40 | tee -a "$LOG"
fi
if has ncu; then
  say "Nsight Compute: packed K3V3 and Block-GTQ decode kernels, Llama-3.1-8B shapes, B=8, T=128K"
  command -v ncu >/dev/null || echo "ncu not on the PATH" | tee -a "$LOG"
  RC=""
  RCJ=${READ_CEILING_JSON:-$OUT/cuda_decode_bench.json}  # a bench JSON of this machine (its read_ceiling_GBps)
  [ -f "$RCJ" ] && RC=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['read_ceiling_GBps'])" "$RCJ" 2>/dev/null)
  NCU_IN=""
  for L in K3V3 K3V3-blockgtq; do
    timeout 240 ncu --clock-control none --cache-control all --kernel-name regex:gqa8_decode_kernel --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,dram__bytes_read.sum.per_second,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active \
      --csv --page raw $B/bench_cuda_decode --no-check --no-prefill --reps 1 --only-model llama-3.1-8b --only-B 8 \
      --only-T 131072 --only-cache $L --out /tmp/ncu_bench_$L.json > "$OUT/ncu_$L.csv" 2> "$OUT/ncu_$L.err"
    echo "ncu $L: rc $? ($(grep -c gqa8_decode_kernel "$OUT/ncu_$L.csv") profiled rows)" | tee -a "$LOG"
    tail -3 "$OUT/ncu_$L.err" | tee -a "$LOG"
    NCU_IN="$NCU_IN $L=$OUT/ncu_$L.csv"
  done
  python3 "$ROOT/tools/device/ncu_summary.py" --out-json "$OUT/ncu_summary.json" --out-md "$OUT/ncu_summary.md" \
    ${RC:+--read-ceiling $RC} $NCU_IN 2>&1 | tee -a "$LOG"
  # The raw pages in one archive (the device tool brings back at most 8 files).
  (cd "$OUT" && tar -czf ncu_raw.tgz ncu_*.csv ncu_*.err && rm -f ncu_*.csv ncu_*.err)
fi
if has demo; then
  say "memory demo (32 layers, B=4, T=512K, K3V3)"
  $B/bench_cuda_decode --demo --out "$OUT/demo.json" 2>&1 | tee -a "$LOG"
fi
say "done"
if [ -f "$OUT/cuda_decode_bench.json" ] && [ -f "$OUT/sdpa_flash.json" ]; then
  python3 "$ROOT/tools/device/summarize.py" "$OUT/cuda_decode_bench.json" "$OUT/sdpa_flash.json" $( [ -f "$OUT/demo.json" ] && echo "$OUT/demo.json") > "$OUT/table.md" 2>&1
  cat "$OUT/table.md"
fi
# PACK=1: everything but the logs, tables, summaries and result JSON in one
# archive (the device tool brings back at most 8 files).
if [ -n "${PACK:-}" ]; then
  (cd "$OUT" && ls | grep -vE '^(all\.log|table\.md|ncu_summary\.(json|md)|cuda_decode_bench\.json|sdpa_flash\.json|ncu_raw\.tgz)$' > /tmp/rk_pack.txt
   [ -s /tmp/rk_pack.txt ] && tar -czf rest.tgz -T /tmp/rk_pack.txt && xargs rm -f < /tmp/rk_pack.txt)
  ls "$OUT"
fi
