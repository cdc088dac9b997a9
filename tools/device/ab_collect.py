#!/usr/bin/env python3
"""Collects a tools/device/ab_decode.sh folder (base_<i>_<r>.json / new_<i>_<r>.json) into one
bench/results JSON: per (model, B, T, cache) the median-of-reps ms of every round of each side, the
ratio of the best round of each (new / base) and the new side's share of its run's read ceiling.

Usage: ab_collect.py AB_DIR OUT.json --what TEXT --command TEXT [--date YYYY-MM-DD] [--into --key NAME]
With --into, OUT.json must exist and the rows go under its key NAME instead of a new file. Truncated
JSON files (a run cut by its timeout) are skipped with a message; a folder without rows is refused.
"""
import argparse
import glob
import json
import os
import sys
from collections import defaultdict


def rows_of(ab_dir):
    ms = defaultdict(lambda: {"base": [], "new": []})
    meta = {}
    for f in sorted(glob.glob(os.path.join(ab_dir, "*.json"))):
        side = os.path.basename(f).split("_")[0]
        if side not in ("base", "new"):
            continue
        try:
            d = json.load(open(f))
        except (OSError, ValueError) as e:  # a run cut by its timeout: skipped, said
            print(f"ab_collect: skipped {f}: {e}", file=sys.stderr)
            continue
        d = d.get("ratekv_cuda", d)
        for r in d["rows"]:
            k = (r["model"], r["B"], r["T"], r["cache"])
            ms[k][side].append(r["ms"])
            if side == "new":
                meta[k] = (r.get("splits"), r["cache_bytes"], d["read_ceiling_GBps"])
    out = []
    for k in sorted(ms, key=lambda k: (k[0], k[1], k[2], k[3])):
        b, n = ms[k]["base"], ms[k]["new"]
        if not b or not n or k not in meta:
            continue
        splits, cb, ceil = meta[k]
        out.append({"model": k[0], "B": k[1], "T": k[2], "cache": k[3], "splits": splits,
                    "cache_bytes": cb, "base_ms": b, "new_ms": n, "new_over_base": min(n) / min(b),
                    "new_frac_read_ceiling": cb / (min(n) * 1e-3) / (ceil * 1e9), "read_ceiling_GBps": ceil})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ab_dir")
    ap.add_argument("out")
    ap.add_argument("--what", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--date", default="")
    ap.add_argument("--key", default="")
    ap.add_argument("--into", action="store_true", help="add under --key to the existing OUT")
    a = ap.parse_args()
    rows = rows_of(a.ab_dir)
    if not rows:
        raise SystemExit(f"ab_collect: no base/new rows in {a.ab_dir}")
    entry = {"what": a.what, "commands": [a.command], "rows": rows}
    if a.into:
        d = json.load(open(a.out))
        d[a.key or "followup"] = entry
    else:
        d = {"date": a.date, "device": "NVIDIA H200 (lent, sm_90)", **entry}
    json.dump(d, open(a.out, "w"), indent=1)
    for r in rows:
        print(f"{r['model']:13s} {r['B']:3d} {r['T']:7d} {r['cache']:14s} {min(r['base_ms']):.4f} "
              f"{min(r['new_ms']):.4f} {r['new_over_base']:.3f} {100 * r['new_frac_read_ceiling']:.1f} %")


if __name__ == "__main__":
    main()
