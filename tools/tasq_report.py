#!/usr/bin/env python3
"""Summarize a tools/tasq_smollm2.sh run -> RESULTS.{json,md} (+ RESULTS_nmse.png if matplotlib is there).

usage: tasq_report.py OUT RESULTS

Reads OUT/fit.json (ratekv plan --json), OUT/fit.time (/usr/bin/time -v), OUT/fit.load,
OUT/eval_long.<set>.json (the plans at the long ctx: MAE, KL, NMSE by query position; no perplexity),
OUT/eval_ppl.<set>.json (optional: K-only perplexity at the calibration ctx); the sets are merged and the plan files themselves
(effective bits recomputed from their codecs). Rows are variants (plan name without the .s<k>
k-means seed suffix); each metric is the mean over k-means seeds (vq) or rotation seeds (TQ-MSE)
with the sample sd and the min..max range."""
import json
import os
import re
import statistics
import sys
from pathlib import Path

out, results = Path(sys.argv[1]), Path(sys.argv[2])


def merged(kind):
    """OUT/<kind>.<set>.json reports (one per eval set) merged into one: same text, ctx and tokens required."""
    files = sorted(out.glob(f"{kind}.*.json")) or sorted(out.glob(f"{kind}.json"))
    if not files:
        return None
    reps = [json.loads(f.read_text()) for f in files]
    m = dict(reps[0])
    m["plans"] = [p for r in reps for p in r["plans"]]
    m["sets"] = [f.name for f in files]
    for f, r in zip(files, reps):
        for k in ("n_tokens", "ctx", "query_stride"):
            assert r[k] == m[k], f"{f}: {k} {r[k]} differs from {files[0]} ({m[k]})"
        assert r.get("text") == m.get("text"), f"{f}: another eval text"
        assert abs(r["fp"]["ppl"] - m["fp"]["ppl"]) < 1e-6 * m["fp"]["ppl"], f"{f}: another fp32 perplexity"
    return m


ev = merged("eval_long")
ppl_ev = merged("eval_ppl")
fits = json.loads((out / "fit.json").read_text())
fits_cq = json.loads((out / "fit_cq.json").read_text()) if (out / "fit_cq.json").exists() else []
# A separately fitted Fisher-weighted TaSQ (when the main fit is plain k-means): OUT/fit_fisher.json.
fits_fisher = json.loads((out / "fit_fisher.json").read_text()) if (out / "fit_fisher.json").exists() else []
fits_all = fits + fits_cq + fits_fisher


def stat(v):
    v = list(v)
    return {"mean": statistics.mean(v), "sd": statistics.stdev(v) if len(v) > 1 else 0.0, "min": min(v), "max": max(v),
            "n": len(v), "values": v}


def variant(name):
    return re.sub(r"\.s\d+$", "", name)


def per_seed_values(p, key):
    """Per-seed all-layer means of one plan entry (deterministic plans: one value)."""
    if key in ("mae", "kl"):
        vals = [sum(s) / len(s) for s in p[key]["per_seed"]]
    else:  # nmse, ppl_k
        vals = p[key]["per_seed"]
    return vals[:1] if p["deterministic"] else vals


def collect(report):
    rows = {}
    for p in report["plans"]:
        r = rows.setdefault(variant(p["name"]), {"plans": [], "mae": [], "kl": [], "nmse": [], "nmse_pos": [],
                                                 "ppl_k": [], "entry": p})
        r["plans"].append(p["name"])
        for k in ("mae", "kl", "nmse") + (("ppl_k",) if "ppl_k" in p else ()):
            r[k] += per_seed_values(p, k)
        pos = p["nmse_by_position"]["per_seed"]
        r["nmse_pos"] += pos[:1] if p["deterministic"] else pos
    return rows


long_rows = collect(ev)
ppl_rows = collect(ppl_ev) if ppl_ev else {}
buckets = ev["position_buckets"]
fit0 = fits[0]["fit"]
fit_ctx = fit0["ctx"]


def plan_file(name):
    for p in ev["plans"]:
        if p["name"] == name:
            return p["file"]
    return None


