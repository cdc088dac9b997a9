#!/usr/bin/env bash
# The main job (README's first command): install, fetch, build, then on
# SmolLM2-135M-Instruct with the packaged texts
#   1. calibrate on 2048 tokens of text/calib.txt           (ratekv calibrate)
#   2. plan uniform TQ-MSE at K/V 2.25 and 3.25 stored bits per element (2 and 3
#      code bits + one fp16 norm per head), then Block-GTQ at the uniform plan's
#      stored bits (equal stored bytes)                        (ratekv plan)
#   3. evaluate them and the fp16 / q8_0 / q4_0 / KIVI baselines on 2048
#      tokens of text/eval.txt: per-layer RoPE-logit MAE and attention KL
#      (K-only), perplexity K-only and K+V (windows of 512)   (ratekv eval)
#   4. write out/main_job/report.{md,json,png}
# The K-only rows of the K2V2 / K3V3 plans are the K2 / K3 (V fp) results.
#
# usage: bash tools/main_job.sh [--model NAME] [--seeds N] [--force] [--out DIR]
#   --model NAME  smollm2 (default), gemma3, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b
#               (the 1.5B needs tools/fetch_assets.sh --with-qwen-1.5b); the same
#               steps, and the llama.cpp rows from tests/fixtures/<NAME>/perplexity.json
#   --seeds N   rotation run seeds (default 1, env RATEKV_SEEDS); 3 for mean ± spread
#   --force     overwrite an existing report in the output folder; without it an
#               existing out/main_job is left alone and the run goes to out/main_job-<UTC time>
#   --out DIR   output folder (default out/main_job)
# Env: RATEKV_BUILD_DIR (default build), RATEKV_JOBS (default nproc), RATEKV_ASSETS,
#   RATEKV_CMAKE_ARGS (extra configure flags, e.g. -DRATEKV_CUDA=OFF to skip the CUDA kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${RATEKV_SEEDS:-1}
MODEL_NAME=smollm2
FORCE=0
OUT=out/main_job
die() { echo "main_job.sh: $*" >&2; exit 2; }
# An option's value, or a clean error when it is missing ("unbound variable" from set -u before).
value() { [[ $# -ge 2 && $2 != --* ]] || die "$1 needs a value (see --help)"; }
while (($#)); do
  case "$1" in
    --seeds) value "$@"; SEEDS=$2; shift 2 ;;
    --model) value "$@"; MODEL_NAME=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --out) value "$@"; OUT=$2; shift 2 ;;
    -h|--help) sed -n "2,/^set -euo/p" "$0" | grep "^#" | cut -c3-; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
# Every option is checked before the install, the build and the run (--seeds abc was refused by ratekv eval
# only after calibrating and planning).
# At most 4 digits before any arithmetic: bash wraps 10#18446744073709551617 to 1.
[[ $SEEDS =~ ^[0-9]{1,4}$ ]] && ((10#$SEEDS >= 1 && 10#$SEEDS <= 1000)) ||
  die "--seeds '$SEEDS' (or RATEKV_SEEDS): expected an integer in 1..1000"
SEEDS=$((10#$SEEDS))
[[ -n $OUT ]] || die "--out '': expected a folder"
A=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
case "$MODEL_NAME" in
  smollm2) MODEL=$A/models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
  gemma3) MODEL=$A/models/gemma-3-270m-q4_k_m.gguf ;;
  qwen2.5-coder-0.5b) MODEL=$A/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
  qwen2.5-coder-1.5b) MODEL=$A/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
  *) die "--model '$MODEL_NAME': expected smollm2, gemma3, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b" ;;
esac
if [[ -e "$OUT/report.json" && $FORCE == 0 ]]; then
  OUT="$OUT-$(date -u +%Y%m%d-%H%M%S)"
  echo "main_job: a previous report exists; writing this run to $OUT (pass --force to overwrite)"
fi
[[ ! -e $OUT || -d $OUT ]] || die "--out '$OUT': exists and is not a folder"
mkdir -p "$OUT" 2>/dev/null || die "--out '$OUT': cannot create the folder"
FORCE_FLAG=(); ((FORCE)) && FORCE_FLAG=(--force)

