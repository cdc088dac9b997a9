#!/usr/bin/env bash
# RateQuant on SmolLM2-135M (issue 5, "What it must show"):
#   1. ratekv calibrate on 16 × 512 tokens of text/calib.txt: block energies,
#      gradient sensitivity (--sensitivity, when the build has it) and the
#      distortion curves of kivi / quarot / tq-mse / block-gtq at 1..5 code bits;
#   2. plans at average code budgets 2.5 and 4.0 bits per element (code unit,
#      the paper's convention; effective bits incl. metadata are in every row):
#        uniform K⌈b⌉V⌊b⌋ and K⌊b⌋V⌈b⌉ (the better one is the baseline),
#        RateQuant with the quantizer's own curves (gradient sensitivity),
#        RateQuant with mismatched curves (--curves-from),
#        RateQuant with the activation-magnitude proxy,
#        at 2.5: RateQuant with widths ≥ 2 (--bmin 2; the 1-bit cliff of the integer quantizers),
#        for kivi, quarot, tq-mse; for Block-GTQ: Block-GTQ alone (uniform head
#        budgets) and the composed ratequant+block-gtq;
#   3. perplexity (K+V quantized, fake-quant cache) on the first WINDOWS windows
#      of 512 tokens of text/eval.txt, plan seeds 0..SEEDS-1 (rotations; kivi is
#      deterministic and runs once);
#   4. tools/ratequant_report.py → bench/results/ratequant_smollm2.{json,md} + _*.png.
# Every step skips outputs that exist, so an interrupted run resumes; a second instance started after
# the plans exist works through the same perplexity list in parallel (per-output lock directories).
#
# usage: bash tools/ratequant_smollm2.sh [--out PREFIX] [--work DIR] [--windows N] [--seeds N] [--budgets "2.5 4.0"]
# Env: RATEKV_BUILD_DIR (default build), RATEKV_ASSETS, SENS (grad|activation: the main sensitivity; default
#      grad when the statistics have it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/results/ratequant_smollm2   # results prefix: OUT.json, OUT.md, OUT_*.png
WORK=out/ratequant_smollm2            # statistics, plans, perplexity JSONs (not committed)
WINDOWS=2
SEEDS=3
BUDGETS="2.5 4.0"
while (($#)); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --windows) WINDOWS=$2; shift 2 ;;
    --seeds) SEEDS=$2; shift 2 ;;
    --budgets) BUDGETS=$2; shift 2 ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "ratequant_smollm2.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
A=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
MODEL=$A/models/SmolLM2-135M-Instruct.Q4_1.gguf
CALIB=$A/text/calib.txt
EVAL=$A/text/eval.txt
R=${RATEKV_BUILD_DIR:-build}/bin/ratekv
export OMP_WAIT_POLICY=passive
W=$WORK
mkdir -p "$W/plans" "$W/ppl"
t0=$(date +%s)
step() { echo "== ratequant [$(( $(date +%s) - t0 )) s] $*"; }

STATS=$W/stats.safetensors
if [[ ! -e $STATS ]]; then
  SENS_FLAG=()
  if "$R" calibrate --help 2>&1 | grep -q -- --sensitivity; then SENS_FLAG=(--sensitivity --sens-seqs 16 --sens-len 512); fi
  step "calibrate (16 × 512 tokens ${SENS_FLAG[*]:-(no gradient sensitivity in this build)})"
  /usr/bin/time -v "$R" calibrate -m "$MODEL" -f "$CALIB" --tokens 8192 --ctx 512 "${SENS_FLAG[@]}" \
    --curves kivi,quarot,tq-mse,block-gtq --curve-bits 1,2,3,4,5 --curves-json "$W/curves.json" \
    -o "$STATS" 2> "$W/calibrate.log" | tee "$W/curves.txt"
  grep -E "Elapsed|User time|System time|Maximum resident" "$W/calibrate.log" || true
fi
if [[ -z ${SENS:-} ]]; then
  if "$R" plan --method ratequant --quantizer tq-mse --bits 3 --budget-unit code --sensitivity grad \
       --stats "$STATS" -o "$W/probe.json" --force -q 2>/dev/null; then SENS=grad; else SENS=activation; fi
  rm -f "$W/probe.json"
fi
ALT=activation; [[ $SENS == activation ]] && ALT=
step "main sensitivity: $SENS${ALT:+ (proxy rows: $ALT)}"

