#!/usr/bin/env python3
"""Where Block-GTQ's per-layer MAE reduction against uniform TQ-MSE comes from (issue 22; docs/quality_results.md §3).

  tools/gtq_layer_gap.py PANEL_DIR [--model qwen15] [--bits 2,3]

For each width b: re-plans Block-GTQ K b V b (code unit) from the panel's statistics with `ratekv plan --json`, checks
the plan equals the panel's gtq-K<b>V<b>.json byte for byte, and prints per layer the measured MAE reduction
(the panel's mae/all.json: 3 seeds) beside the reduction the allocator's own objective J predicts (diagnostics
key_j vs key_j_uniform, summed over the layer's KV heads), the key code bits per element and the groups per head.
Environment: RATEKV_BIN (default build/bin/ratekv). Needs numpy.
"""
import argparse
import filecmp
import json
import os
import subprocess
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATEKV = os.environ.get("RATEKV_BIN", os.path.join(REPO, "build", "bin", "ratekv"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("panel")
    ap.add_argument("--model", default="qwen15")
    ap.add_argument("--bits", default="2,3")
    a = ap.parse_args()
    root = os.path.join(a.panel, a.model)
    mae = json.load(open(os.path.join(root, "mae", "all.json")))["report"]
    byname = {os.path.basename(p["name"]).removesuffix(".json"): p for p in mae["plans"]}
    print(f"{a.model}: per-layer MAE from PANEL/{a.model}/mae/all.json ({mae['seeds']} seeds); "
          f"`tools/gtq_layer_gap.py PANEL --model {a.model} --bits {a.bits}`")
    for b in (int(x) for x in a.bits.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "p.json")
            cmd = [RATEKV, "plan", "--stats", os.path.join(root, "calib_stats.safetensors"), "--method", "block-gtq",
                   "--kbits", str(b), "--vbits", str(b), "--budget-unit", "code", "-o", out, "--force", "--json"]
            d = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            ref = os.path.join(root, "plans", f"gtq-K{b}V{b}.json")
            same = filecmp.cmp(out, ref, shallow=False)
            plan = json.load(open(out))
        L, H = len(plan["layers"]), len(plan["layers"][0]["heads"])
        bg = d["diagnostics"]["block_gtq"]
        J = np.array(bg["key_j"]).reshape(L, H).sum(1)
        Ju = np.array(bg["key_j_uniform"]).reshape(L, H).sum(1)
        g = np.array(byname[f"gtq-K{b}V{b}"]["mae"]["layers_mean"])
        u = np.array(byname[f"uniform-K{b}V{b}"]["mae"]["layers_mean"])
        red, pred = 1 - g / u, 1 - J / Ju
        d_head = plan["model"]["head_dim"]
        heads = [[h["key"] for h in layer["heads"]] for layer in plan["layers"]]
        ngroups = np.array([np.mean([sum(1 for x in k["groups"] if x["bits"] > 0) for k in ks]) for ks in heads])
        code = np.array([np.mean([sum(x["bits"] * 2 * len(x["blocks"]) for x in k["groups"]) / d_head for k in ks])
                         for ks in heads])
        shown = " ".join(cmd[1:]).replace(out, "P.json").replace(os.path.abspath(a.panel), "PANEL").replace(a.panel, "PANEL")
        print(f"K{b}V{b} (ratekv {shown}; equals PANEL/{a.model}/plans/gtq-K{b}V{b}.json byte for byte: {same})")
        print(f"  achieved {d['achieved']}; stored key bytes per token {d['stored']['k']}")
        print(f"  mean per-layer reduction: measured MAE {100 * red.mean():.1f} %, predicted by J {100 * pred.mean():.1f} %;"
              f" correlation over layers {np.corrcoef(red, pred)[0, 1]:.2f}; layers measured below J: "
              f"{int((red < pred).sum())}/{L}; key code bits {code.mean():.3f} (uniform {b}), groups per head "
              f"{ngroups.mean():.2f}")
        for l in range(L):
            print(f"   layer {l:2d}  measured {100 * red[l]:5.1f} %  J {100 * pred[l]:5.1f} %  code bits {code[l]:.2f}"
                  f"  groups {ngroups[l]:.1f}")


if __name__ == "__main__":
    main()
