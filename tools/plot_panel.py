#!/usr/bin/env python3
"""The `ratekv panel` report as one PNG.

usage: plot_panel.py PANEL.json OUT.png

One row per model: left, per-layer RoPE-logit MAE (K-only) of the Block-GTQ and uniform
TQ-MSE plans (solid = Block-GTQ, dashed = uniform; log y); right, the MAE reduction of
Block-GTQ over uniform per layer at each budget (positive = Block-GTQ better).
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
        panel = json.load(f)
    if panel.get("format") != "ratekv-panel":
        sys.exit(f"plot_panel.py: {sys.argv[1]} is not a ratekv panel report")
    models = panel["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.2 * len(models)), squeeze=False)
    for row, m in zip(axes, models):
        mo = m["model"]
        title = f'{mo.get("file", "")} (head_dim {mo.get("head_dim")}, {mo.get("n_kv_heads")} KV heads)'
        plans = {p["name"]: p for p in m["plans"]}
        ax = row[0]
        for p in m["plans"]:
            if p["method"] not in ("block-gtq", "uniform") or "mae_layers" not in p:
                continue
            style = "-" if p["method"] == "block-gtq" else "--"
            ax.plot(range(len(p["mae_layers"])), p["mae_layers"], style, marker="o", ms=3,
                    label=f'{p["name"]} (K {p["bits"]["k"]:.4f} b/el)')
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel("RoPE-logit MAE")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax = row[1]
        for name, p in plans.items():
            if p["method"] != "block-gtq":
                continue
            u = plans.get(name.replace("gtq-", "uniform-"))
            if not u:
                continue
            red = [100 * (1 - a / b) if b > 0 else 0 for a, b in zip(p["mae_layers"], u["mae_layers"])]
            ax.plot(range(len(red)), red, marker="o", ms=3, label=f'{name} vs {u["name"]}')
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xlabel("layer")
        ax.set_ylabel("MAE reduction of Block-GTQ (%)")
        ax.set_title("Block-GTQ vs uniform TQ-MSE at equal effective bits", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
