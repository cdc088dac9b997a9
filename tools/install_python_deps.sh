#!/usr/bin/env bash
# Installs what the Python package's build and tests need (python/tests, README "Python"):
# torch and transformers pinned to the GPU machine's versions (torch 2.11+cu130, transformers 5.17 there), the GGUF reader
# transformers' GGUF loader needs, nanobind and scikit-build-core for the extension, pytest.
# Wheels are downloaded once into ~/.cache/ratekv/wheels (RATEKV_WHEELS overrides) and installed
# from there; PyPI's torch wheel pulls ≈ 3 GB of CUDA libraries (measured: 93 s to download and
# install on a fresh machine; nothing when the pinned versions are already installed).
# Idempotent; run as root (system pip), like tools/install_deps.sh.
set -euo pipefail
PY=${PYTHON:-python3}
PINS=(torch==2.11.0 transformers==5.17.0 gguf==0.19.0 accelerate==1.15.0 nanobind==3.1.0
      scikit-build-core==1.1.2 pytest numpy safetensors)
if "$PY" - "${PINS[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for p in sys.argv[1:]:
    name, _, want = p.partition("==")
    have = version(name)
    if want and have.split("+")[0] != want:
        raise SystemExit(1)
PY
then
  echo "install_python_deps: ok (already installed)"
  exit 0
fi
W=${RATEKV_WHEELS:-$HOME/.cache/ratekv/wheels}
mkdir -p "$W"
echo "install_python_deps: pip download into $W, then install"
"$PY" -m pip download -q --disable-pip-version-check -d "$W" "${PINS[@]}"
"$PY" -m pip install -q --disable-pip-version-check --no-index --find-links "$W" "${PINS[@]}"
echo "install_python_deps: ok"
