#!/usr/bin/env python3
"""Summarizes tools/tasq_archs.sh runs: RESULTS.json and RESULTS.md (TaSQ vs CQ, K-only).

    python3 tools/tasq_archs_report.py OUT RESULTS [--config TEXT]

OUT holds one folder per model with fit.json (`ratekv plan --json` of one capture: tasq,
--also cq, --also no-normalization, each over k-means seeds) and eval.json (`ratekv eval` of
all those plans with the fp16 baseline). Per model and variant: stored key bits per element
(the plan's achieved, docs/design.md §3.2), K-only perplexity, RoPE-logit MAE, attention KL,
attention-logit NMSE and next-token KLD against the fp16 cache when the report has it; mean and
sd over k-means seeds, and the per-seed paired perplexity difference of TaSQ and of TaSQ
without its scale against CQ (seed k of one against seed k of the other; the three fits of a
seed share the capture).
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

VARIANTS = [
    ("tasq", "TaSQ (Fisher, weights, shared fp16 scale, matching)"),
    ("tasq.no-normalization", "TaSQ without the shared scale (CQ's stored bits)"),
    ("tasq.cq", "CQ (contiguous groups, plain k-means)"),
]


def mean_sd(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def variant_of(name):
    v = re.sub(r"\.s\d+$", "", name)
    return "tasq.cq" if v == "cq" else v  # a CQ plan fitted by its own `plan --method cq`


def next_token_kld(p):
    nt = p.get("next_token")
    if not isinstance(nt, dict):
        return None
    k = nt.get("k") or nt.get("K") or nt
    kld = k.get("kld") if isinstance(k, dict) else None
    if isinstance(kld, dict):
        return kld.get("mean")
    return None


def summarize(model_dir):
    ev = json.load(open(os.path.join(model_dir, "eval.json")))
    fit = []
    for f in sorted(os.listdir(model_dir)):  # fit.json (one capture) or fit_<method>.json (one per method)
        if f == "fit.json" or (f.startswith("fit_") and f.endswith(".json")):
            fit += json.load(open(os.path.join(model_dir, f)))
    fit_by_plan = {os.path.basename(e["plan"]): e for e in fit}
    rows = {}
    for p in ev["plans"]:
        v = variant_of(p["name"])
        r = rows.setdefault(v, {"variant": v, "seeds": []})
        f = fit_by_plan.get(os.path.basename(p["file"]), {})
        r["seeds"].append({
            "plan": os.path.basename(p["file"]),
            "kmeans_seed": f.get("fit", {}).get("kmeans_seed"),
            "k_bits_stored": p["bits"]["k"],
            "k_bits_code": p["bits"].get("k_code"),
            "ppl_k": p["ppl_k"]["mean"] if "ppl_k" in p else None,
            "mae": p["mae"]["mean"],
            "kl": p["kl"]["mean"],
            "nmse": p["nmse"]["mean"],
            "next_token_kld": next_token_kld(p),
            "fisher_zero_groups": f.get("fit", {}).get("fisher_zero_groups"),
        })
    for r in rows.values():
        for key in ("ppl_k", "mae", "kl", "nmse", "next_token_kld", "k_bits_stored"):
            m, s = mean_sd([x[key] for x in r["seeds"]])
            r[key] = {"mean": m, "sd": s}
    paired = {}
    cq = {x["kmeans_seed"]: x["ppl_k"] for x in rows.get("tasq.cq", {}).get("seeds", [])}
    for v in ("tasq", "tasq.no-normalization"):
        if v not in rows:
            continue
        d = [x["ppl_k"] - cq[x["kmeans_seed"]] for x in rows[v]["seeds"] if x["kmeans_seed"] in cq]
        m, s = mean_sd(d)
        paired[v] = {"per_seed": d, "mean": m, "sd": s}
    fp16 = next((b for b in ev.get("baselines", []) if b.get("name") == "fp16"), None)
    if fp16 is None:
        fp16 = next((p for p in ev["plans"] if p["name"] == "fp16"), None)
    first_fit = fit[0]["fit"] if fit else {}
    return {
        "model": ev["model"],
        "eval": {"text": ev["text"], "tokens": ev["n_tokens"], "ctx": ev["ctx"], "windows": ev["n_chunks"],
                 "ppl_scored_tokens": ev["ppl_scored_tokens"], "query_stride": ev["query_stride"],
                 "seconds": ev.get("seconds")},
        "fit": {k: first_fit.get(k) for k in ("calibration_tokens", "ctx", "group", "centroids", "kmeans_iters",
                                             "values", "text")},
        "fp32_ppl": ev["fp"]["ppl"],
        "fp16_ppl_k": (fp16 or {}).get("ppl_k", {}).get("mean"),
        "variants": rows,
        "paired_ppl_vs_cq": paired,
    }


def fmt(m, s, digits=4):
    if m is None:
        return "-"
    if s is None or s == 0:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("results", help="path prefix: writes RESULTS.json and RESULTS.md")
    ap.add_argument("--config", default="", help="the run's knobs, recorded verbatim")
    ap.add_argument("--note", action="append", default=[], metavar="MODEL=TEXT",
                    help="a note printed under MODEL's heading and stored in its JSON (e.g. provenance)")
    a = ap.parse_args()
    models = sorted(d for d in os.listdir(a.out)
                    if os.path.exists(os.path.join(a.out, d, "eval.json")))
    if not models:
        sys.exit(f"tasq_archs_report.py: no <model>/eval.json under {a.out}")
    notes = dict(n.split("=", 1) for n in a.note)
    out = {"script": "tools/tasq_archs.sh", "config": a.config, "models": {m: summarize(os.path.join(a.out, m))
                                                                            for m in models}}
    for m, n in notes.items():
        if m in out["models"]:
            out["models"][m]["note"] = n
    with open(a.results + ".json", "w") as f:
        json.dump(out, f, indent=1)
    lines = ["# TaSQ vs CQ, K-only, on Gemma 3 and Qwen2.5 (issue 20)", "",
             f"Made by `tools/tasq_archs.sh` ({a.config}); summary by tools/tasq_archs_report.py. "
             "Values fp16 in every plan; K bits = stored bits per key element (codes + the shared fp16 "
             "scale, docs/design.md §3.2; codebooks are per plan, not per token). ± = sd over k-means seeds "
             "(one capture per model; each seed's three fits share it).", ""]
    for m in models:
        s = out["models"][m]
        e, f = s["eval"], s["fit"]
        lines += [f"## {s['model']['file']} ({s['model']['arch']}, {s['model']['n_layers']} layers, "
                  f"{s['model']['n_heads']}/{s['model']['n_kv_heads']} heads, head_dim {s['model']['head_dim']})", "",
                  f"Fit: {f['calibration_tokens']} tokens of {f['text']} in windows of {f['ctx']}, g = {f['group']}, "
                  f"K = {f['centroids']}, {f['kmeans_iters']} Lloyd iterations. Eval: {e['tokens']} tokens of "
                  f"{e['text']['file']}, {e['windows']} windows of {e['ctx']} ({e['ppl_scored_tokens']} scored tokens), "
                  f"MAE/KL/NMSE query stride {e['query_stride']}. fp32-cache PPL {s['fp32_ppl']:.4f}"
                  + (f", fp16 keys {s['fp16_ppl_k']:.4f}." if s["fp16_ppl_k"] else "."), ""]
        if s.get("note"):
            lines += [f"**Note.** {s['note']}", ""]
        lines += [
                  "| keys | K bits stored | PPL K-only | RoPE-logit MAE | attn KL (nats) | logit NMSE | seeds |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for v, label in VARIANTS:
            r = s["variants"].get(v)
            if not r:
                continue
            lines.append(f"| {label} | {r['k_bits_stored']['mean']:.4f} | {fmt(r['ppl_k']['mean'], r['ppl_k']['sd'])} | {fmt(r['mae']['mean'], r['mae']['sd'])} | "
                         f"{fmt(r['kl']['mean'], r['kl']['sd'], 5)} | {r['nmse']['mean']:.3e} | "
                         f"{len(r['seeds'])} |")
        for v, p in s["paired_ppl_vs_cq"].items():
            per = ", ".join(f"{d:+.3f}" for d in p["per_seed"])
            sd = "" if p["sd"] is None or len(p["per_seed"]) < 2 else f", sd {p['sd']:.3f}"
            lines.append(f"\nPPL {v} − CQ, paired by k-means seed: {per} (mean {p['mean']:+.3f}{sd})")
        zero = [x["fisher_zero_groups"] for x in s["variants"].get("tasq", {}).get("seeds", [])]
        if any(z for z in zero if z):
            lines.append(f"\nKey groups fitted unweighted because every Fisher weight was 0 (channels no query "
                         f"reads): {zero[0]} per TaSQ plan.")
        lines.append("")
    with open(a.results + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