def bits_breakdown(name, entry):
    """Effective K bits per element recomputed from the plan file's key codecs (every per-token and
    per-group byte), checked against the eval's figure."""
    if not entry["file"]:
        return {"per_element": entry["bits"]["k"], "what": f"{entry['name']} baseline (no metadata)"}
    pf = Path(entry["file"])
    plan = json.loads((pf if pf.exists() else out / pf.name).read_text())
    d = plan["model"]["head_dim"]
    code = meta = 0.0
    n = 0
    what = set()
    for layer in plan["layers"]:
        for h in layer["heads"]:
            c = h["key"]
            n += 1
            if c["kind"] == "vq":
                code += sum(g["bits"] for g in c["groups"]) / d
                if c.get("norm") == "shared-fp16":
                    meta += 16 / c["scale_heads"] / d
                    what.add(f"{len(c['groups'])} indices of {c['groups'][0]['bits']} bits (groups of "
                             f"{c['group_size']} channels) + one fp16 scale per token per layer shared by "
                             f"{c['scale_heads']} KV heads ({16 / c['scale_heads']:.4f} bits per head per token)")
                else:
                    what.add(f"{len(c['groups'])} indices of {c['groups'][0]['bits']} bits (groups of "
                             f"{c['group_size']} channels), no per-token metadata")
            elif c["kind"] == "tq-mse":
                code += c["groups"][0]["bits"]
                meta += (16 / d) if c.get("norm") == "fp16" else 0.0
                what.add(f"{c['groups'][0]['bits']}-bit Lloyd-Max codes + one fp16 norm per head per token")
            else:
                return {"per_element": entry["bits"]["k"], "what": f"kind {c['kind']} (eval's figure)"}
    code, meta = code / n, meta / n
    assert abs(code + meta - entry["bits"]["k"]) < 1e-9, (name, code, meta, entry["bits"]["k"])
    return {"per_element": code + meta, "code": code, "metadata": meta, "what": "; ".join(sorted(what))}


# Fixed per-plan cost: codebooks (fp16) + TaSQ per-channel weights (fp16), not per token.
cfg = ev["model"]
elems_per_token = cfg["n_layers"] * cfg["n_kv_heads"] * cfg["head_dim"]
fixed = {}
for f in fits_all:
    name = variant(Path(f["plan"]).stem)
    if name in fixed:
        continue
    cb = f["fit"]["codebook_bytes_fp16"]
    w = elems_per_token * 4 if f["fit"]["weighting"] != "none" else 0  # channel scales, fp32 as stored
    fixed[name] = {"codebook_bytes_fp16": cb, "channel_scale_bytes_fp32": w,
                   "amortized_bits_per_element": {str(T): (cb + w) * 8 / (T * elems_per_token)
                                                  for T in (2048, 32768, 131072)}}

summary = {}
for name, r in long_rows.items():
    e = r["entry"]
    s = {"plans": r["plans"], "method": e["method"], "fit": None,
         "k_bits": bits_breakdown(name, e), "k_code_bits": e["bits"]["k_code"],
         "mae": stat(r["mae"]), "kl": stat(r["kl"]), "nmse": stat(r["nmse"]),
         "nmse_by_position": [stat(v[b] for v in r["nmse_pos"]) for b in range(len(buckets))]}
    within = [b for b in range(len(buckets)) if buckets[b]["end"] <= fit_ctx]
    beyond = [b for b in range(len(buckets)) if buckets[b]["begin"] >= fit_ctx]
    s["nmse_within_fit_ctx_buckets_mean"] = statistics.mean(s["nmse_by_position"][b]["mean"] for b in within) if within else None
    s["nmse_beyond_fit_ctx_buckets_mean"] = statistics.mean(s["nmse_by_position"][b]["mean"] for b in beyond) if beyond else None
    if "fit_ctx" in e:
        f = next((f["fit"] for f in fits_all if variant(Path(f["plan"]).stem) == name), None)
        s["fit"] = f
        s["fixed_cost"] = fixed.get(name)
    if name in ppl_rows and ppl_rows[name]["ppl_k"]:
        pr = ppl_rows[name]
        s["ppl_k"] = stat(pr["ppl_k"])
        s["ppl_plans"] = pr["plans"]
        s["mae_ctx_ppl"] = stat(pr["mae"])
        s["kl_ctx_ppl"] = stat(pr["kl"])
        s["nmse_ctx_ppl"] = stat(pr["nmse"])
    summary[name] = s

