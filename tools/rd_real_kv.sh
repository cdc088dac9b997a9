#!/usr/bin/env bash
# Measured rate–distortion curves on real SmolLM2 K/V (issue 3): captures
# post-RoPE K and V of layers 0, 15, 29 over 2048 calibration tokens with
# `ratekv capture`, runs `ratekv rd` per layer and side, and merges the fits
# into bench/results/rd_real_kv_smollm2.json.
# Usage: tools/rd_real_kv.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}/bin/ratekv
A=${RATEKV_ASSETS:-$HOME/.cache/ratekv/assets}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$B" capture -m "$A/models/SmolLM2-135M-Instruct.Q4_1.gguf" -f "$A/text/calib.txt" --tokens 2048 \
  --layers 0,15,29 -o "$W/kv"
for l in 0 15 29; do
  "$B" rd --data "$W/kv/k_layer$l.npy" --n 0 --side key --bits 1,2,3,4,5 \
    --quantizers tq_mse,tq_prod,kivi_key,quarot --json "$W/k$l.json"
  "$B" rd --data "$W/kv/v_layer$l.npy" --n 0 --side value --bits 1,2,3,4,5 \
    --quantizers tq_mse,tq_prod,kivi_value,quarot --json "$W/v$l.json"
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
out = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf (K/V from the fp32-dequantized model)",
       "text": "calib.txt, first 2048 tokens, chunks of 512 from an empty cache",
       "vectors": "one row = one token of one KV head (head_dim 64); keys post-RoPE",
       "command": "tools/rd_real_kv.sh", "runs": []}
for side in "kv":
    for l in (0, 15, 29):
        d = json.load(open(f"{w}/{side}{l}.json"))
        out["runs"].append({"layer": l, "side": d["side"], "n_vectors": d["n_vectors"],
                            "fits": d["fits"], "points": [{k: p[k] for k in ("quantizer", "bits", "effective_bits", "distortion")} for p in d["points"]]})
json.dump(out, open("bench/results/rd_real_kv_smollm2.json", "w"), indent=1)
print(f"{'layer':>5} {'side':>5} {'quantizer':>10} {'alpha':>8} {'beta':>6} {'bits':>5}")
for r in out["runs"]:
    for f in r["fits"]:
        print(f"{r['layer']:>5} {r['side']:>5} {f['quantizer']:>10} {f['alpha']:8.3f} {f['beta']:6.2f} {int(f['bits_min'])}..{int(f['bits_max'])}")
PY
