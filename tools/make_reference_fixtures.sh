#!/usr/bin/env bash
# Regenerate the llama.cpp reference fixtures under tests/fixtures/smollm2/, gemma3/,
# qwen2.5-coder-0.5b/ or qwen2.5-coder-1.5b/ (run once by a person, NEVER in CI). Formats:
# the README.md there.
#
# Prerequisites:
#   tools/fetch_assets.sh        (model + text/eval.txt; --with-qwen-1.5b for qwen15)
#   tools/build_llamacpp.sh      (llama.cpp CPU build, 15-25 min on 2 cores)
#
#   tools/make_reference_fixtures.sh [--model smollm2|gemma3|qwen05|qwen15] [tokenizer] [logits] [greedy] [perplexity]
#       (no step: all four, in that order; default model smollm2)
#
# Environment: RATEKV_ASSETS, RATEKV_LLAMA_ROOT as in the two scripts above.
# Needs python3 (+ numpy for the logits fixture) and a C++17 compiler for tools/ref/llama_ref.cpp.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
ASSETS="${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}"
ROOT="${RATEKV_LLAMA_ROOT:-$HOME/.cache/ratekv}"
SRC="$ROOT/llama_cpp_python-0.3.36/vendor/llama.cpp"
BIN="$ROOT/llama-build/bin"
EVAL="$ASSETS/text/eval.txt"
LLAMA_REF="$ROOT/ref/llama_ref"

die() { echo "make_reference_fixtures.sh: error: $*" >&2; exit 1; }

WHICH=smollm2
if [[ "${1:-}" == "--model" ]]; then WHICH="${2:-}"; shift 2 || die "--model needs a value"; fi
case "$WHICH" in
  smollm2)
    OUT="$REPO/tests/fixtures/smollm2"
    MODEL="$ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    F32_MODEL="$ROOT/ref/SmolLM2-135M-Instruct.F32-from-Q4_1.gguf"
    SET=() ;;
  gemma3)
    OUT="$REPO/tests/fixtures/gemma3"
    MODEL="$ASSETS/models/gemma-3-270m-q4_k_m.gguf"
    F32_MODEL="$ROOT/ref/gemma-3-270m.F32-from-Q4_K_M.gguf"
    SET=(gemma3) ;;
  qwen05)
    OUT="$REPO/tests/fixtures/qwen2.5-coder-0.5b"
    MODEL="$ASSETS/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    F32_MODEL="$ROOT/ref/qwen2.5-coder-0.5b.F32-from-Q4_K_M.gguf"
    SET=(qwen2) ;;
  qwen15)
    OUT="$REPO/tests/fixtures/qwen2.5-coder-1.5b"
    MODEL="$ASSETS/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    F32_MODEL="$ROOT/ref/qwen2.5-coder-1.5b.F32-from-Q4_K_M.gguf"
    SET=(qwen2) ;;
  *) die "--model '$WHICH': expected smollm2, gemma3, qwen05 or qwen15" ;;
esac

STEPS=("$@")
(( ${#STEPS[@]} )) || STEPS=(tokenizer logits greedy perplexity)
for s in "${STEPS[@]}"; do
  case "$s" in tokenizer|logits|greedy|perplexity) ;; *) die "unknown step '$s' (expected tokenizer, logits, greedy or perplexity)";; esac
done

for t in llama-tokenize llama-perplexity; do
  [[ -x "$BIN/$t" ]] || die "$BIN/$t not found: run tools/build_llamacpp.sh first"
done
[[ -e "$BIN/libllama.so" && -f "$SRC/include/llama.h" ]] || die "libllama.so or llama.h missing under $ROOT: run tools/build_llamacpp.sh first"
"$HERE/fetch_assets.sh" --check >/dev/null || die "assets missing or corrupt: run tools/fetch_assets.sh first"
[[ -f "$MODEL" ]] || die "$MODEL not found: run tools/fetch_assets.sh (--with-qwen-1.5b for qwen15)"
command -v python3 >/dev/null || die "python3 not found"
MODEL_SHA="$(sha256sum "$MODEL" | cut -d' ' -f1)"
EVAL_SHA="$(sha256sum "$EVAL" | cut -d' ' -f1)"
mkdir -p "$OUT" "$ROOT/ref"

# The libllama helper (logits, greedy, F32 dequantization); rebuilt when its source changes.
build_ref() {
  if [[ ! -x "$LLAMA_REF" || "$HERE/ref/llama_ref.cpp" -nt "$LLAMA_REF" ]]; then
    echo "make_reference_fixtures.sh: compiling tools/ref/llama_ref.cpp" >&2
    c++ -std=c++17 -O2 -Wall -Wextra -I"$SRC/include" -I"$SRC/ggml/include" "$HERE/ref/llama_ref.cpp" \
      -L"$BIN" -lllama -lggml -lggml-base -Wl,-rpath,"$BIN" -o "$LLAMA_REF"
  fi
  if [[ ! -f "$F32_MODEL" ]]; then
    echo "make_reference_fixtures.sh: writing the F32 copy of the model to $F32_MODEL" >&2
    "$LLAMA_REF" dequant "$MODEL" "$F32_MODEL.tmp" && mv "$F32_MODEL.tmp" "$F32_MODEL"
  fi
}

for s in "${STEPS[@]}"; do
  echo "make_reference_fixtures.sh: $s" >&2
  case "$s" in
    tokenizer)
      # Qwen2.5-Coder 0.5B and 1.5B share one vocabulary: one tokenizer fixture (in the 0.5B
      # directory), checked on both when the 1.5B file is present.
      if [[ "$WHICH" == qwen15 ]]; then
        echo "make_reference_fixtures.sh: qwen15 shares the 0.5B tokenizer fixture (run --model qwen05 tokenizer)" >&2
        continue
      fi
      OTHERS=()
      Q15="$ASSETS/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
      if [[ "$WHICH" == qwen05 && -f "$Q15" ]]; then OTHERS=("$Q15"); fi
      python3 "$HERE/ref/tokenizer_fixture.py" "$BIN/llama-tokenize" "$MODEL" "$MODEL_SHA" "$OUT/tokenizer.json" "${SET[@]}" \
        "${OTHERS[@]}"
      if [[ "$WHICH" == gemma3 || "$WHICH" == qwen05 ]]; then
        python3 "$HERE/ref/tokenizer_stress_fixture.py" "$BIN/llama-tokenize" "$MODEL" "$OUT/tokenizer_stress.json" \
          "${OTHERS[@]}"
      fi ;;
    logits)
      build_ref
      python3 "$HERE/ref/logits_fixture.py" "$LLAMA_REF" "$F32_MODEL" "$MODEL" "$MODEL_SHA" "$OUT" "${SET[@]}" ;;
    greedy)
      build_ref
      python3 "$HERE/ref/greedy_fixture.py" "$LLAMA_REF" "$F32_MODEL" "$MODEL" "$MODEL_SHA" "$OUT/greedy.json" "${SET[@]}" ;;
    perplexity)
      build_ref
      python3 "$HERE/ref/perplexity_fixture.py" "$BIN" "$MODEL" "$F32_MODEL" "$MODEL_SHA" "$EVAL" "$EVAL_SHA" \
        "$OUT/perplexity.json" "$ROOT/ref/ppl_cache" "${SET[@]}" ;;
  esac
done
ls -l "$OUT"
