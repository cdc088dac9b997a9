#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/<name>.cpp -> <name>) with clang in its
# own build dir (build-fuzz) and runs each for SECONDS (default 60).
#   usage: tools/run_fuzz.sh [SECONDS]
# The io library is instrumented too (-fsanitize=fuzzer-no-link,address,
# undefined) so the fuzzer sees coverage inside the parser. Seeds: generated
# tiny valid files (tools/make_gguf_seeds.py for fuzz_gguf,
# tools/make_safetensors_seeds.py for fuzz_safetensors), plus fuzz/corpus/<name>/
# when present. The growing corpus and crash artifacts stay in build-fuzz/.
# Exits non-zero if any target finds a crash, leak, timeout or OOM.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
BUILD=build-fuzz
JOBS=${RATEKV_FUZZ_BUILD_JOBS:-2}
export CC=clang CXX=clang++
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRATEKV_FUZZ=ON \
  -DRATEKV_CUDA=OFF -DRATEKV_TESTS=OFF -DRATEKV_BENCH=OFF -DRATEKV_NATIVE=OFF \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" >/dev/null

targets=()
for f in fuzz/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

status=0
for t in "${targets[@]}"; do
  seeds="$BUILD/seeds/$t" corpus="$BUILD/corpus/$t" art="$BUILD/artifacts/$t"
  rm -rf "$seeds"; mkdir -p "$seeds" "$corpus" "$art"
  case "$t" in
    fuzz_gguf) python3 tools/make_gguf_seeds.py "$seeds" ;;
    fuzz_safetensors) python3 tools/make_safetensors_seeds.py "$seeds" ;;
  esac
  if [ -d "fuzz/corpus/$t" ]; then cp fuzz/corpus/"$t"/* "$seeds"/ 2>/dev/null || true; fi
  echo "=== $t for ${SECS}s"
  # -rss_limit_mb / -malloc_limit_mb: an input that makes the parser allocate
  # far beyond its size is a finding, not a slow run.
  if ! "$BUILD/fuzz/$t" "$corpus" "$seeds" -max_total_time="$SECS" -max_len=8192 -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=256 -artifact_prefix="$art/" -print_final_stats=1 \
      2>"$BUILD/$t.log"; then
    echo "run_fuzz: $t FAILED; last lines of $BUILD/$t.log:"; tail -40 "$BUILD/$t.log"; status=1
  else
    grep -E "(stat::number_of_executed_units|stat::peak_rss_mb|DONE)" "$BUILD/$t.log" || true
  fi
done
exit $status
