#!/usr/bin/env bash
# Prefill and decode speed of llama.cpp (llama-bench, CPU) on the default model, and — when
# ratekv's forward benchmark is built — ratekv/llama.cpp ratios measured in the same run.
# Never in CI. Prerequisites: tools/fetch_assets.sh, tools/build_llamacpp.sh.
#
#   tools/bench_vs_llamacpp.sh
#
# Environment:
#   RATEKV_ASSETS, RATEKV_LLAMA_ROOT   as in tools/fetch_assets.sh / tools/build_llamacpp.sh
#   RATEKV_BENCH_THREADS               threads for both sides (default 2)
#   RATEKV_BENCH_REPS                  llama-bench repetitions (default 3)
#   RATEKV_BENCH_FORWARD               ratekv benchmark binary (default build/bench/bench_forward)
#
# Writes bench/results/llamacpp_cpu.json (llama-bench JSON records plus the commands) and,
# if the ratekv binary exists, bench/results/ratekv_cpu.json and bench/results/ratios.md.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
ASSETS="${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}"
ROOT="${RATEKV_LLAMA_ROOT:-$HOME/.cache/ratekv}"
BIN="$ROOT/llama-build/bin"
MODEL="$ASSETS/models/SmolLM2-135M-Instruct.Q4_1.gguf"
THREADS="${RATEKV_BENCH_THREADS:-2}"
REPS="${RATEKV_BENCH_REPS:-3}"
RATEKV_BENCH="${RATEKV_BENCH_FORWARD:-$REPO/build/bench/bench_forward}"
RESULTS="$REPO/bench/results"

die() { echo "bench_vs_llamacpp.sh: error: $*" >&2; exit 1; }
[[ -x "$BIN/llama-bench" ]] || die "$BIN/llama-bench not found: run tools/build_llamacpp.sh first"
[[ -f "$MODEL" ]] || die "$MODEL not found: run tools/fetch_assets.sh first"
command -v python3 >/dev/null || die "python3 not found"
mkdir -p "$RESULTS"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# Prefill: pp512 and pp2048 from an empty cache. Decode: tg128 after a prefilled depth of 512
# and of 2048 tokens (-d). K/V cache f16 and flash attention auto (llama-bench defaults).
PP=("$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -r "$REPS" -p 512,2048 -n 0 -o json)
TG=("$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -r "$REPS" -p 0 -n 128 -d 512,2048 -o json)
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
# Runs only when the ratekv forward benchmark (bench/bench_forward.cpp, written separately) is
# built. Contract expected from it: Google Benchmark JSON output in which each benchmark whose
# name contains one of pp512, pp2048, tg128@d512, tg128@d2048 (the keys printed above) reports
# a user counter "tok_per_s". Adjust the run line / matching below if that binary ends up
# with a different interface.
if [[ -x "$RATEKV_BENCH" ]]; then
  echo "bench_vs_llamacpp.sh: $RATEKV_BENCH" >&2
  RATEKV_BENCH_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" "$RATEKV_BENCH" \
    --benchmark_out="$RESULTS/ratekv_cpu.json" --benchmark_out_format=json >&2
  python3 - "$RESULTS/llamacpp_cpu.json" "$RESULTS/ratekv_cpu.json" "$RESULTS/ratios.md" <<'EOF'
import json, sys
llama, ours, out = sys.argv[1:]
ref = {r["ratekv_key"]: r["avg_ts"] for r in json.load(open(llama))["records"]}
rows = []
for b in json.load(open(ours)).get("benchmarks", []):
    if "tok_per_s" not in b or b.get("run_type") == "aggregate":
        continue
    for k, v in ref.items():
        if k in b["name"]:
            rows.append((k, b["name"], b["tok_per_s"], v))
if not rows:
    sys.exit("bench_vs_llamacpp.sh: no ratekv benchmark named with pp512/pp2048/tg128@d512/tg128@d2048 "
             "and a tok_per_s counter; no ratios computed")
lines = ["| test | ratekv benchmark | ratekv tok/s | llama.cpp tok/s | llama.cpp / ratekv |",
         "|---|---|---:|---:|---:|"]
lines += [f"| {k} | {n} | {o:.1f} | {l:.1f} | {l / o:.2f}x |" for k, n, o, l in rows]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
else
  echo "bench_vs_llamacpp.sh: $RATEKV_BENCH not built; llama.cpp numbers only (no ratios)" >&2
fi
# =============================================================================================
