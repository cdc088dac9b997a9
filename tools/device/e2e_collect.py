#!/usr/bin/env python3
"""Merges one GPU-machine run of tools/device/run_engine.sh into
bench/results/e2e_h200.json and prints the markdown tables of
docs/e2e_results.md (issue 17).

Inputs (any may be missing): bench_llama.json, bench_qwen.json, smollm2.json
(ratekv bench -o json), sdpa.json and hf.json (tools/device/e2e_peers.py).
Every decode row keeps the bench's fields and gains:
  speedup_vs_fp16  decode tok/s over the fp16 row of the same (model, B, depth)
  attn_vs_sdpa     fp16 rows: torch SDPA flash ms / our attention ms at the
                   row's (B, depth) (our attention is timed at the depth plus
                   the tokens the row decoded, ≤ 0.2 % more at 32K)
HF rows become rows with cache "hf-eager-dynamic" / "hf-static-compiled".

Usage: e2e_collect.py RUN_DIR --out bench/results/e2e_h200.json > tables.md
"""
import argparse
import json
import os

ap = argparse.ArgumentParser()
ap.add_argument("run_dir")
ap.add_argument("--out", required=True)
a = ap.parse_args()


def load(name):
    p = os.path.join(a.run_dir, name)
    return json.load(open(p)) if os.path.exists(p) else None


# Plan files become the names issue 17's tables use: the Block-GTQ-shaped plan of
# tools/device/gtq_shape_plan.py is "gtq-K3V3" (its file stays in "plan").
PLAN_NAMES = {"plan:gtq_llama.plan": "gtq-K3V3", "plan:gtq_qwen.plan": "gtq-K3V3"}
rows, meta = [], {}
for name in ("bench_llama.json", "bench_qwen.json", "smollm2.json"):
    d = load(name)
    if d:
        for r in d["rows"]:
            if r.get("cache") in PLAN_NAMES:
                r["plan"] = r["cache"][len("plan:"):]
                r["cache"] = PLAN_NAMES[r["cache"]]
        rows += d["rows"]
        meta[name] = {k: v for k, v in d.items() if k != "rows"}
sdpa = load("sdpa.json")
sdpa_ms = {}
if sdpa:
    for r in sdpa["rows"]:
        if "ms" in r:
            sdpa_ms[(r["hq"], r["hkv"], r["B"], r["T"])] = r["ms"]
HEADS = {"llama-3.1-8b": (32, 8), "qwen2.5-7b": (28, 4)}
fp16 = {}
for r in rows:
    if r.get("cache") == "fp16" and "decode_tok_s" in r:
        fp16[(r["model"], r["B"], r["depth"])] = r
for r in rows:
    if "decode_tok_s" not in r:
        continue
    base = fp16.get((r["model"], r["B"], r["depth"]))
    if base:
        r["speedup_vs_fp16"] = r["decode_tok_s"] / base["decode_tok_s"]
    if r.get("cache") == "fp16" and "attn_ms" in r:
        key = next((k for k in HEADS if r["model"].startswith(k)), None)
        if key:
            s = sdpa_ms.get(HEADS[key] + (r["B"], r["depth"]))
            if s:
                r["sdpa_flash_ms"] = s
                r["attn_vs_sdpa"] = s / r["attn_ms"]
hf = load("hf.json")
if hf:
    for h in hf["rows"]:
        row = {"model": h["model"] + " synthetic", "cache": h["kind"], "device": "cuda", "B": h["B"],
               "depth": h["depth"], "test": "tg", "transformers": h.get("transformers")}
        for k in ("step_ms", "decode_tok_s", "peak_mem_gb", "error"):
            if k in h:
                row[k] = h[k]
        row["synthetic_fill"] = True
        rows.append(row)
json.dump({"meta": meta, "sdpa": sdpa, "rows": rows}, open(a.out, "w"), indent=1)


def f(r, k, p=2):
    return f"{r[k]:.{p}f}" if k in r else ""


for model in sorted({r["model"] for r in rows}):
    print(f"\n### {model}\n")
    print("| cache | B | depth | decode tok/s | step ms | roofline ms | x roofline | vs fp16 | attn vs SDPA | "
          "mem GB | fill |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted((r for r in rows if r["model"] == model and r.get("test", "").startswith("tg")),
                    key=lambda r: (r["depth"], r["B"], r["cache"])):
        if "error" in r:
            print(f"| {r['cache']} | {r['B']} | {r['depth']} | does not fit: {r['error'][:80]} |||||||")
            continue
        tok = f"{r['decode_tok_s']:.1f}" + (f" ± {r['decode_tok_s_sd']:.1f}" if "decode_tok_s_sd" in r else "")
        fill = "synthetic" if r.get("synthetic_fill") else "prefill"
        print(f"| {r['cache']} | {r['B']} | {r['depth']} | {tok} | {f(r, 'step_ms', 3)} | {f(r, 'roofline_ms', 3)} | "
              f"{f(r, 'x_roofline')} | {f(r, 'speedup_vs_fp16')} | {f(r, 'attn_vs_sdpa')} | {f(r, 'peak_mem_gb', 1)} | "
              f"{fill} |")
