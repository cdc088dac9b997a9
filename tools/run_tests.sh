#!/usr/bin/env bash
# The test command (README.md): installs dependencies, fetches the model and
# texts (cached, checksummed), builds ratekv in build/ (CLI, tests and the Python
# extension, RATEKV_PYTHON=ON), runs every CTest suite, then the Python tests
# (pytest python/tests against <build>/python, the package assembled from the
# same build: the extension links the libraries the C++ tests use).
# Env: RATEKV_BUILD_DIR (default build), RATEKV_JOBS (default nproc),
# RATEKV_PYTHON_TESTS=0 skips the Python dependencies, extension and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
PYTESTS=${RATEKV_PYTHON_TESTS:-1}
if [ "$PYTESTS" != 0 ]; then bash tools/install_python_deps.sh; fi
bash tools/fetch_assets.sh
B=${RATEKV_BUILD_DIR:-build}
J=${RATEKV_JOBS:-$(nproc)}
PYOPT=(-DRATEKV_PYTHON=OFF)
if [ "$PYTESTS" != 0 ]; then PYOPT=(-DRATEKV_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)"); fi
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release "${PYOPT[@]}" ${RATEKV_CMAKE_ARGS:-} >/dev/null
cmake --build "$B" -j "$J"
# Passive OpenMP waits: ctest -j runs several multi-threaded tests at once.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export RATEKV_ASSETS=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
ctest --test-dir "$B" --output-on-failure -j "$J" --timeout 900
if [ "$PYTESTS" != 0 ]; then
  PYTHONPATH="$B/python" RATEKV_CLI="$B/bin/ratekv" python3 -m pytest -q -p no:cacheprovider python/tests
fi