# Paired (same k-means seed) TaSQ - CQ differences.
paired = {}
if ppl_ev:
    by = {p["name"]: p for p in ppl_ev["plans"]}
    seeds = sorted(int(m.group(1)) for n in by for m in [re.match(r"tasq\.s(\d+)$", n)] if m)
    pairs = [(f"tasq.s{k}", f"cq.s{k}") for k in seeds if f"cq.s{k}" in by]
    if not pairs and "tasq" in by and "cq" in by:
        pairs = [("tasq", "cq")]
    if pairs:
        paired["tasq_minus_cq_ppl_k"] = stat(by[a]["ppl_k"]["mean"] - by[b]["ppl_k"]["mean"] for a, b in pairs)
        paired["tasq_over_cq_mae"] = stat(by[a]["mae"]["mean"] / by[b]["mae"]["mean"] for a, b in pairs)
        paired["pairs"] = pairs

# Grouping: log-det of the matched partition vs contiguous RoPE pairs, per head, over the fitted plans.
grouping = {}
for f in fits + fits_fisher:
    d = f["diagnostics"]["key_groups"]
    if f["fit"].get("grouping", "").startswith("hierarchical"):
        m = [e for e in d if e["logdet_matched"] is not None]
        layers = sorted({e["layer"] for e in m})
        grouping[Path(f["plan"]).name] = {
            "heads": len(m),
            "heads_matched_below_contiguous": sum(e["logdet_matched"] < e["logdet_contiguous_pairs"] for e in m),
            "heads_fallback": f["diagnostics"]["contiguous_fallbacks"],
            "mean_logdet_matched": statistics.mean(e["logdet_matched"] for e in m),
            "mean_logdet_contiguous": statistics.mean(e["logdet_contiguous_pairs"] for e in m),
            "layers_sum_below": sum(sum(e["logdet_matched"] for e in m if e["layer"] == l) <
                                    sum(e["logdet_contiguous_pairs"] for e in m if e["layer"] == l) for l in layers),
            "layers_all_heads_below": sum(all(e["logdet_matched"] < e["logdet_contiguous_pairs"]
                                              for e in m if e["layer"] == l) for l in layers),
            "layers": len(layers)}

def time_record(stem, plans):
    timing = (out / f"{stem}.time").read_text() if (out / f"{stem}.time").exists() else ""
    loads = (out / f"{stem}.load").read_text().split("\n") if (out / f"{stem}.load").exists() else []

    def field(key):
        m = re.search(re.escape(key) + r":\s*(.+)", timing)
        return m.group(1).strip() if m else None

    return {"wall": field("Elapsed (wall clock) time (h:mm:ss or m:ss)"), "user_s": field("User time (seconds)"),
            "sys_s": field("System time (seconds)"), "max_rss_kb": field("Maximum resident set size (kbytes)"),
            "load": [x for x in loads if x] + re.findall(r"[^\n]*load after[^\n]*", timing),
            "fit_seconds_per_plan": {Path(f["plan"]).name: f["diagnostics"]["fit_seconds"] for f in plans}}


fit_time = time_record("fit", fits)
fit_cq_time = time_record("fit_cq", fits_cq) if fits_cq else None
knobs = {k: os.environ[k] for k in ("TOKENS", "GROUP", "CENTROIDS", "SEEDS", "ABL_SEEDS", "ITERS", "CTX", "FISHER",
                                     "LONG_CTX", "LONG_TOKENS", "LONG_STRIDE", "PPL_TOKENS", "ABL_PPL") if k in os.environ}