t_start=$(date +%s)
step() { echo "== main_job [$(( $(date +%s) - t_start )) s] $*"; }

step "dependencies"
bash tools/install_deps.sh
step "assets"
bash tools/fetch_assets.sh >/dev/null
[[ -f $MODEL ]] || { echo "main_job.sh: --model $MODEL_NAME: $MODEL is missing (tools/fetch_assets.sh fetches it)" >&2; exit 2; }
CALIB=$A/text/calib.txt
EVAL=$A/text/eval.txt
B=${RATEKV_BUILD_DIR:-build}
J=${RATEKV_JOBS:-$(nproc)}
step "build ($B, Release, -j$J)"
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release ${RATEKV_CMAKE_ARGS:-} >/dev/null
cmake --build "$B" -j "$J" --target ratekv_cli
R=$B/bin/ratekv
export RATEKV_PROGRESS=1
# OpenMP threads that spin while waiting make every parallel region crawl when
# the 2 cores are shared (measured: 58 s vs 6.8 s for the same 256-token pass
# under load); passive waiting costs nothing measurable on an idle machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

t_job=$(date +%s)
step "calibrate: 2048 tokens of calib.txt"
$R calibrate -m "$MODEL" -f "$CALIB" --tokens 2048 --ctx 512 -o "$OUT/calib_stats.safetensors" --force

PLANS=()
# Equal stored bits: the uniform plan is made first at the nominal budget; its
# stored bits (Plan::achieved, what the cache holds per element: at head_dim 64
# 2.25 / 3.25, at head_dim 256 2.0625 / 3.0625, since uniform code widths are
# whole bits) are the Block-GTQ plan's budget, so both plans store the same bytes.
for bits in 2.25 3.25; do
  tag=$([[ $bits == 2.25 ]] && echo K2V2 || echo K3V3)
  step "plan uniform-$tag: --method uniform --kbits $bits --vbits $bits (stored bits per element)"
  $R plan --method uniform --stats "$OUT/calib_stats.safetensors" --kbits "$bits" --vbits "$bits" \
    -o "$OUT/uniform-$tag.plan.json" --force >"$OUT/uniform-$tag.summary.txt"
  tail -n 1 "$OUT/uniform-$tag.summary.txt"
  read -r kb vb < <(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["achieved"]; print(a["k"], a["v"])' \
    "$OUT/uniform-$tag.plan.json")
  step "plan gtq-$tag: --method block-gtq --kbits $kb --vbits $vb (the uniform plan's stored bits)"
  $R plan --method block-gtq --stats "$OUT/calib_stats.safetensors" --kbits "$kb" --vbits "$vb" \
    -o "$OUT/gtq-$tag.plan.json" --force >"$OUT/gtq-$tag.summary.txt"
  tail -n 1 "$OUT/gtq-$tag.summary.txt"
  PLANS+=(--plan "$OUT/gtq-$tag.plan.json" --plan "$OUT/uniform-$tag.plan.json")
done

step "eval: 2048 tokens of eval.txt, windows of 512, $SEEDS seed(s)"
$R eval -m "$MODEL" -f "$EVAL" --tokens 2048 --ctx 512 --seeds "$SEEDS" "${PLANS[@]}" \
  --baseline fp16 --baseline q8_0 --baseline q4_0 --baseline kivi2 \
  --json "$OUT/report.json" "${FORCE_FLAG[@]}" >"$OUT/eval_table.txt"
t_done=$(date +%s)
cat "$OUT/eval_table.txt"

step "report"
python3 tools/plot_eval.py "$OUT/report.json" "$OUT/report.png"
python3 tools/main_job_report.py "$OUT/report.json" "tests/fixtures/$MODEL_NAME/perplexity.json" \
  "$(( t_done - t_job ))" >"$OUT/report.md"
step "done: calibrate+plan+eval took $(( t_done - t_job )) s; wrote $OUT/report.md, $OUT/report.json, $OUT/report.png"
