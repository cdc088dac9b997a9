#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/<name>.cpp -> <name>) with clang in its
# own build dir (build-fuzz) and runs them one after the other, splitting
# TOTAL_SECONDS (default 300) equally between them (at least 10 s each).
#   usage: tools/run_fuzz.sh [TOTAL_SECONDS]
# The libraries are instrumented too (-fsanitize=fuzzer-no-link,address,
# undefined) so the fuzzer sees coverage inside the readers. Seeds: generated
# tiny valid files (tools/make_gguf_seeds.py for fuzz_gguf,
# tools/make_safetensors_seeds.py for fuzz_safetensors, tools/make_fuzz_seeds.py
# for fuzz_plan, fuzz_calib_stats and fuzz_npy), plus fuzz/corpus/<name>/ when
# present. The growing corpus and crash artifacts stay in build-fuzz/. Prints
# each target's runs and corpus size; exits non-zero if any target finds a
# crash, leak, timeout or OOM, or has no seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
TOTAL=${1:-300}
BUILD=build-fuzz
JOBS=${RATEKV_FUZZ_BUILD_JOBS:-2}
export CC=clang CXX=clang++
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATEKV_FUZZ=ON \
  -DRATEKV_CUDA=OFF -DRATEKV_TESTS=OFF -DRATEKV_BENCH=OFF -DRATEKV_NATIVE=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" >/dev/null

targets=()
for f in fuzz/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
t0=$SECONDS
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
echo "run_fuzz: built ${#targets[@]} targets in $((SECONDS - t0))s"
SECS=$((TOTAL / ${#targets[@]}))
[ "$SECS" -ge 10 ] || SECS=10

# The targets write their inputs to files (the readers take paths): keep those
# in a scratch directory of this run.
export TMPDIR="$PWD/$BUILD/tmp"
mkdir -p "$TMPDIR"
status=0
for t in "${targets[@]}"; do
  seeds="$BUILD/seeds/$t" corpus="$BUILD/corpus/$t" art="$BUILD/artifacts/$t"
  rm -rf "$seeds"; mkdir -p "$seeds" "$corpus" "$art"
  case "$t" in
    fuzz_gguf) python3 tools/make_gguf_seeds.py "$seeds" ;;
    fuzz_safetensors) python3 tools/make_safetensors_seeds.py "$seeds" ;;
    fuzz_plan|fuzz_calib_stats|fuzz_npy) python3 tools/make_fuzz_seeds.py "$t" "$seeds" ;;
  esac
  if [ -d "fuzz/corpus/$t" ]; then cp fuzz/corpus/"$t"/* "$seeds"/ 2>/dev/null || true; fi
  if [ -z "$(ls -A "$seeds")" ]; then echo "run_fuzz: $t has no seeds"; status=1; continue; fi
  echo "=== $t for ${SECS}s ($(ls "$seeds" | wc -l) seeds)"
  # -rss_limit_mb / -malloc_limit_mb: an input that makes the parser allocate
  # far beyond its size is a finding, not a slow run.
  if ! "$BUILD/fuzz/$t" "$corpus" "$seeds" -max_total_time="$SECS" -max_len=8192 -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=256 -artifact_prefix="$art/" -print_final_stats=1 \
      2>"$BUILD/$t.log"; then
    echo "run_fuzz: $t FAILED; last lines of $BUILD/$t.log:"; tail -40 "$BUILD/$t.log"; status=1
  else
    grep -E "(stat::number_of_executed_units|stat::peak_rss_mb|DONE)" "$BUILD/$t.log" || true
    echo "corpus: $(ls "$corpus" | wc -l) files, $(du -sb "$corpus" | cut -f1) bytes"
  fi
done
exit $status
