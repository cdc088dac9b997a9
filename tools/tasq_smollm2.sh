#!/usr/bin/env bash
# TaSQ vs CQ vs TQ-MSE on SmolLM2-135M (issue 6; docs/design.md §5, §9).
# Fits TaSQ and its ablations from ONE capture of the calibration text (ratekv
# plan --method tasq --also <ablations> --kmeans-seeds N), the CQ baseline (plain
# k-means, no Fisher, its own capture), the TQ-MSE 1/2-bit key baselines, then
# evaluates them with `ratekv eval` on eval.txt and writes
# bench/results/tasq_smollm2.{json,md} + tasq_smollm2_nmse.png.
# Values stay fp16 in every plan (K-only comparison).
#
# Stages (STAGE, comma-separated; default all = fit,fit_cq,baselines,eval_base,eval_cq,eval_tasq,eval_abl,report):
#   fit        ratekv plan --method tasq ... (OUT/tasq*.json, fit.json, fit.time)
#   fit_cq     ratekv plan --method cq ... (OUT/cq*.json, fit_cq.json, fit_cq.time)
#   baselines  TQ-MSE 1- and 2-bit key plans (OUT/tq-mse-k{1,2}.json)
#   eval_base, eval_cq, eval_tasq, eval_abl   per set of plans: eval at --ctx LONG_CTX (default
#              2048, past the CTX-token calibration windows) over LONG_TOKENS, no
#              perplexity: RoPE-logit MAE, attention KL, attention-logit NMSE by query
#              position (OUT/eval_long.<set>.json); then K-only perplexity at --ctx CTX
#              over PPL_TOKENS (OUT/eval_ppl.<set>.json): every k-means seed of TaSQ and
#              CQ, TQ-MSE 1/2 bits (SEEDS rotation seeds), fp16; ablations with ABL_PPL=1
#   report     tools/tasq_report.py OUT RESULTS
#
#   B=build/bin/ratekv bash tools/tasq_smollm2.sh
# Knobs (env): TOKENS (40960), GROUP (8), CENTROIDS (1024), SEEDS (3),
# (the issue's configuration; on the shared 2-core machine its k-means alone
# measured ≈ 1 CPU-hour per plan, see bench/results/tasq_smollm2.md for what was run)
# ITERS (20), ABL_SEEDS (1: k-means seeds of the ablations), CTX (512: calibration
# and perplexity windows), FISHER (1: --fisher and a no-fisher ablation),
# LONG_CTX (2048), LONG_TOKENS (4096), LONG_STRIDE (1: query stride of the long eval),
# PPL_TOKENS (4096), ABL_PPL (0), OUT (tasq_out), RESULTS (bench/results/tasq_smollm2).
set -euo pipefail
B=${B:-build/bin/ratekv}
A=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
M=$A/models/SmolLM2-135M-Instruct.Q4_1.gguf
T=$A/text
TOKENS=${TOKENS:-40960} GROUP=${GROUP:-8} CENTROIDS=${CENTROIDS:-1024} SEEDS=${SEEDS:-3} ITERS=${ITERS:-20}
ABL_SEEDS=${ABL_SEEDS:-1} CTX=${CTX:-512} FISHER=${FISHER:-1}
LONG_CTX=${LONG_CTX:-2048} LONG_TOKENS=${LONG_TOKENS:-4096} LONG_STRIDE=${LONG_STRIDE:-1}
PPL_TOKENS=${PPL_TOKENS:-4096} ABL_PPL=${ABL_PPL:-0}
OUT=${OUT:-tasq_out} RESULTS=${RESULTS:-bench/results/tasq_smollm2}
STAGE=${STAGE:-all}
[[ $STAGE == all ]] && STAGE=fit,fit_cq,baselines,eval_base,eval_cq,eval_tasq,eval_abl,report
has() { [[ ",$STAGE," == *",$1,"* ]]; }
export OMP_WAIT_POLICY=passive
mkdir -p "$OUT"
load() { cut -d' ' -f1-3 /proc/loadavg; }
s_suffix() { [[ $1 -gt 1 ]] && echo ".s$2" || echo ""; }

