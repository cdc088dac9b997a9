#!/usr/bin/env bash
# Same-run A/B of two bench_cuda_decode builds (issue 19): a baseline tree built beside the working
# tree (e.g. `git archive <commit>` unpacked under .devtree/base, carried, built with
# BUILD=/tmp/base-build), alternated ROUNDS times per argument list so drift hits both alike.
# Usage: BASE=<bench_cuda_decode> NEW=<bench_cuda_decode> ARGS="args;args" ROUNDS=2 OUT=... ab_decode.sh
# Prints per (model, B, T, cache): median-of-reps ms of each round, base vs new, the ratio of the
# best of each side, and the new side's share of the read ceiling; JSON per run under $OUT/ab/
# (tools/device/ab_collect.py turns that folder into one bench/results JSON).
set -uo pipefail
set -f  # the argument lists are split on spaces, never glob-expanded
: "${BASE:?BASE: the baseline bench_cuda_decode}" "${NEW:?NEW: the bench_cuda_decode under test}"
O=${OUT:-/tmp/out}/ab; mkdir -p "$O"
rm -f "$O"/*.json "$O"/*.log  # the summary reads every JSON here: none from an earlier invocation
IFS=';' read -ra RUNS <<< "${ARGS:?ARGS: ';'-separated bench_cuda_decode argument lists}"
i=0
for args in "${RUNS[@]}"; do
  i=$((i + 1))
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for side in base new; do
      bin=$BASE; [ $side = new ] && bin=$NEW
      timeout 150 "$bin" --no-check --no-prefill $args --out "$O/${side}_${i}_$r.json" > "$O/${side}_${i}_$r.log" 2>&1 \
        || echo "$side run $i round $r: exit $? ($(tail -1 "$O/${side}_${i}_$r.log"))"
    done
  done
done
# The rows as tools/device/ab_collect.py gathers them (the share of the read ceiling from the run of the
# best new round; files cut by a timeout and one-sided rows named on stderr).
python3 - "$O" "$(dirname "$0")" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
from ab_collect import rows_of
print(f"{'model':13s} {'B':>3s} {'T':>7s} {'cache':14s} {'base ms':>18s} {'new ms':>18s} {'new/base':>8s} {'% read':>6s}")
for r in rows_of(sys.argv[1]):
    print(f"{r['model']:13s} {r['B']:3d} {r['T']:7d} {r['cache']:14s} {' '.join('%.4f' % x for x in r['base_ms']):>18s} "
          f"{' '.join('%.4f' % x for x in r['new_ms']):>18s} {r['new_over_base']:8.3f} {100 * r['new_frac_read_ceiling']:5.0f}%")
PY
