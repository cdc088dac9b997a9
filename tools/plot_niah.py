#!/usr/bin/env python3
"""Needle-in-a-haystack accuracy heatmaps from a `ratekv niah --json` report, as one PNG.

usage: plot_niah.py REPORT.json OUT.png

One panel per grid (fp16 and each plan): x = needle depth (% of the document), y = context
length (tokens), colour = accuracy over the trials of the cell, the value printed in each cell.
The panel title gives the cache, its effective bits per element (plans) and the mean accuracy.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        rep = json.load(f)
    grids = rep["grids"]
    if not grids:
        sys.exit("plot_niah.py: the report holds no grids")
    fig, axes = plt.subplots(1, len(grids), figsize=(4.2 * len(grids), 0.9 + 0.55 * len(grids[0]["context_lengths"]) + 1.2),
                             squeeze=False, gridspec_kw={"wspace": 0.35})
    for ax, g in zip(axes[0], grids):
        acc = [[100.0 * a for a in row] for row in g["accuracy"]]
        im = ax.imshow(acc, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto", origin="lower")
        ax.set_xticks(range(len(g["depths"])))
        ax.set_xticklabels([f"{100 * d:.0f}" for d in g["depths"]], fontsize=7)
        ax.set_yticks(range(len(g["context_lengths"])))
        ax.set_yticklabels([str(c) for c in g["context_lengths"]], fontsize=8)
        ax.set_xlabel("needle depth (%)")
        ax.set_ylabel("context (tokens)")
        for i, row in enumerate(acc):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=6)
        mean = sum(sum(r) for r in acc) / sum(len(r) for r in acc)
        bits = g.get("effective_bits")
        sub = f"{bits['total']:.2f} bits/elem" if bits else "16 bits/elem"
        ax.set_title(f"{g['name']}\n{sub}, mean {mean:.1f}%", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy (%)")
    fig.suptitle(f"NIAH, {rep['trials']} trials per cell, model {rep['model'].split('/')[-1]}", fontsize=9, y=1.12)
    fig.savefig(sys.argv[2], dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