res = {"model": ev["model"], "eval_text": ev.get("text"), "fit": fit0, "fit_time": fit_time,
       "fit_cq_time": fit_cq_time, "knobs": knobs,
       "long_eval": {k: ev[k] for k in ("n_tokens", "ctx", "n_chunks", "query_stride", "seeds", "mae_definition",
                                        "nmse_definition", "position_buckets")} | {"fp32_ppl": ev["fp"]["ppl"]},
       "ppl_eval": ({k: ppl_ev[k] for k in ("n_tokens", "ctx", "n_chunks", "ppl_scored_tokens", "seeds")} |
                    {"fp32_ppl": ppl_ev["fp"]["ppl"]}) if ppl_ev else None,
       "grouping": grouping, "paired": paired, "rows": summary}
results.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")

# ---------------------------------------------------------------- markdown
MAIN = ["tasq", "cq", "tq-mse-k1", "tq-mse-k2", "fp16"]
ABL = ["tasq", "tasq.no-weighting", "tasq.no-normalization", "tasq.no-grouping", "tasq.no-fisher", "tasq.fisher"]
LABEL = {"tasq": "TaSQ", "cq": "CQ", "tasq.cq": "CQ", "tq-mse-k1": "TQ-MSE 1 bit", "tq-mse-k2": "TQ-MSE 2 bit", "fp16": "fp16",
         "tasq.no-weighting": "TaSQ − weighting", "tasq.no-normalization": "TaSQ − normalization",
         "tasq.no-grouping": "TaSQ − grouping", "tasq.no-fisher": "TaSQ − Fisher",
         "tasq.fisher": "TaSQ + Fisher (separate fit)"}


def pm(s, p=4, sci=False):
    if s is None:
        return "-"
    f = (lambda x: f"{x:.{p}e}") if sci else (lambda x: f"{x:.{p}f}")
    return f"{f(s['mean'])} ± {f(s['sd'])}" if s["n"] > 1 else f(s["mean"])


L = [f"# TaSQ vs CQ vs TQ-MSE keys on {ev['model'].get('file', 'SmolLM2')}\n"]
L.append(f"Generated by `tools/tasq_smollm2.sh` (then `tools/tasq_report.py`). Keys quantized, values fp16 in every "
         f"plan (K-only). Calibration: first {fit0['calibration_tokens']} tokens of {fit0.get('text')} in windows of "
         f"{fit_ctx} (disjoint from eval.txt); g = {fit0['group']}, K = {fit0['centroids']} centroids, "
         f"{fit0['kmeans_iters']} k-means iterations; TaSQ k-means: {fit0['kmeans']}. Model weights are Q4_1; K/V "
         f"come from the dequantized model.\n")
L.append("Command: `" + " ".join(f"{k}={v}" for k, v in knobs.items()) + " bash tools/tasq_smollm2.sh`\n")
L.append(f"- Logit columns (MAE, KL, NMSE): {ev['n_tokens']} tokens of eval.txt in {ev['n_chunks']} windows of "
         f"**{ev['ctx']}** (query stride {ev['query_stride']}), i.e. positions up to {ev['ctx'] - 1}, "
         f"{ev['ctx'] // fit_ctx}× the calibration window.")
if ppl_ev:
    L.append(f"- Perplexity: K-only, {ppl_ev['n_tokens']} tokens in {ppl_ev['n_chunks']} windows of {ppl_ev['ctx']} "
             f"({ppl_ev['ppl_scored_tokens']} scored tokens, llama.cpp convention); fp32 cache {ppl_ev['fp']['ppl']:.4f}. "
             f"TaSQ and CQ: every k-means seed; TQ-MSE: {ppl_ev['seeds']} rotation seeds.")
L.append("- ± = sample sd over k-means seeds (vq) or rotation seeds (TQ-MSE); no ± = one seed / deterministic.\n")

L.append("## Main table\n")
L.append("| keys | eff. K bits | RoPE-logit MAE | attn KL (nats) | logit NMSE (all) | NMSE < " + str(fit_ctx) +
         " | NMSE ≥ " + str(fit_ctx) + " | PPL K-only | seeds |")
