#!/usr/bin/env python3
"""Markdown accuracy tables from a `ratekv niah --json` report (bench/results/niah_smollm2.md).

usage: niah_table.py REPORT.json OUT.md [NOTE.md]

One table: a row per (grid, context length) with the accuracy of every depth, the row mean,
the effective bits per element and the cache bytes per token (fp16: a real fp16 K/V cache).
NOTE.md (optional) is copied in front of the table (protocol, command, machine).
"""
import json
import sys


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    rep = json.load(open(sys.argv[1]))
    out = []
    if len(sys.argv) == 4:
        out.append(open(sys.argv[3]).read().rstrip() + "\n")
    grids = rep["grids"]
    depths = grids[0]["depths"]
    out.append("| cache | bits/elem | B/token | ctx | " + " | ".join(f"{100 * d:.0f}%" for d in depths) +
               " | mean | trials/cell |")
    out.append("|" + " --- |" * (len(depths) + 6))
    for g in grids:
        bits = g.get("effective_bits", {}).get("total", 16.0)
        for c, row in zip(g["context_lengths"], g["accuracy"]):
            mean = 100.0 * sum(row) / len(row)
            # Trials per cell of this row (a grid cut at a time limit has fewer in its last row).
            done = [t for t in g.get("trials", []) if t["context_length"] == c]
            per_cell = len(done) // len(row) if done else g["trials_per_cell"]
            out.append(f"| {g['name']} | {bits:.2f} | {g['cache_bytes_per_token']:.0f} | {c} | " +
                       " | ".join(f"{100 * a:.0f}" for a in row) + f" | **{mean:.1f}** | {per_cell}"
                       + ("" if g.get("complete", True) else " (partial)") + " |")
    open(sys.argv[2], "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
