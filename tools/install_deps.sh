#!/usr/bin/env bash
# Installs every build/test dependency of ratekv from Debian packages (and the
# few PyPI packages the Python helpers use). Idempotent; run as root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
PKGS=(build-essential cmake pkg-config ninja-build clang libclang-rt-14-dev
      libopenblas-dev libeigen3-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
      libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev libomp-dev liblemon-dev libfaiss-dev
      python3.11-doc python3-pip unzip)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "install_deps: apt-get install ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check numpy matplotlib safetensors
echo "install_deps: ok"
