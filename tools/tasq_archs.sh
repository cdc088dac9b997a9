#!/usr/bin/env bash
# TaSQ vs CQ (K-only) on the architectures beyond SmolLM2 (issue 20): Gemma 3 270M (sliding
# layers with their own RoPE base, head_dim 256, 1 KV head) and Qwen2.5-Coder-0.5B (Q/K/V
# biases, GQA 7, head_dim 64). A small configuration that fits the shared 2-core machine —
# not the paper's (K = 1024, 40K tokens; tools/tasq_smollm2.sh runs that on SmolLM2).
# Per model, ONE capture of calib.txt (forward + backward per window) feeds:
#   tasq        ratekv plan --method tasq --fisher (query-guided weights, shared fp16 scale per
#               token, matching, Fisher-weighted k-means)
#   cq          --also cq: contiguous groups, plain k-means (the baseline of docs/design.md §5.6)
#   no-normalization  --also no-normalization: TaSQ without the shared scale, i.e. exactly the
#               stored bits per key element of CQ (TaSQ's scale costs 16 bits per token per layer)
# each with KSEEDS k-means seeds, GROUP channels per group and CENTROIDS centroids
# (log2(CENTROIDS)/GROUP code bits), values fp16. Then `ratekv eval` of all plans on eval.txt:
# K-only perplexity over PPL_TOKENS in windows of CTX, RoPE-logit MAE and attention KL (query
# stride STRIDE). Writes OUT/<model>/{tasq,...}.s<k>.json, fit.json, eval.json, *.time;
# tools/tasq_archs_report.py OUT RESULTS writes RESULTS.{json,md}.
#
#   B=build/bin/ratekv MODELS="gemma3 qwen05" RESULTS=bench/results/tasq_archs bash tools/tasq_archs.sh
# Knobs (env): TOKENS (8192), GROUP (8), CENTROIDS (256), ITERS (10), KSEEDS (3), CTX (512),
# PPL_TOKENS (4096), STRIDE (4), SEED (0), BASELINE (fp16: built-in caches also evaluated, "" for
# none), OUT (tasq_archs_out), STAGE (fit,eval,report), RESULTS (unset: no report).
set -euo pipefail
B=${B:-build/bin/ratekv}
A=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODELS=${MODELS:-gemma3 qwen05}
TOKENS=${TOKENS:-8192} GROUP=${GROUP:-8} CENTROIDS=${CENTROIDS:-256} ITERS=${ITERS:-10} KSEEDS=${KSEEDS:-3}
CTX=${CTX:-512} PPL_TOKENS=${PPL_TOKENS:-4096} STRIDE=${STRIDE:-4} SEED=${SEED:-0} OUT=${OUT:-tasq_archs_out}
STAGE=${STAGE:-fit,eval,report} BASELINE=${BASELINE-fp16}
export OMP_WAIT_POLICY=passive
model_path() {
  case "$1" in
    gemma3) echo "$A/models/gemma-3-270m-q4_k_m.gguf" ;;
    qwen05) echo "$A/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" ;;
    qwen15) echo "$A/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" ;;
    smollm2) echo "$A/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    *) echo "tasq_archs.sh: unknown model '$1' (gemma3, qwen05, qwen15, smollm2)" >&2; exit 2 ;;
  esac
}
has() { [[ ",$STAGE," == *",$1,"* ]]; }
for name in $MODELS; do
  M=$(model_path "$name")
  [[ -f $M ]] || { echo "tasq_archs.sh: $M not found (tools/fetch_assets.sh)" >&2; exit 1; }
  D=$OUT/$name
  mkdir -p "$D"
  if has fit; then
    echo "== $name: fit tasq + cq + no-normalization, $KSEEDS k-means seeds (load $(cut -d' ' -f1-3 /proc/loadavg))"
    /usr/bin/time -f "%e s wall, %U s user, %M KB max RSS" -o "$D/fit.time" \
      "$B" plan --method tasq --fisher --also cq no-normalization --kmeans-seeds "$KSEEDS" -m "$M" \
      -f "$A/text/calib.txt" --tokens "$TOKENS" --ctx "$CTX" --group "$GROUP" --centroids "$CENTROIDS" \
      --kmeans-iters "$ITERS" --seed "$SEED" --vquantizer fp16 --json --force -o "$D/tasq.json" > "$D/fit.json"
  fi
  if has eval; then
    plans=()
    for b in $BASELINE; do plans+=(--baseline "$b"); done
    for v in "" .cq .no-normalization; do
      for ((k = 0; k < KSEEDS; ++k)); do
        if ((KSEEDS > 1)); then plans+=(--plan "$D/tasq$v.s$k.json"); else plans+=(--plan "$D/tasq$v.json"); fi
      done
    done
    echo "== $name: eval (load $(cut -d' ' -f1-3 /proc/loadavg))"
    /usr/bin/time -f "%e s wall, %U s user, %M KB max RSS" -o "$D/eval.time" \
      "$B" eval -m "$M" -f "$A/text/eval.txt" --tokens "$PPL_TOKENS" --ctx "$CTX" "${plans[@]}" \
      --seeds 1 --query-stride "$STRIDE" --no-ppl-kv --json "$D/eval.json" --force > "$D/eval.txt"
    cat "$D/eval.txt"
  fi
done
if has report && [[ -n ${RESULTS:-} ]]; then
  python3 "$HERE/tasq_archs_report.py" "$OUT" "$RESULTS" \
    --config "TOKENS=$TOKENS GROUP=$GROUP CENTROIDS=$CENTROIDS ITERS=$ITERS KSEEDS=$KSEEDS CTX=$CTX PPL_TOKENS=$PPL_TOKENS STRIDE=$STRIDE SEED=$SEED BASELINE='$BASELINE' MODELS='$MODELS'"
fi
