#!/usr/bin/env bash
# TaSQ vs CQ vs TQ-MSE on SmolLM2-135M (issue 6; DESIGN.md §5, §9).
# Fits every vq plan from ONE capture of the calibration text (ratekv plan
# --method tasq --also ... --kmeans-seeds N), fits the TQ-MSE 1/2-bit key
# baselines, then evaluates all of them with `ratekv eval` on eval.txt and
# writes bench/results/tasq_smollm2.{json,md}. STAGE=eval skips the fit and
# baselines (reuses OUT). Values stay fp16 in every plan
# (K-only comparison; the K+V perplexity column then differs only by fp16
# value rounding).
#
#   B=build/bin/ratekv bash tools/tasq_smollm2.sh
# Knobs (env): TOKENS (40960), GROUP (8), CENTROIDS (1024), SEEDS (3),
# ITERS (20), ABL_SEEDS (1: k-means seeds of the ablations), EVAL_TOKENS (2048: logit MAE/KL of
# every plan), PPL_TOKENS (2048: perplexity of TaSQ/CQ seed 0 and TQ-MSE), CTX (512), FISHER (1: add --fisher and a
# no-fisher ablation), OUT (tasq_out), RESULTS (bench/results/tasq_smollm2).
set -euo pipefail
B=${B:-build/bin/ratekv}
A=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
M=$A/models/SmolLM2-135M-Instruct.Q4_1.gguf
T=$A/text
TOKENS=${TOKENS:-40960} GROUP=${GROUP:-8} CENTROIDS=${CENTROIDS:-1024} SEEDS=${SEEDS:-3} ITERS=${ITERS:-20}
EVAL_TOKENS=${EVAL_TOKENS:-2048} PPL_TOKENS=${PPL_TOKENS:-2048} CTX=${CTX:-512} FISHER=${FISHER:-1}
OUT=${OUT:-tasq_out} RESULTS=${RESULTS:-bench/results/tasq_smollm2}
export OMP_WAIT_POLICY=passive
mkdir -p "$OUT"

if [[ ${STAGE:-all} == all ]]; then
also=cq,no-weighting,no-normalization,no-grouping
fisher=()
if [[ $FISHER == 1 ]]; then fisher=(--fisher); also=$also,no-fisher; fi
echo "== fit (load: $(cut -d' ' -f1-3 /proc/loadavg))"
/usr/bin/time -v -o "$OUT/fit.time" "$B" plan --method tasq -m "$M" -f "$T/calib.txt" --tokens "$TOKENS" --ctx "$CTX" \
  --group "$GROUP" --centroids "$CENTROIDS" --kmeans-iters "$ITERS" --kmeans-seeds "$SEEDS" --also-kmeans-seeds "${ABL_SEEDS:-1}" --vquantizer fp16 \
  "${fisher[@]}" --also "$also" -o "$OUT/tasq.json" --json --force > "$OUT/fit.json"
echo "fit: load after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/fit.time"

echo "== TQ-MSE baselines"
"$B" calibrate -m "$M" -f "$T/calib.txt" --tokens 512 -o "$OUT/calib.safetensors" --force
for b in 1 2; do
  "$B" plan --method uniform --quantizer tq-mse --vquantizer fp16 --budget-unit code --kbits $b --vbits 16 \
    --stats "$OUT/calib.safetensors" -o "$OUT/tq-mse-k$b.json" --force -q
done
fi

echo "== eval: logit MAE / attention KL of every plan (one fp32 pass)"
plans=()
for f in "$OUT"/tasq*.json "$OUT"/tq-mse-k*.json; do plans+=(--plan "$f"); done
"$B" eval -m "$M" -f "$T/eval.txt" --tokens "$EVAL_TOKENS" --ctx "$CTX" --seeds "$SEEDS" "${plans[@]}" \
  --baseline fp16 --no-ppl --json "$OUT/eval.json" --force > "$OUT/eval.txt"
echo "== eval: perplexity (K-only, K+V) of TaSQ, CQ (k-means seed 0) and TQ-MSE 1/2 bits (rotation seed 0)"
s0=""; [[ $SEEDS -gt 1 ]] && s0=".s0"
"$B" eval -m "$M" -f "$T/eval.txt" --tokens "$PPL_TOKENS" --ctx "$CTX" --seeds 1 \
  --plan "$OUT/tasq$s0.json" --plan "$OUT/tasq.cq$s0.json" --plan "$OUT/tq-mse-k1.json" --plan "$OUT/tq-mse-k2.json" \
  --json "$OUT/eval_ppl.json" --force > "$OUT/eval_ppl.txt"
python3 tools/tasq_report.py "$OUT" "$RESULTS"
