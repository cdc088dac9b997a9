#!/usr/bin/env python3
"""Where the key energy sits, per layer and KV head, from `ratekv calibrate` statistics
(docs/calibration_stats.md): the share of E_t||k_t||^2 that is the pre-RoPE key mean ||mu||^2 (what a
key offset removes, docs/design.md §2.5), the largest single channel's share of ||mu||^2, and the
mean E||k||^2 and E||v||^2 of the layer's KV heads.

  tools/key_mean_share.py STATS.safetensors [--json OUT.json]

Reads k_block_energy (L, H, d/2), k_pre_mean (L, H, d) and v_sq (L, H, d). Stdlib + numpy.
"""
import argparse
import json
import struct
import sys

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        dt = {"F64": np.float64, "F32": np.float32, "I32": np.int32}.get(v["dtype"])
        if dt is None:
            continue
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt).reshape(v["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stats")
    ap.add_argument("--json")
    a = ap.parse_args()
    t = load_safetensors(a.stats)
    for need in ("k_block_energy", "k_pre_mean", "v_sq"):
        if need not in t:
            sys.exit(f"error: {a.stats}: no tensor '{need}' (statistics from ratekv calibrate have it)")
    ek = t["k_block_energy"].sum(-1)
    mu2 = (t["k_pre_mean"] ** 2).sum(-1)
    ev = t["v_sq"].sum(-1)
    share = mu2 / ek
    top = (t["k_pre_mean"] ** 2).max(-1) / mu2
    print("layer  mean share per KV head      top channel of mu   mean E||k||^2  mean E||v||^2")
    for l in range(ek.shape[0]):
        print(f"{l:5d}  " + " ".join(f"{x:6.3f}" for x in share[l]) + "    " + " ".join(f"{x:5.2f}" for x in top[l])
              + f"    {ek[l].mean():12.1f}  {ev[l].mean():12.2f}")
    print(f"mean share: median {np.median(share):.3f}, min {share.min():.3f}, max {share.max():.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"stats": a.stats, "mean_share": share.tolist(), "top_channel_share": top.tolist(),
                       "k_energy": ek.tolist(), "v_energy": ev.tolist()}, f, indent=1)


if __name__ == "__main__":
    main()
