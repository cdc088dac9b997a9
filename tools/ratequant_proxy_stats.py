#!/usr/bin/env python3
"""Statistics JSON with an activation-proxy sensitivity, for a RateQuant plan before
`ratekv calibrate` writes gradient sensitivities (used for the NIAH RateQuant plan).

usage: ratequant_proxy_stats.py CALIB.safetensors OUT.json

From a `ratekv calibrate` file (docs/calibration_stats.md): block energies copied;
  sensitivity "activation": keys w_k = E||q||^2 / head_dim averaged over the query heads of
      the KV head (variance of the logit error q.dk per unit of per-element key MSE, logit
      scale 1/sqrt(d) folded in), values w_v = 1 (output error per unit value MSE);
  curves "tq-mse": alpha = E||x||^2 / head_dim per component (per-element MSE of TQ-MSE scales
      with the vector energy), beta 3.5 on both sides (measured TQ-MSE fits on SmolLM2 K/V:
      3.50-3.52 over widths 1..5, bench/results/rd_real_kv_smollm2.json; recorded as "bits": RateQuant
      hands out only those widths).
Then: ratekv plan --method ratequant --quantizer tq-mse --bits B --bmax 4 --sensitivity activation
"""
import json
import struct
import sys

import numpy as np
if len(sys.argv) != 3:
    sys.exit(__doc__)
src, dst = sys.argv[1], sys.argv[2]
f = open(src, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
def t(name):
    m = h[name]; a, b = m['data_offsets']
    f.seek(base + a); return np.frombuffer(f.read(b - a), dtype=np.float32).reshape(m['shape'])
meta = json.loads(h['__metadata__']['ratekv'])
qe, ke, vsq = t('q_block_energy'), t('k_block_energy'), t('v_sq')
L, H, d2 = ke.shape; d = 2 * d2
ak = ke.sum(-1) / d; av = vsq.sum(-1) / d
j = {"format": "ratekv-calib-stats", "version": 1, "model": meta["model"], "source": meta["text"]["file"],
     "n_tokens": meta["n_tokens"], "q_block_energy": qe.tolist(), "k_block_energy": ke.tolist(),
     "sensitivity": {"activation": {"k": (qe.sum(-1) / d).tolist(), "v": np.ones((L, H)).tolist()}},
     "curves": {"tq-mse": {"bits": [1, 2, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5, "alpha_k": ak.tolist(), "alpha_v": av.tolist()}}}
json.dump(j, open(dst, 'w'))
print("alpha_k range", ak.min(), ak.max(), "alpha_v range", av.min(), av.max())
