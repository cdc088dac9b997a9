#!/usr/bin/env bash
# Builds ratekv on the GPU machine (Ubuntu 24.04, nvcc 13.0, no PCRE2 / fmt /
# spdlog / CLI11 / Eigen / OpenBLAS / nlohmann-json / GoogleTest / Google
# Benchmark): unpacks the Debian 12 packages that tools/device/fetch_debs.sh
# downloaded into .devdeps/ (checked against .devdeps/SHA256SUMS) with
# `dpkg -x` into a prefix under /tmp, configures the top-level CMake against
# that prefix (CMAKE_PREFIX_PATH, PKG_CONFIG_PATH; LD_LIBRARY_PATH for the
# programs) and builds the CUDA targets, the CLI and the tests. Prints the
# time of each part.
#
# Usage (GPU machine, repo root or a copy of it; the call carries .devdeps):
#   tools/device/build.sh                 # default targets (below)
#   TARGETS="ratekv_cli test_engine" tools/device/build.sh
#   source /tmp/ratekv-build/env.sh       # LD_LIBRARY_PATH for running the programs
# Environment: DEPS (default <repo>/.devdeps), PREFIX (/tmp/ratekv-deps),
# BUILD (/tmp/ratekv-build; kept between calls while the machine stays warm,
# so a second call rebuilds only what changed), JOBS (16), CMAKE_ARGS (extra
# configure arguments), TARGETS (default: ratekv_cli test_cuda, plus
# test_engine, bench_cuda_decode and the Python extension target
# `ratekv_python` when the tree defines them).
# Programs land in $BUILD/bin (ratekv) and $BUILD/tests, $BUILD/bench.
# Exit status: 1 when a package is missing or its checksum differs, or
# configure/build fails (the last 60 lines of the log are printed).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEPS=${DEPS:-$ROOT/.devdeps}
PREFIX=${PREFIX:-/tmp/ratekv-deps}
BUILD=${BUILD:-/tmp/ratekv-build}
JOBS=${JOBS:-16}
t0=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }

# 1. Packages: verify, unpack into the prefix.
if [ ! -f "$DEPS/SHA256SUMS" ]; then
  echo "build.sh: $DEPS/SHA256SUMS not found: run tools/device/fetch_debs.sh here first and carry .devdeps" >&2
  exit 1
fi
if ! (cd "$DEPS" && sha256sum --quiet -c SHA256SUMS); then
  echo "build.sh: a package in $DEPS does not match SHA256SUMS" >&2
  exit 1
fi
if [ ! -f "$PREFIX/.unpacked" ] || ! cmp -s "$DEPS/SHA256SUMS" "$PREFIX/.unpacked"; then
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  for f in "$DEPS"/*.deb; do dpkg -x "$f" "$PREFIX" || { echo "build.sh: dpkg -x $f failed" >&2; exit 1; }; done
  # Debian selects the OpenBLAS flavour through update-alternatives, which
  # dpkg -x does not run: link the pthread flavour where CMake's FindBLAS and
  # the loader look.
  L=$PREFIX/usr/lib/x86_64-linux-gnu
  for lib in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3 liblapack.so liblapack.so.3; do
    [ -e "$L/openblas-pthread/$lib" ] && ln -sf "openblas-pthread/$lib" "$L/$lib"
  done
  # pkg-config files name prefix=/usr: point them into the prefix.
  find "$PREFIX" -name '*.pc' -exec sed -i "s|^prefix=/usr\$|prefix=$PREFIX/usr|" {} +
  cp "$DEPS/SHA256SUMS" "$PREFIX/.unpacked"
fi
t1=$(date +%s.%N)
echo "build.sh: $(ls "$DEPS"/*.deb | wc -l) packages unpacked into $PREFIX in $(elapsed "$t0") s"

L=$PREFIX/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$L/pkgconfig:$PREFIX/usr/share/pkgconfig:$L/openblas-pthread/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$L:$L/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$BUILD"
cat > "$BUILD/env.sh" <<ENV
export LD_LIBRARY_PATH=$L:$L/openblas-pthread\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
ENV

# 2. Configure.
LOG=$BUILD/build.log
if ! cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRATEKV_CUDA=ON \
     -DCMAKE_PREFIX_PATH="$PREFIX/usr" ${CMAKE_ARGS:-} > "$LOG" 2>&1; then
  tail -60 "$LOG"; echo "build.sh: configure failed (log $LOG)" >&2; exit 1
fi
grep -E "ratekv: CUDA" "$LOG"
if ! grep -q "ratekv: CUDA kernels ON" "$LOG"; then
  echo "build.sh: CUDA is off (nvcc not found?)" >&2; exit 1
fi
t2=$(date +%s.%N)
echo "build.sh: configured in $(elapsed "$t1") s"

# 3. Build.
if [ -z "${TARGETS:-}" ]; then
  TARGETS="ratekv_cli test_cuda"
  all=$(cmake --build "$BUILD" --target help 2>/dev/null)
  for t in test_engine bench_cuda_decode ratekv_python; do
    grep -qE "^$t:|^\.\.\. $t\$|^$t " <<<"$all" && TARGETS="$TARGETS $t"
  done
fi
if ! cmake --build "$BUILD" -j"$JOBS" --target $TARGETS >> "$LOG" 2>&1; then
  grep -E "error|Error" "$LOG" | head -30; tail -40 "$LOG"; echo "build.sh: build failed (log $LOG)" >&2; exit 1
fi
echo "build.sh: built [$TARGETS] in $(elapsed "$t2") s; total $(elapsed "$t0") s (build dir $BUILD)"