L.append("|---|---|---|---|---|---|---|---|---|")
for name in MAIN + [n for n in summary if n not in MAIN + ABL]:
    if name not in summary:
        continue
    s = summary[name]
    w = s["nmse_within_fit_ctx_buckets_mean"]
    b = s["nmse_beyond_fit_ctx_buckets_mean"]
    L.append(f"| {LABEL.get(name, name)} | {s['k_bits']['per_element']:.4f} | {pm(s['mae'])} | {pm(s['kl'], 4)} | "
             f"{pm(s['nmse'], 3, True)} | {'-' if w is None else f'{w:.3e}'} | {'-' if b is None else f'{b:.3e}'} | "
             f"{pm(s.get('ppl_k'), 3)} | {s['mae']['n']}{'' if 'ppl_k' not in s else ' / ' + str(s['ppl_k']['n'])} |")
L.append(f"\nNMSE < {fit_ctx} / ≥ {fit_ctx}: unweighted mean of the per-bucket NMSE over the buckets inside / past "
         f"the calibration window. Seeds: logit metrics / perplexity.\n")
if paired:
    L.append(f"Paired by k-means seed ({', '.join(a + ' vs ' + b for a, b in paired['pairs'])}): TaSQ − CQ K-only "
             f"perplexity {pm(paired['tasq_minus_cq_ppl_k'], 3)} (range {paired['tasq_minus_cq_ppl_k']['min']:.3f} .. "
             f"{paired['tasq_minus_cq_ppl_k']['max']:.3f}); MAE ratio TaSQ / CQ at ctx {ppl_ev['ctx']} "
             f"{pm(paired['tasq_over_cq_mae'], 3)}.\n")

L.append(f"## Attention-logit NMSE by query position (ctx {ev['ctx']}; calibration windows {fit_ctx})\n")
L.append("NMSE = Σ (q·k̂ − q·k)² / Σ (q·k)² over all layers, query heads and causal keys of the queries whose "
         "position is in the bucket (pre-softmax logits, post-RoPE; q, k from the fp32 pass). * = past the "
         "calibration window.\n")
hdr = [f"{'*' if b['begin'] >= fit_ctx else ''}{b['begin']}–{b['end'] - 1}" for b in buckets]
L.append("| keys | " + " | ".join(hdr) + " |")
L.append("|---|" + "---|" * len(hdr))
for name in MAIN + ABL[1:]:
    if name in summary:
        L.append(f"| {LABEL.get(name, name)} | " + " | ".join(pm(x, 3, True) for x in summary[name]["nmse_by_position"]) + " |")

L.append("\n## Ablations (each removes one ingredient from TaSQ; same capture, same eval)\n")
L.append("| variant | eff. K bits | RoPE-logit MAE | attn KL (nats) | logit NMSE (all) | NMSE ≥ " + str(fit_ctx) +
         " | PPL K-only | k-means |")
L.append("|---|---|---|---|---|---|---|---|")
for name in ABL:
    if name not in summary:
        continue
    s = summary[name]
    b = s["nmse_beyond_fit_ctx_buckets_mean"]
    L.append(f"| {LABEL[name]} | {s['k_bits']['per_element']:.4f} | {pm(s['mae'])} | {pm(s['kl'])} | "
             f"{pm(s['nmse'], 3, True)} | {'-' if b is None else f'{b:.3e}'} | {pm(s.get('ppl_k'), 3)} | "
             f"{s['fit']['kmeans'].split(' ')[0] if s.get('fit') else '-'}, {s['mae']['n']} seed(s) |")
if "tasq" in summary and summary["tasq"]["mae"]["n"] > 1:
    s0 = next((p for p in ev["plans"] if p["name"] in ("tasq.s0", "tasq")), None)
    if s0:
        L.append(f"\nTaSQ k-means seed 0 alone (the ablations' seed): MAE {s0['mae']['mean']:.4f}, KL "
                 f"{s0['kl']['mean']:.4f}, NMSE {s0['nmse']['mean']:.3e}.")

L.append("\n## Effective bits (keys; every per-token and per-group byte)\n")
for name in MAIN:
    if name in summary:
        kb = summary[name]["k_bits"]
        extra = f" = {kb['code']:.4f} code + {kb['metadata']:.4f} metadata" if "code" in kb else ""
        L.append(f"- {LABEL[name]}: {kb['per_element']:.4f} bits/element{extra} ({kb['what']})")
