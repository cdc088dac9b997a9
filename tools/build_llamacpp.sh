#!/usr/bin/env bash
# Build the llama.cpp reference used by tools/make_reference_fixtures.sh and
# tools/bench_vs_llamacpp.sh. NEVER run in CI (15-25 min on 2 cores).
#
# Source: the llama.cpp tree vendored in the PyPI sdist llama-cpp-python==0.3.36
# (pip download --no-deps --no-binary :all:), sha256 pinned below. CPU-only, Release,
# shared libraries ON (libllama.so is linked by tools/ref/dump_logits.cpp), -march=native
# (GGML_NATIVE default).
#
#   tools/build_llamacpp.sh          build if needed; prints the bin directory
#
# Environment:
#   RATEKV_LLAMA_ROOT  where the sdist is unpacked and built (default $HOME/.cache/ratekv)
#   RATEKV_DL          download cache (default $HOME/.cache/ratekv/dl)
#   RATEKV_JOBS        parallel build jobs (default 2: the dev machine has 2 shared cores)
#
# Layout produced (matches what the fixture scripts expect):
#   $RATEKV_LLAMA_ROOT/llama_cpp_python-0.3.36/vendor/llama.cpp   sources
#   $RATEKV_LLAMA_ROOT/llama-build/bin/{llama-tokenize,...,libllama.so}
#   $RATEKV_LLAMA_ROOT/llama-cfg.log, llama-build.log (the latter ends with "rc=N")
set -euo pipefail

ROOT="${RATEKV_LLAMA_ROOT:-$HOME/.cache/ratekv}"
DL="${RATEKV_DL:-$HOME/.cache/ratekv/dl}"
JOBS="${RATEKV_JOBS:-2}"

PKG="llama-cpp-python==0.3.36"
SDIST="llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SRC="$ROOT/llama_cpp_python-0.3.36/vendor/llama.cpp"
BUILD="$ROOT/llama-build"
TARGETS=(llama-tokenize llama-perplexity llama-bench llama-simple llama-completion)
CMAKE_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
             -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
             -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA=OFF)

die() { echo "build_llamacpp.sh: error: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH; $2"; }

all_built() {
  local t
  for t in "${TARGETS[@]}"; do [[ -x "$BUILD/bin/$t" ]] || return 1; done
  [[ -e "$BUILD/bin/libllama.so" ]]
}

# An earlier build finished successfully: nothing to do.
if all_built && { [[ ! -f "$ROOT/llama-build.log" ]] || tail -n1 "$ROOT/llama-build.log" | grep -qx 'rc=0'; }; then
  echo "$BUILD/bin"
  exit 0
fi
# A build started by someone else and still running writes llama-build.log without the final rc= line.
if [[ -f "$ROOT/llama-build.log" ]] && ! tail -n1 "$ROOT/llama-build.log" | grep -q '^rc='; then
  die "$ROOT/llama-build.log has no final 'rc=N' line: a build seems to be running; wait for it (or delete the log if that build was killed)"
fi

need cmake "install the Debian package cmake"
need ninja "install the Debian package ninja-build"
need c++ "install build-essential"

if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
  if [[ ! -f "$DL/$SDIST" ]]; then
    need python3 "needed for pip download"
    python3 -m pip --version >/dev/null 2>&1 || die "pip is not available for python3; install python3-pip"
    mkdir -p "$DL"
    python3 -m pip download --no-deps --no-binary :all: -d "$DL" "$PKG" >"$DL/pip-llama-cpp-python.log" 2>&1 \
      || { tail -5 "$DL/pip-llama-cpp-python.log" >&2; die "'pip download $PKG' failed (network or index unavailable?)"; }
  fi
  got="$(sha256sum "$DL/$SDIST" | cut -d' ' -f1)"
  [[ "$got" == "$SDIST_SHA256" ]] || die "$DL/$SDIST has sha256 $got, expected $SDIST_SHA256"
  mkdir -p "$ROOT"
  tar -xzf "$DL/$SDIST" -C "$ROOT"
  [[ -f "$SRC/CMakeLists.txt" ]] || die "$SDIST did not contain vendor/llama.cpp"
fi

echo "build_llamacpp.sh: configuring $BUILD (log $ROOT/llama-cfg.log)" >&2
cmake -S "$SRC" -B "$BUILD" "${CMAKE_FLAGS[@]}" >"$ROOT/llama-cfg.log" 2>&1 \
  || { tail -20 "$ROOT/llama-cfg.log" >&2; die "cmake configure failed"; }
echo "build_llamacpp.sh: building ${TARGETS[*]} with -j$JOBS (log $ROOT/llama-build.log; 15-25 min on 2 cores)" >&2
set +e
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >"$ROOT/llama-build.log" 2>&1
rc=$?
set -e
echo "rc=$rc" >>"$ROOT/llama-build.log"
(( rc == 0 )) || { tail -20 "$ROOT/llama-build.log" >&2; die "build failed (rc=$rc)"; }
all_built || die "build finished but some of ${TARGETS[*]} or libllama.so are missing in $BUILD/bin"
echo "$BUILD/bin"
