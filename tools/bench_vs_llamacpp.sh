#!/usr/bin/env bash
# Prefill and decode speed of llama.cpp (llama-bench, CPU) on the default model (or
# RATEKV_BENCH_MODEL), and — when
# ratekv's forward benchmark is built — ratekv/llama.cpp ratios measured in the same run.
# Never in CI. Prerequisites: tools/fetch_assets.sh, tools/build_llamacpp.sh.
#
#   tools/bench_vs_llamacpp.sh
#
# Environment:
#   RATEKV_ASSETS, RATEKV_LLAMA_ROOT   as in tools/fetch_assets.sh / tools/build_llamacpp.sh
#   RATEKV_BENCH_MODEL                 GGUF for both sides (default: SmolLM2-135M-Instruct Q4_1)
#   RATEKV_BENCH_THREADS               threads for both sides (default 2)
#   RATEKV_BENCH_REPS                  llama-bench repetitions (default 3)
#   RATEKV_BENCH_FORWARD               ratekv benchmark binary (default build/bench/bench_forward)
#   RATEKV_BENCH_PROMPTS               prefill lengths (llama-bench -p, default 512,2048)
#   RATEKV_BENCH_DEPTHS                decode depths (llama-bench -d, default 512,2048)
#   RATEKV_BENCH_GEN                   llama-bench decode tokens per test (-n, default 128)
#   RATEKV_BENCH_FILTER                bench_forward --benchmark_filter (default: all)
#   RATEKV_BENCH_RESULTS               output folder (default bench/results)
#   A quick check of the pipeline (not a measurement), e.g.:
#     RATEKV_BENCH_PROMPTS=512 RATEKV_BENCH_DEPTHS=512 RATEKV_BENCH_GEN=16 RATEKV_BENCH_REPS=1 \
#     RATEKV_BENCH_FILTER='/512/' RATEKV_BENCH_RESULTS=/tmp/bench tools/bench_vs_llamacpp.sh
#   (bench_forward itself measures prefill 512/2048 and decode at depth 512/2048 only.)
#
# Writes $RESULTS/llamacpp_cpu.json (llama-bench JSON records plus the commands) and, if the
# ratekv binary exists, $RESULTS/ratekv_cpu.json and $RESULTS/ratios.md
# (tools/bench_vs_llamacpp_ratios.py pairs the two).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
ASSETS="${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}"
ROOT="${RATEKV_LLAMA_ROOT:-$HOME/.cache/ratekv}"
BIN="$ROOT/llama-build/bin"
MODEL="${RATEKV_BENCH_MODEL:-$ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${RATEKV_BENCH_THREADS:-2}"
REPS="${RATEKV_BENCH_REPS:-3}"
RATEKV_BENCH="${RATEKV_BENCH_FORWARD:-$REPO/build/bench/bench_forward}"
PROMPTS="${RATEKV_BENCH_PROMPTS:-512,2048}"
DEPTHS="${RATEKV_BENCH_DEPTHS:-512,2048}"
GEN="${RATEKV_BENCH_GEN:-128}"
FILTER="${RATEKV_BENCH_FILTER:-}"
RESULTS="${RATEKV_BENCH_RESULTS:-$REPO/bench/results}"

die() { echo "bench_vs_llamacpp.sh: error: $*" >&2; exit 1; }
[[ -x "$BIN/llama-bench" ]] || die "$BIN/llama-bench not found: run tools/build_llamacpp.sh first"
[[ -f "$MODEL" ]] || die "$MODEL not found: run tools/fetch_assets.sh first"
command -v python3 >/dev/null || die "python3 not found"
mkdir -p "$RESULTS"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# Prefill: pp512 and pp2048 from an empty cache. Decode: tg128 after a prefilled depth of 512
# and of 2048 tokens (-d). K/V cache f16 and flash attention auto (llama-bench defaults).
PP=("$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -r "$REPS" -p "$PROMPTS" -n 0 -o json)
TG=("$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -r "$REPS" -p 0 -n "$GEN" -d "$DEPTHS" -o json)
echo "bench_vs_llamacpp.sh: ${PP[*]}" >&2
"${PP[@]}" >"$TMP/pp.json" 2>"$TMP/pp.log" || { tail "$TMP/pp.log" >&2; die "llama-bench (prefill) failed"; }
echo "bench_vs_llamacpp.sh: ${TG[*]}" >&2
"${TG[@]}" >"$TMP/tg.json" 2>"$TMP/tg.log" || { tail "$TMP/tg.log" >&2; die "llama-bench (decode) failed"; }

python3 - "$TMP/pp.json" "$TMP/tg.json" "$RESULTS/llamacpp_cpu.json" "${PP[*]}" "${TG[*]}" <<'EOF'
import json, sys
pp, tg, out, cmd_pp, cmd_tg = sys.argv[1:]
records = json.load(open(pp)) + json.load(open(tg))
def key(r):
    return f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}@d{r['n_depth']}"
for r in records:
    r["ratekv_key"] = key(r)
json.dump({"tool": "llama-bench", "commands": [cmd_pp, cmd_tg], "records": records}, open(out, "w"), indent=1)
print("| test | llama.cpp tokens/s | stddev |")
print("|---|---:|---:|")
for r in records:
    print(f"| {r['ratekv_key']} | {r['avg_ts']:.1f} | {r['stddev_ts']:.1f} |")
r0 = records[0]
print(f"\nllama.cpp build {r0.get('build_commit')} ({r0.get('build_number')}), {r0.get('cpu_info')}, "
      f"threads {r0.get('n_threads')}, type_k {r0.get('type_k')}, flash_attn {r0.get('flash_attn')}")
EOF
echo "bench_vs_llamacpp.sh: wrote $RESULTS/llamacpp_cpu.json" >&2

# ==== ratekv side ============================================================================
# Runs only when the ratekv forward benchmark (bench/bench_forward.cpp) is built: Google
# Benchmark JSON, BM_Prefill/<N> and BM_Decode/<depth> with a tokens_per_second counter, paired
# with llama-bench's pp<N> and tg<G>@d<depth> by tools/bench_vs_llamacpp_ratios.py.
if [[ -x "$RATEKV_BENCH" ]]; then
  BENCH_ARGS=(--benchmark_out="$RESULTS/ratekv_cpu.json" --benchmark_out_format=json)
  [[ -n "$FILTER" ]] && BENCH_ARGS+=(--benchmark_filter="$FILTER")
  echo "bench_vs_llamacpp.sh: $RATEKV_BENCH ${BENCH_ARGS[*]}" >&2
  RATEKV_BENCH_MODEL="$MODEL" RATEKV_BENCH_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" "$RATEKV_BENCH" \
    "${BENCH_ARGS[@]}" >&2
  python3 "$HERE/bench_vs_llamacpp_ratios.py" "$RESULTS/llamacpp_cpu.json" "$RESULTS/ratekv_cpu.json" \
    "$RESULTS/ratios.md"
else
  echo "bench_vs_llamacpp.sh: $RATEKV_BENCH not built; llama.cpp numbers only (no ratios)" >&2
fi
# =============================================================================================
