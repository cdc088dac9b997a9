#!/usr/bin/env python3
"""Per-layer RoPE-logit MAE of every plan in a `ratekv eval --json` report, as a PNG.

usage: plot_eval.py REPORT.json OUT.png

One line per plan (mean over run seeds, shaded ± sd when there are several seeds), log y axis,
the legend giving each plan's effective K bits per element.
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
    if rep.get("format") != "ratekv-eval":
        sys.exit(f"plot_eval.py: {sys.argv[1]} is not a ratekv eval report")
    fig, ax = plt.subplots(figsize=(12, 5.5))
    for p in rep["plans"]:
        m = p["mae"]["layers_mean"]
        sd = p["mae"]["layers_sd"]
        x = list(range(len(m)))
        style = "-" if "gtq" in p["name"] or "block" in p["method"] else "--"
        line, = ax.plot(x, m, style, marker="o", ms=3, label=f'{p["name"]} (K {p["bits"]["k"]:.3f} b/el)')
        if rep.get("seeds", 1) > 1:
            ax.fill_between(x, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)],
                            color=line.get_color(), alpha=0.2)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("RoPE-logit MAE  mean |q·k − q·k̂|")
    model = rep.get("model", {})
    ax.set_title(f'{model.get("file", model.get("arch", ""))}: K-only, V exact; {rep["n_tokens"]} tokens, '
                 f'windows of {rep["ctx"]}, {rep["seeds"]} seed(s)')
    ax.grid(True, which="both", alpha=0.3)
    # Beside the axes: inside, it covered the low-error lines (fp16, q8_0) over the middle layers.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
