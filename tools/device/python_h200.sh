#!/usr/bin/env bash
# The Python package on the GPU machine (issue 23), one call, ≤ ~9 min of wall time in all.
# Stages (STAGES, default "build test sanitize bench"), each under its own time limit and
# printing its wall time; a failing stage does not stop the later ones (exit 1 at the end):
#   build     tools/device/build.sh: the extension ratekv._core (Python 3.12 there; an extension
#             built here does not import there), the CLI, test_engine_host, test_engine (≤ 200 s)
#   test      test_engine_host + test_engine (the engine over engine::PagePool) as gtest JSON, then
#             pytest on CUDA: python/tests/test_cuda.py (ops vs the CPU packed cache, the pool's
#             store-from-pool test, CUDA graphs, torch.compile, HF PackedCache vs FakeQuantCache),
#             test_exit_leaks.py (no nanobind instance outlives the interpreter, CPU and CUDA)
#             (engine tests ≤ 150 s: 95 s on 2026-12-04, over the 60 s they had; pytest ≤ 120 s; the
#             CPU-only Python tests run in CI)
#   sanitize  compute-sanitizer memcheck (SANITIZE_TOOLS) on the ops (tools/device/python_ops_smoke.py;
#             ≤ 90 s)
#   bench     bench/hf_decode.py (transformers, Llama-3.1-8B shapes, random bf16 weights) into
#             $OUT/hf_h200.json: first eager vs torch.compile (inductor) at 4K and 128K, B = 1,
#             DynamicCache and K3V3 (≤ COMPILE_TIMEOUT s), then the eager table appended (all
#             depths, B = 1 and the largest fp16 batch, K3V3 / K2V2 / Block-GTQ, capacity rows)
#             with what is left of BUDGET_S. The JSON is rewritten after every row: a stage stopped
#             by its limit keeps its rows, the interrupted point says so in "error".
# Usage there, from the tree's root (the call carries .devdeps):
#   OUT=... tools/device/python_h200.sh     (DEPS=<dir> when .devdeps is elsewhere, e.g. from a .devtree copy)
# Outputs under $OUT: test_engine_host.json, test_engine.json, pytest.xml, pytest.txt,
# sanitizer_memcheck.txt, hf_h200.json, stages.txt (stage, status, seconds).
set -a
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ratekv-out}
mkdir -p "$OUT"
STAGES=${STAGES:-build test sanitize bench}
BUDGET_S=${BUDGET_S:-460}
COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-200}
PY=$(command -v python3)
# Its own build directory: /tmp/ratekv-build may hold a build of another source tree (CMake refuses
# to reuse a build directory for a different source directory).
B=${BUILD:-/tmp/ratekv-build-py}
export BUILD=$B
rc=0
T0=$SECONDS
stage() {  # stage NAME LIMIT_S cmd...: runs cmd under `timeout LIMIT_S`
  local name=$1 lim=$2 t0=$SECONDS st=ok; shift 2
  echo "=== $name (limit $lim s)"
  if [ "$lim" -le 5 ]; then echo "=== SKIPPED (no time left)"; echo "$name skipped 0" >> "$OUT/stages.txt"; rc=1; return; fi
  # timeout runs programs, not shell functions: a function stage runs in a
  # child bash that gets the functions (declare -f) and, by set -a, the variables.
  if declare -F "$1" >/dev/null; then
    timeout --kill-after=10 "$lim" bash -c "$(declare -f); $(printf '%q ' "$@")"
  else
    timeout --kill-after=10 "$lim" "$@"
  fi; local r=$?
  if [ $r -ne 0 ]; then st="failed($r)"; [ $r -eq 124 ] && st="timeout"; echo "=== FAILED: $st"; rc=1; fi
  echo "=== $name: $((SECONDS - t0)) s"
  echo "$name $st $((SECONDS - t0))" >> "$OUT/stages.txt"
}
left() { echo $((BUDGET_S - (SECONDS - T0))); }
pytests() {
  env PYTHONPATH=$B/python:python/tests RATEKV_CLI=$B/bin/ratekv "$PY" -m pytest -q -p no:cacheprovider -rs \
    python/tests/test_cuda.py python/tests/test_exit_leaks.py --junitxml="$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.txt"
  return "${PIPESTATUS[0]}"
}
engine_tests() {
  local r=0
  "$B/tests/test_engine_host" --gtest_output=json:"$OUT/test_engine_host.json" | tail -3 || r=1
  "$B/tests/test_engine" --gtest_output=json:"$OUT/test_engine.json" | tail -5 || r=1
  return $r
}
sanitize() {
  local r=0
  for tool in ${SANITIZE_TOOLS:-memcheck}; do
    env PYTHONPATH=$B/python compute-sanitizer --tool "$tool" --error-exitcode 3 --target-processes all \
      "$PY" tools/device/python_ops_smoke.py > "$OUT/sanitizer_$tool.txt" 2>&1 || r=$?
    tail -3 "$OUT/sanitizer_$tool.txt"
  done
  return $r
}
bench() {  # bench EXTRA_ARGS...
  env PYTHONPATH=$B/python "$PY" bench/hf_decode.py --out "$OUT/hf_h200.json" --steps 4 --warmup 2 "$@"
}
: > "$OUT/stages.txt"
for s in $STAGES; do
  case $s in
    build)
      stage build 200 env CMAKE_ARGS="-DRATEKV_PYTHON=ON -DPython_EXECUTABLE=$PY -DRATEKV_BENCH=OFF" \
        TARGETS="ratekv_python ratekv_cli test_engine_host test_engine" DEPS="${DEPS:-$PWD/.devdeps}" tools/device/build.sh ;;
    test)
      # shellcheck disable=SC1091
      source $B/env.sh
      stage engine-tests 150 engine_tests
      stage pytest 120 pytests ;;
    sanitize)
      source $B/env.sh
      stage "compute-sanitizer" 90 sanitize ;;
    bench)
      source $B/env.sh
      stage bench-compiled "$COMPILE_TIMEOUT" bench --compile eager,compiled --depths 4096,131072 --batches 1 \
        --caches dynamic,K3V3 --no-capacity
      stage bench-eager "$(left)" bench --append --compile eager ${BENCH_ARGS:-} ;;
  esac
done
echo "total $((SECONDS - T0)) s"
exit $rc
