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
python3 - "$O" <<'PY'
import glob, json, os, sys
from collections import defaultdict
ms = defaultdict(lambda: {"base": [], "new": []}); ceil = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    side = os.path.basename(f).split("_")[0]
    try:
        d = json.load(open(f))
    except (OSError, ValueError) as e:  # a run cut by its timeout: skipped, said
        print(f"skipped {f}: {e}")
        continue
    d = d.get("ratekv_cuda", d)
    for r in d["rows"]:
        k = (r["model"], r["B"], r["T"], r["cache"])
        ms[k][side].append(r["ms"]); ceil[k] = (r["cache_bytes"], d["read_ceiling_GBps"])
print(f"{'model':13s} {'B':>3s} {'T':>7s} {'cache':14s} {'base ms':>18s} {'new ms':>18s} {'new/base':>8s} {'% read':>6s}")
for k in sorted(ms):
    b, n = ms[k]["base"], ms[k]["new"]
    if not b or not n: continue
    by, gb = ceil[k]
    pct = by / (min(n) * 1e-3) / 1e9 / gb * 100
    print(f"{k[0]:13s} {k[1]:3d} {k[2]:7d} {k[3]:14s} {' '.join('%.4f' % x for x in b):>18s} "
          f"{' '.join('%.4f' % x for x in n):>18s} {min(n) / min(b):8.3f} {pct:5.0f}%")
PY
