#!/usr/bin/env bash
# The test command (README.md): installs dependencies, fetches the model and
# texts (cached, checksummed), builds ratekv in build/ and runs every CTest suite.
# Env: RATEKV_BUILD_DIR (default build), RATEKV_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/fetch_assets.sh
B=${RATEKV_BUILD_DIR:-build}
J=${RATEKV_JOBS:-$(nproc)}
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release ${RATEKV_CMAKE_ARGS:-} >/dev/null
cmake --build "$B" -j "$J"
# Passive OpenMP waits: ctest -j runs several multi-threaded tests at once.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export RATEKV_ASSETS=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
ctest --test-dir "$B" --output-on-failure -j "$J" --timeout 900