if has fit; then
  also=no-weighting,no-normalization,no-grouping
  fisher=()
  if [[ $FISHER == 1 ]]; then fisher=(--fisher); also=$also,no-fisher; fi
  echo "== fit (load: $(load))"
  echo "load before $(load)" > "$OUT/fit.load"
  /usr/bin/time -v -o "$OUT/fit.time" "$B" plan --method tasq -m "$M" -f "$T/calib.txt" --tokens "$TOKENS" --ctx "$CTX" \
    --group "$GROUP" --centroids "$CENTROIDS" --kmeans-iters "$ITERS" --kmeans-seeds "$SEEDS" --also-kmeans-seeds "$ABL_SEEDS" \
    --vquantizer fp16 "${fisher[@]}" --also "$also" -o "$OUT/tasq.json" --json --force > "$OUT/fit.json"
  echo "load after $(load)" >> "$OUT/fit.load"
fi

if has fit_cq; then
  echo "== CQ fit (load: $(load))"
  /usr/bin/time -v -o "$OUT/fit_cq.time" "$B" plan --method cq -m "$M" -f "$T/calib.txt" --tokens "$TOKENS" --ctx "$CTX" \
    --group "$GROUP" --centroids "$CENTROIDS" --kmeans-iters "$ITERS" --kmeans-seeds "$SEEDS" --vquantizer fp16 \
    -o "$OUT/cq.json" --json --force > "$OUT/fit_cq.json"
fi

if has baselines; then
  echo "== TQ-MSE baselines"
  "$B" calibrate -m "$M" -f "$T/calib.txt" --tokens 512 -o "$OUT/calib.safetensors" --force
  for b in 1 2; do
    "$B" plan --method uniform --quantizer tq-mse --vquantizer fp16 --budget-unit code --kbits $b --vbits 16 \
      --stats "$OUT/calib.safetensors" -o "$OUT/tq-mse-k$b.json" --force -q
  done
fi

# One eval set = one `ratekv eval` at LONG_CTX (every plan of the set; MAE, KL,
# NMSE by position; no perplexity) + one at CTX (K-only perplexity), so a set
# can run as soon as its plans exist; the report merges the sets.
eval_set() {  # name, then --plan/--baseline arguments (long eval), then "--", then those of the ppl eval
  local set=$1; shift
  local long=() ppl=()
  while [[ $# -gt 0 && $1 != -- ]]; do long+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  ppl=("$@")
  echo "== eval $set at ctx $LONG_CTX: logit MAE / attention KL / NMSE by position (load: $(load))"
  /usr/bin/time -v -o "$OUT/eval_long.$set.time" "$B" eval -m "$M" -f "$T/eval.txt" --tokens "$LONG_TOKENS" \
    --ctx "$LONG_CTX" --seeds "$SEEDS" --query-stride "$LONG_STRIDE" "${long[@]}" --no-ppl \
    --json "$OUT/eval_long.$set.json" --force > "$OUT/eval_long.$set.txt"
  if [[ ${#ppl[@]} -gt 0 ]]; then
    echo "== eval $set at ctx $CTX: K-only perplexity (load: $(load))"
    /usr/bin/time -v -o "$OUT/eval_ppl.$set.time" "$B" eval -m "$M" -f "$T/eval.txt" --tokens "$PPL_TOKENS" --ctx "$CTX" \
      --seeds "$SEEDS" "${ppl[@]}" --no-ppl-kv --json "$OUT/eval_ppl.$set.json" --force > "$OUT/eval_ppl.$set.txt"
  fi
}

if has eval_base; then  # TQ-MSE 1/2 bits (SEEDS rotation seeds) and fp16
  base=(--plan "$OUT/tq-mse-k1.json" --plan "$OUT/tq-mse-k2.json" --baseline fp16)
  eval_set base "${base[@]}" -- "${base[@]}"
fi
if has eval_cq; then  # every k-means seed of CQ
  cq=()
  for k in $(seq 0 $((SEEDS - 1))); do cq+=(--plan "$OUT/cq$(s_suffix "$SEEDS" "$k").json"); done
  eval_set cq "${cq[@]}" -- "${cq[@]}"
fi
if has eval_tasq; then  # every k-means seed of TaSQ
  tq=()
  for k in $(seq 0 $((SEEDS - 1))); do tq+=(--plan "$OUT/tasq$(s_suffix "$SEEDS" "$k").json"); done
  eval_set tasq "${tq[@]}" -- "${tq[@]}"
fi
if has eval_abl; then  # the ablations (perplexity only with ABL_PPL=1)
  abl=()
  for f in "$OUT"/tasq.no-*.json; do abl+=(--plan "$f"); done
  if [[ $ABL_PPL == 1 ]]; then eval_set abl "${abl[@]}" -- "${abl[@]}"; else eval_set abl "${abl[@]}"; fi
fi

if has report; then
  python3 tools/tasq_report.py "$OUT" "$RESULTS"
fi
