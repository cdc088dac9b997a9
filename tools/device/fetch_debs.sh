#!/usr/bin/env bash
# Downloads (here, not on the GPU machine) the Debian 12 packages the project's
# build needs and the GPU machine lacks: OpenBLAS, Eigen,
# nlohmann-json, CLI11, fmt, spdlog, PCRE2, GoogleTest/GoogleMock, Google
# Benchmark and their runtime libraries. They land in DEST (default: the
# git-ignored .devdeps/ at the repo root, ≈ 19 MB, listed in
# .git/info/exclude) with DEST/SHA256SUMS recording each file's sha256.
# tools/device/build.sh unpacks them there with `dpkg -x` into a prefix; the
# device call names `.devdeps` in `carry`.
#
# Usage (repo root, this machine): tools/device/fetch_debs.sh [DEST]
# Needs apt-get with Debian 12 (bookworm) sources; re-running replaces DEST's
# .deb files. Exit status 1 when a download fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.devdeps}
PKGS=(libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev
      libeigen3-dev nlohmann-json3-dev libcli11-dev
      libfmt-dev libfmt9 libspdlog-dev libspdlog1.10
      libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
      libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
      libgfortran5 liblapack3 libblas3)
. /etc/os-release
if [ "${VERSION_CODENAME:-}" != bookworm ]; then
  echo "fetch_debs: this machine is ${PRETTY_NAME:-unknown}, not Debian 12 (bookworm); the package set is Debian 12's" >&2
  exit 1
fi
mkdir -p "$DEST"
rm -f "$DEST"/*.deb "$DEST"/SHA256SUMS
(cd "$DEST" && apt-get download "${PKGS[@]}")
(cd "$DEST" && sha256sum *.deb > SHA256SUMS)
n=$(ls "$DEST"/*.deb | wc -l)
if [ "$n" -ne "${#PKGS[@]}" ]; then
  echo "fetch_debs: $n .deb files for ${#PKGS[@]} packages in $DEST" >&2
  exit 1
fi
echo "fetch_debs: $n packages, $(du -sh "$DEST" | cut -f1) in $DEST (sha256 in $DEST/SHA256SUMS)"
