#!/usr/bin/env bash
# NIAH grid on SmolLM2-135M for bench/results/niah_smollm2.json (ratekv niah):
# fp16, then each plan with the packed cache, one process per grid (each grid
# is complete or absent), merged into one report + heatmap PNG.
#   tools/run_niah_smollm2.sh BUILD_DIR OUT_DIR CTX TRIALS PLAN...
# MERGE_ONLY=1 skips the runs and only merges/plots the grids in OUT_DIR
# (grids run separately, e.g. concurrently, with the same flags).
set -euo pipefail
build=$1 out=$2 ctx=$3 trials=$4
shift 4
model=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}/models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"
common=(-m "$model" --ctx "$ctx" --depths 11 --trials "$trials")
if [[ -z "${MERGE_ONLY:-}" ]]; then
  "$build/bin/ratekv" niah "${common[@]}" --json "$out/grid_fp16.json" --force
  i=0
  for plan in "$@"; do
    i=$((i + 1))
    "$build/bin/ratekv" niah "${common[@]}" --no-fp16 --cache packed --plan "$plan" --json "$out/grid_$i.json" --force
  done
fi
python3 - "$out" "$ctx" "$trials" "$@" <<'PY'
import glob, json, sys
out, ctx, trials, plans = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
files = [f"{out}/grid_fp16.json"] + [f"{out}/grid_{i + 1}.json" for i in range(len(plans))]
rep = None
for f in files:
    try:
        r = json.load(open(f))
    except FileNotFoundError:
        continue
    if rep is None:
        rep = r
    else:
        rep["grids"] += r["grids"]
rep["command"] = ("tools/run_niah_smollm2.sh BUILD OUT " + ctx + " " + trials + " " + " ".join(plans))
json.dump(rep, open(f"{out}/niah_smollm2.json", "w"), indent=1)
PY
python3 "$(dirname "$0")/plot_niah.py" "$out/niah_smollm2.json" "$out/niah_smollm2.png"
