#!/usr/bin/env bash
# The Python package on the GPU machine (issue 23): builds the extension there (Python 3.12; an
# extension built here does not import there) with tools/device/build.sh, runs the Python tests on
# CUDA (python/tests/test_cuda.py: ops vs the CPU packed cache, CUDA graphs, torch.compile, HF
# PackedCache vs FakeQuantCache; the CPU tests that need no assets), compute-sanitizer memcheck
# and racecheck on the ops (tools/device/python_ops_smoke.py), then bench/hf_decode.py
# (transformers, Llama-3.1-8B shapes, random bf16 weights) into $OUT/hf_h200.json.
# Usage there, from the tree's root (the call carries .devdeps):
#   OUT=... tools/device/python_h200.sh            # STAGES="build test sanitize bench" by default
# Each stage prints its wall time; a failing stage does not stop the later ones (exit 1 at the end).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ratekv-out}
mkdir -p "$OUT"
STAGES=${STAGES:-build test sanitize bench}
PY=$(command -v python3)
rc=0
stage() { local t0=$SECONDS; echo "=== $1"; shift; "$@" || { echo "=== FAILED"; rc=1; }; echo "=== $((SECONDS - t0)) s"; }
for s in $STAGES; do
  case $s in
    build)
      stage build env CMAKE_ARGS="-DRATEKV_PYTHON=ON -DPython_EXECUTABLE=$PY -DRATEKV_BENCH=OFF" \
        TARGETS="ratekv_python ratekv_cli" DEPS="$PWD/.devdeps" tools/device/build.sh ;;
    test)
      # shellcheck disable=SC1091
      source /tmp/ratekv-build/env.sh
      stage test env PYTHONPATH=/tmp/ratekv-build/python RATEKV_CLI=/tmp/ratekv-build/bin/ratekv \
        "$PY" -m pytest -q -p no:cacheprovider python/tests/test_cuda.py python/tests/test_core.py \
        python/tests/test_hf_cache.py --junitxml="$OUT/pytest.xml" ;;
    sanitize)
      source /tmp/ratekv-build/env.sh
      for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
        stage "compute-sanitizer $tool" env PYTHONPATH=/tmp/ratekv-build/python \
          compute-sanitizer --tool "$tool" --error-exitcode 3 --target-processes all \
          "$PY" tools/device/python_ops_smoke.py > "$OUT/sanitizer_$tool.txt" 2>&1
        tail -3 "$OUT/sanitizer_$tool.txt"
      done ;;
    bench)
      source /tmp/ratekv-build/env.sh
      # The eager table, then torch.compile at one point (an 8B model's compile takes minutes).
      stage bench env PYTHONPATH=/tmp/ratekv-build/python "$PY" bench/hf_decode.py --out "$OUT/hf_h200.json" \
        --compile eager ${BENCH_ARGS:-}
      stage bench-compiled timeout "${COMPILE_TIMEOUT:-150}" env PYTHONPATH=/tmp/ratekv-build/python "$PY" \
        bench/hf_decode.py --out "$OUT/hf_h200_compiled.json" --compile compiled --depths 4096 --batches 1 \
        --caches dynamic,K3V3 ;;
  esac
done
exit $rc
