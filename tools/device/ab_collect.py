#!/usr/bin/env python3
"""Collects a tools/device/ab_decode.sh folder (base_<i>_<r>.json / new_<i>_<r>.json) into one
bench/results JSON: per (model, B, T, cache) the median-of-reps ms of every round of each side (in round
order), the ratio of the best round of each (new / base) and the new side's share of the read ceiling
measured in the run of its best round. --field NAME compares another timed field of the bench's rows
instead of "ms" (e.g. runtime_tables_variant_ms, the fp16-level variant, measured for K3V3 and K4V4);
rows where it is negative (not measured) are left out.

Usage: ab_collect.py AB_DIR OUT.json --what TEXT --command TEXT [--date YYYY-MM-DD] [--force] [--field NAME]
       ab_collect.py AB_DIR OUT.json --what TEXT --command TEXT --into --key NAME
Without --into, OUT.json is written (an existing one only with --force); with --into, OUT.json must exist
and the rows go under its new key NAME. Files that do not parse or lack the bench's fields (a run cut by
its timeout) are skipped with a message; rows measured on one side only are named and left out; a folder
without rows is refused.
"""
import argparse
import glob
import json
import os
import re
import sys
from collections import defaultdict


def round_files(ab_dir):
    """(side, list index, round, path) of the folder's bench JSONs, in numeric order."""
    out = []
    for f in glob.glob(os.path.join(ab_dir, "*.json")):
        m = re.fullmatch(r"(base|new)_(\d+)_(\d+)\.json", os.path.basename(f))
        if m:
            out.append((m.group(1), int(m.group(2)), int(m.group(3)), f))
    return sorted(out)


def rows_of(ab_dir, field="ms"):
    rounds = defaultdict(lambda: {"base": [], "new": []})  # key -> side -> [(ms, splits, bytes, ceiling)]
    for side, _, _, f in round_files(ab_dir):
        try:
            with open(f) as fh:
                d = json.load(fh)
            d = d.get("ratekv_cuda", d)
            ceiling = float(d["read_ceiling_GBps"])
            rows = [((r["model"], r["B"], r["T"], r["cache"]), float(r[field]), r.get("splits"),
                     float(r["cache_bytes"])) for r in d["rows"] if float(r[field]) >= 0]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"ab_collect: skipped {f}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        for k, ms, splits, cb in rows:
            rounds[k][side].append((ms, splits, cb, ceiling))
    out = []
    for k in sorted(rounds):  # every key of `rounds` was measured on at least one side
        b, n = rounds[k]["base"], rounds[k]["new"]
        if not b or not n:
            print(f"ab_collect: {k} measured on the {'base' if b else 'new'} side only: left out", file=sys.stderr)
            continue
        best_b, best_n = min(b), min(n)  # the fastest round of each side
        _, splits, cb, ceiling = best_n
        out.append({"model": k[0], "B": k[1], "T": k[2], "cache": k[3], "splits": splits, "cache_bytes": cb,
                    "base_ms": [x[0] for x in b], "new_ms": [x[0] for x in n],
                    "new_over_base": best_n[0] / best_b[0],
                    "new_frac_read_ceiling": cb / (best_n[0] * 1e-3) / (ceiling * 1e9),
                    "read_ceiling_GBps": ceiling})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ab_dir")
    ap.add_argument("out")
    ap.add_argument("--what", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--date", default="", help="YYYY-MM-DD (new files only)")
    ap.add_argument("--into", action="store_true", help="add the rows under --key to the existing OUT")
    ap.add_argument("--key", default="", help="with --into: the new key of OUT")
    ap.add_argument("--force", action="store_true", help="without --into: replace an existing OUT")
    ap.add_argument("--field", default="ms", help="the rows' timed field to compare (default ms)")
    a = ap.parse_args()
    if a.into and not a.key:
        ap.error("--into needs --key NAME")
    if a.key and not a.into:
        ap.error("--key applies to --into only")
    if a.into and a.date:
        ap.error("--date applies to a new file only (the existing OUT keeps its date)")
    if a.date and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", a.date):
        ap.error(f"--date '{a.date}': expected YYYY-MM-DD")
    if a.into:
        try:
            with open(a.out) as fh:
                d = json.load(fh)
        except (OSError, ValueError) as e:
            ap.error(f"--into: cannot read {a.out}: {e}")
        if not isinstance(d, dict):
            ap.error(f"--into: {a.out} does not hold a JSON object")
        if a.key in d:
            ap.error(f"--key {a.key}: {a.out} already has that key")
    elif os.path.exists(a.out) and not a.force:
        ap.error(f"{a.out} exists: give --force to replace it, or --into --key NAME to add to it")
    rows = rows_of(a.ab_dir, a.field)
    if not rows:
        raise SystemExit(f"ab_collect: no base/new rows in {a.ab_dir}"
                         + (f" with field {a.field} measured" if a.field != "ms" else ""))
    entry = {"what": a.what, "commands": [a.command], "rows": rows}
    if a.field != "ms":
        entry["field"] = a.field
    if a.into:
        d[a.key] = entry
    else:
        d = {"date": a.date, "device": "NVIDIA H200 (lent, sm_90)", **entry}
    with open(a.out, "w") as fh:
        json.dump(d, fh, indent=1)
        fh.write("\n")
    for r in rows:
        print(f"{r['model']:13s} {r['B']:3d} {r['T']:7d} {r['cache']:14s} {min(r['base_ms']):.4f} "
              f"{min(r['new_ms']):.4f} {r['new_over_base']:.3f} {100 * r['new_frac_read_ceiling']:.1f} %")


if __name__ == "__main__":
    main()