# plan NAME SEED ARGS... : writes $W/plans/NAME.s$SEED.json and its --json summary.
plan() {
  local name=$1 seed=$2; shift 2
  local f=$W/plans/$name.s$seed.json
  [[ -e $f ]] && return 0
  # kivi has no rotation: ratekv plan refuses --seed there (one seed, 0, as the default)
  local seed_arg=(--seed "$seed"); [[ " $* " == *" --quantizer kivi "* ]] && seed_arg=()
  "$R" plan --stats "$STATS" "${seed_arg[@]}" --budget-unit code "$@" -o "$f.tmp" --json > "$W/plans/$name.s$seed.summary.json"
  mv "$f.tmp" "$f"
}
ROWS=()  # name|kind|seeds
add() { ROWS+=("$1|$2"); }
for b in $BUDGETS; do
  lo=${b%.*}; hi=$lo; [[ $b == *.5 ]] && hi=$((lo + 1))
  for q in kivi quarot tq-mse; do
    mis=tq-mse; [[ $q == tq-mse ]] && mis=kivi
    ns=$SEEDS; [[ $q == kivi ]] && ns=1
    for ((s = 0; s < ns; s++)); do
      if [[ $lo == "$hi" ]]; then
        plan "b$b-$q-uniform-K${lo}V${lo}" $s --method uniform --quantizer $q --kbits $lo --vbits $lo
      else
        plan "b$b-$q-uniform-K${hi}V${lo}" $s --method uniform --quantizer $q --kbits $hi --vbits $lo
        plan "b$b-$q-uniform-K${lo}V${hi}" $s --method uniform --quantizer $q --kbits $lo --vbits $hi
      fi
      plan "b$b-$q-ratequant-$SENS" $s --method ratequant --quantizer $q --bits $b --sensitivity $SENS
      plan "b$b-$q-ratequant-$SENS-curves-$mis" $s --method ratequant --quantizer $q --bits $b --sensitivity $SENS --curves-from $mis
      [[ -n $ALT ]] && plan "b$b-$q-ratequant-$ALT" $s --method ratequant --quantizer $q --bits $b --sensitivity $ALT
      # The integer quantizers lose ×11–12 from 2 to 1 bit (the single β says ×5.8): the same allocation with b ≥ 2.
      [[ $b == 2.5 ]] && plan "b$b-$q-ratequant-$SENS-bmin2" $s --method ratequant --quantizer $q --bits $b --sensitivity $SENS --bmin 2
    done
  done
  for ((s = 0; s < SEEDS; s++)); do
    if [[ $lo == "$hi" ]]; then
      plan "b$b-block-gtq-alone-K${lo}V${lo}" $s --method block-gtq --kbits $lo --vbits $lo --bmin 0 --bmax 8
    else
      plan "b$b-block-gtq-alone-K${hi}V${lo}" $s --method block-gtq --kbits $hi --vbits $lo --bmin 0 --bmax 8
      plan "b$b-block-gtq-alone-K${lo}V${hi}" $s --method block-gtq --kbits $lo --vbits $hi --bmin 0 --bmax 8
    fi
    plan "b$b-block-gtq-ratequant-$SENS" $s --method ratequant+block-gtq --bits $b --sensitivity $SENS
    [[ -n $ALT ]] && plan "b$b-block-gtq-ratequant-$ALT" $s --method ratequant+block-gtq --bits $b --sensitivity $ALT
  done
done
step "$(ls "$W"/plans/*.s?.json | wc -l) plans"

ppl() {  # ppl PLANFILE|fp32
  local p=$1 name out
  if [[ $p == fp32 ]]; then name=fp32; else name=$(basename "$p" .json); fi
  out=$W/ppl/$name.json
  [[ -e $out ]] && return 0
  mkdir "$out.lock" 2>/dev/null || return 0  # another worker has it (a killed run leaves the .lock: remove it)
  if [[ $p == fp32 ]]; then
    "$R" perplexity -m "$MODEL" -f "$EVAL" -c 512 --chunks "$WINDOWS" --json -o "$out.tmp" 2>/dev/null
  else
    "$R" perplexity -m "$MODEL" -f "$EVAL" -c 512 --chunks "$WINDOWS" --cache fake --plan "$p" --json -o "$out.tmp" 2>/dev/null
  fi
  mv "$out.tmp" "$out"
  rmdir "$out.lock"
  echo "  $name: $(python3 -c "import json,sys; print(round(json.load(open('$out'))['ppl'],4))") [$(( $(date +%s) - t0 )) s]"
}
step "perplexity, $WINDOWS windows of 512 (K+V quantized)"
ppl fp32
# Order (an interrupted run leaves a usable grid): seed 0 of the main rows, seed 0 of the activation-proxy
# rows, then the other seeds of the main rows, then of the proxy rows.
main_rows() { ls "$W"/plans/*.s$1.json | grep -v -- '-activation\.s'; }
proxy_rows() { if [[ -n $ALT ]]; then ls "$W"/plans/*.s$1.json | grep -- '-activation\.s' || true; fi; }
for p in $(main_rows 0) $(proxy_rows 0); do ppl "$p"; done
for s in $(seq 1 $((SEEDS - 1))); do for p in $(main_rows $s); do ppl "$p"; done; done
for s in $(seq 1 $((SEEDS - 1))); do for p in $(proxy_rows $s); do ppl "$p"; done; done
step "report"
python3 tools/ratequant_report.py "$W" "$OUT" --windows "$WINDOWS" --sensitivity "$SENS"
step "done"