for name, fc in fixed.items():
    if name not in ("tasq", "cq", "tasq.cq"):
        continue
    am = fc["amortized_bits_per_element"]
    L.append(f"- Fixed per-plan cost of {LABEL.get(name, name)} (not per token; shared by every sequence): codebooks "
             f"{fc['codebook_bytes_fp16'] / 2**20:.2f} MiB fp16" +
             (f" + per-channel scales {fc['channel_scale_bytes_fp32']} B (fp32)" if fc["channel_scale_bytes_fp32"] else "") +
             f"; charged to ONE sequence it would add {am['2048']:.3f} / {am['32768']:.3f} / {am['131072']:.4f} "
             f"bits/element at 2K / 32K / 128K tokens.")

L.append("\n## Grouping (log det Σ of the weighted, normalized pre-RoPE keys per head)\n")
for k, g in grouping.items():
    L.append(f"- {k}: matched < contiguous RoPE pairs on {g['heads_matched_below_contiguous']}/{g['heads']} heads; "
             f"{g['layers_all_heads_below']}/{g['layers']} layers with every head below "
             f"({g['layers_sum_below']}/{g['layers']} by the layer's summed cost); mean log det "
             f"{g['mean_logdet_matched']:.2f} vs {g['mean_logdet_contiguous']:.2f}; contiguous fallbacks {g['heads_fallback']}")

fisher_fit = any(f["fit"]["kmeans"].startswith("fisher") for f in fits)
L.append(f"\n## Fit time (whole `ratekv plan` run: one capture{' + Fisher backward' if fisher_fit else ''}, all "
         f"variants and seeds)\n")
L.append(f"wall {fit_time['wall']}, user {fit_time['user_s']} s, sys {fit_time['sys_s']} s, max RSS "
         f"{fit_time['max_rss_kb']} kB{'; ' + '; '.join(fit_time['load']) if fit_time['load'] else ''}. Per plan (k-means etc. after the capture, "
         f"wall s): " + ", ".join(f"{k} {v:.0f}" for k, v in fit_time['fit_seconds_per_plan'].items()))
if fit_cq_time:
    L.append(f"\nCQ fit (separate `ratekv plan --method cq`, its own capture, no backward pass): wall "
             f"{fit_cq_time['wall']}, user {fit_cq_time['user_s']} s, sys {fit_cq_time['sys_s']} s. Per plan: " +
             ", ".join(f"{k} {v:.0f}" for k, v in fit_cq_time['fit_seconds_per_plan'].items()))
if (out / "notes.md").exists():  # hand-written reading of the run, kept beside its outputs
    L.append("\n" + (out / "notes.md").read_text().rstrip())
results.with_suffix(".md").write_text("\n".join(L) + "\n")
print("\n".join(L))

# ---------------------------------------------------------------- plot
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(8, 5))
mid = [(b["begin"] + b["end"] - 1) / 2 for b in buckets]
for name in MAIN + ABL[1:]:
    if name not in summary or name == "fp16":
        continue
    s = summary[name]["nmse_by_position"]
    m = [x["mean"] for x in s]
    sd = [x["sd"] for x in s]
    line, = ax.plot(mid, m, "o-" if name in MAIN else ".--", label=f"{LABEL[name]} ({summary[name]['k_bits']['per_element']:.3f} b)")
    if any(sd):
        ax.fill_between(mid, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], alpha=0.2,
                        color=line.get_color())
ax.axvline(fit_ctx, color="k", lw=0.8, ls=":")
ax.text(fit_ctx, ax.get_ylim()[1], f" calibration window {fit_ctx}", va="top", fontsize=8)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("query position (bucket midpoint)")
ax.set_ylabel("attention-logit NMSE (all layers, heads)")
ax.set_title(f"SmolLM2-135M keys: logit NMSE by position (ctx {ev['ctx']})")
ax.legend(fontsize=8)
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
png = results.parent / (results.name + "_nmse.png")
fig.savefig(png, dpi=110)
print(f"wrote {png}")
