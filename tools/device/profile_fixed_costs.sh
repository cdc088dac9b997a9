#!/usr/bin/env bash
# Where a small decode call's time goes (issue 19 item 2, B = 1): the kernels of one packed decode call
# (query rotation, attention, split-K merge) timed one by one under Nsight Compute (gpu__time_duration,
# caches flushed, clocks as the bench runs them) and, when nsys is on the PATH, the same calls on a
# timeline (start/end of every kernel: the gaps between them). Compare with bench_cuda_decode's
# event-timed ms of the same point.
# Usage (repo root on the GPU machine, after lead_chain.sh build): OUT=... tools/device/profile_fixed_costs.sh
# POINTS: space-separated model:B:T:cache items (default below). Outputs: $OUT/fixed_ncu_<i>.csv (and
# .err), $OUT/fixed_nsys_<i>.txt, $OUT/fixed_bench_<i>.json, and a summary on stdout.
set -uo pipefail
B=${BUILD:-/tmp/ratekv-build}
O=${OUT:-/tmp/out}; mkdir -p "$O"
POINTS=${POINTS:-"llama-3.1-8b:1:4096:K3V3 llama-3.1-8b:1:131072:K3V3 qwen2.5-3b:1:131072:K3V3 llama-3.1-8b:8:131072:K3V3-blockgtq"}
i=0
for p in $POINTS; do
  i=$((i+1)); IFS=: read -r model bsz t cache <<< "$p"
  args="--no-check --no-prefill --reps 3 --only-model $model --only-B $bsz --only-T $t --only-cache $cache"
  echo "== $p"
  timeout 120 ncu --clock-control none --cache-control all --kernel-name regex:'rotate_query|gqa8|splitk_lse|packed_decode|generic_decode' \
    --launch-count 6 --metrics gpu__time_duration.sum --csv --page raw \
    "$B/bench/bench_cuda_decode" $args --out /tmp/fixed_$i.json > "$O/fixed_ncu_$i.csv" 2> "$O/fixed_ncu_$i.err"
  echo "ncu rc $?"
  python3 - "$O/fixed_ncu_$i.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((r for r in rows if "Kernel Name" in r), None)
if hdr is None:
    print("no ncu rows"); sys.exit()
k, d = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum")
for r in rows[rows.index(hdr) + 2:]:
    if len(r) > d: print(f"  {r[k][:60]:60s} {r[d]:>10s} ns")
PY
  if command -v nsys > /dev/null; then
    timeout 120 nsys profile -t cuda -o /tmp/fixed_nsys_$i -f true "$B/bench/bench_cuda_decode" $args \
      --out /tmp/fixed_nsys_$i.json > /dev/null 2>&1
    echo "nsys profile rc $?"
    nsys stats -q --report cuda_gpu_trace --format csv /tmp/fixed_nsys_$i.nsys-rep > "$O/fixed_nsys_$i.txt" 2>&1
    echo "nsys stats rc $?; last calls' kernels (start ns, duration ns, name):"
    python3 - "$O/fixed_nsys_$i.txt" <<'PY'
import csv, re, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and any(re.search("rotate_query|gqa8|splitk_lse", x) for x in r)]
for r in rows[-9:]:
    print("  " + ", ".join(r[:2]) + ", " + r[-1][:80])
PY
  else
    echo "nsys not on the PATH"
  fi
  timeout 60 "$B/bench/bench_cuda_decode" --no-prefill --reps 30 --only-model $model --only-B $bsz --only-T $t \
    --only-cache $cache --out "$O/fixed_bench_$i.json" 2>&1 | grep -E "$cache|ceiling" | head -4
done
