#!/usr/bin/env python3
"""Issue 18's table: ratekv's GPU prefill against torch SDPA flash / HF+SDPA prefill, one run.

Inputs: `ratekv bench --device cuda -o json` files (pp<p> rows; caches fp16 and K3V3; "chunk" 0 =
one piece) and the JSON of tools/device/prefill_vs_sdpa.py (kinds sdpa-flash-attn and
hf-sdpa-prefill). A named file that does not exist is listed under "missing" (its stage stopped
before writing it); a file that is not such JSON is refused (exit 2, naming it).
One table row per (prompt, chunk) that any input has:
  ratekv fp16 / K3V3 tok/s   prefill_tok_s of the bench rows
  HF+SDPA tok/s              tok_s of the hf row (prompt / time to first token), its backends seen
  fp16 / HF, K3V3 / HF       ratekv tok/s over HF tok/s
  SDPA-flash ms/layer        one layer's causal attention alone (fp16), and × layers
  flash share of fp16 TTFT   SDPA-flash attention of all layers / ratekv fp16's time to first token:
                             the part of ratekv's prefill time that flash attention alone would take
                             (ratekv cannot time its own prefill attention: bench --profile covers
                             the decode step only)
Refused (exit 2): a ratekv model that is not the torch side's (other shapes), the same (prompt,
chunk, cache) in two ratekv files. Exit 1 when no input has a row.

Usage: prefill_vs_sdpa_table.py --ratekv A.json [B.json ...] --torch T.json --out OUT.json [--md OUT.md]
Prints the markdown (also written to --md).
"""
import argparse
import json
import os
import sys

CACHES = ("fp16", "K3V3")


class BadInput(Exception):
    """An input file that cannot be read as the expected JSON, or inputs that do not belong together."""


def load(path):
    """The JSON document at path (a dict with a list "rows"), None when the file does not exist."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not readable JSON ({e})")
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise BadInput(f"{path}: no list 'rows' (expected `ratekv bench -o json` or prefill_vs_sdpa.py output)")
    return doc


def ratekv_rows(docs):
    """{(prompt, chunk): {cache: row}} of the pp rows (fp16 and K3V3) of (path, doc) pairs; the
    ratekv model name(s) seen. BadInput for a (prompt, chunk, cache) in two files or a bad row."""
    out, models, where = {}, set(), {}
    for path, doc in docs:
        for r in doc["rows"]:
            test = str(r.get("test", ""))
            if not test.startswith("pp") or r.get("cache") not in CACHES:
                continue
            try:
                key = (int(test[2:]), int(r.get("chunk", 0)))
            except ValueError:
                raise BadInput(f"{path}: row test {test!r} / chunk {r.get('chunk')!r} is not pp<prompt> / a number")
            if "prefill_tok_s" not in r and "error" not in r:
                raise BadInput(f"{path}: row {test} {r['cache']} has neither prefill_tok_s nor error")
            slot = out.setdefault(key, {})
            if r["cache"] in slot:
                raise BadInput(f"prompt {key[0]} chunk {key[1]} cache {r['cache']} is in both {where[key + (r['cache'],)]}"
                               f" and {path}")
            slot[r["cache"]] = r
            where[key + (r["cache"],)] = path
            models.add(str(r.get("model", "")))
    return out, models


def torch_rows(doc):
    """({(prompt, chunk): row} of the attention rows, the same of the HF rows)."""
    attn, hf = {}, {}
    for r in doc["rows"] if doc else []:
        try:
            key = (int(r["prompt"]), int(r["chunk"]))
        except (KeyError, TypeError, ValueError):
            raise BadInput(f"torch-side row without a numeric prompt and chunk: {str(r)[:200]}")
        if r.get("kind") == "sdpa-flash-attn":
            attn[key] = r
        elif r.get("kind") == "hf-sdpa-prefill":
            hf[key] = r
    return attn, hf


def ratio(a, b):
    return a / b if a is not None and b else None


def build(ratekv_docs, torch_doc):
    """The table rows and the header facts (same shapes / GPU / run) of the loaded inputs."""
    rk, models = ratekv_rows(ratekv_docs)
    attn, hf = torch_rows(torch_doc)
    tmeta = torch_doc.get("meta", {}) if torch_doc else {}
    tmodel = tmeta.get("model")
    if tmodel:
        other = sorted(m for m in models if not m.startswith(tmodel))
        if other:
            raise BadInput(f"not the same shapes: ratekv model(s) {other}, torch side {tmodel!r}")
    rk_gpus = sorted({d.get("device_name", "") for _, d in ratekv_docs} - {""})
    gpus = sorted(set(rk_gpus) | ({tmeta["device"]} if tmeta.get("device") else set()))
    rows = []
    for key in sorted(set(rk) | set(attn) | set(hf)):
        prompt, chunk = key
        c = rk.get(key, {})
        f16, k3 = (c.get(n, {}).get("prefill_tok_s") for n in CACHES)
        a, h = attn.get(key, {}), hf.get(key, {})
        row = {"prompt": prompt, "chunk": chunk, "ratekv_fp16_tok_s": f16, "ratekv_K3V3_tok_s": k3,
               "ratekv_fp16_ttft_ms": c.get("fp16", {}).get("ttft_ms"),
               "hf_sdpa_tok_s": h.get("tok_s"), "hf_sdpa_ttft_ms": h.get("ttft_ms"),
               "hf_backends_seen": h.get("backends_seen"),
               "sdpa_flash_attn_ms_per_layer": a.get("ms_per_layer"),
               "sdpa_flash_attn_ms_all_layers": a.get("ms_all_layers"),
               "fp16_over_hf": ratio(f16, h.get("tok_s")), "K3V3_over_hf": ratio(k3, h.get("tok_s"))}
        row["flash_share_of_fp16_ttft"] = ratio(row["sdpa_flash_attn_ms_all_layers"], row["ratekv_fp16_ttft_ms"])
        errors = {n: c[n]["error"] for n in CACHES if "error" in c.get(n, {})}
        errors.update({k: r["error"] for k, r in (("hf", h), ("attn", a)) if "error" in r})
        if errors:
            row["errors"] = errors
        rows.append(row)
    modes = sorted({str(r.get("prefill_mode")) for c in rk.values() for r in c.values() if r.get("prefill_mode")})
    facts = {"model": tmodel or (sorted(models)[0] if models else None), "shapes": tmeta.get("shapes"),
             "ratekv_prefill_modes": modes,
             "gpus": gpus, "same_gpu": len(gpus) == 1, "torch": tmeta.get("torch"), "date": tmeta.get("date")}
    return rows, facts


def fmt(v, p=0, suffix=""):
    if v is None:
        return "—"
    return f"{v:,.{p}f}".replace(",", " ") + suffix


def markdown(rows, facts, missing):
    """The markdown: a header stating shapes / GPU / run, the table, then errors and missing files."""
    sh = facts.get("shapes") or {}
    shape = (f"Same shapes ({sh['hq']} query / {sh['hkv']} KV heads, head_dim {sh['d']}, {sh['layers']} layers, "
             f"d_model {sh['d_model']}, ffn {sh['ffn']})" if sh else "Shapes not recorded (no torch-side file)")
    gpu = (f"same GPU ({facts['gpus'][0]})" if facts["same_gpu"]
           else f"GPUs differ or unknown: {facts['gpus'] or 'none recorded'}")
    out = [f"### Prefill: ratekv vs torch SDPA flash / HF+SDPA ({facts.get('model')})", "",
           f"{shape}; {gpu}; same run (one device call, stage prefill_vs_sdpa"
           f"{', ' + facts['date'] if facts.get('date') else ''}; torch {facts.get('torch') or '—'}). "
           f"ratekv: synthetic bf16 weights, {'/'.join(facts['ratekv_prefill_modes']) or '—'} prefill; HF: random bf16 weights, attn_implementation=sdpa, "
           "logits of the last token; attention alone: one layer, fp16, enable_gqa. The ratekv side is end to end "
           "only (it cannot time its prefill attention per layer).", "",
           "| prompt | prefill | ratekv fp16 tok/s | ratekv K3V3 tok/s | HF+SDPA tok/s (backends) | fp16 / HF | "
           "K3V3 / HF | SDPA-flash attention ms/layer (× layers) | flash share of fp16 TTFT |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        be = "/".join(r["hf_backends_seen"]) if r.get("hf_backends_seen") else ""
        hf = fmt(r["hf_sdpa_tok_s"]) + (f" ({be})" if be and r["hf_sdpa_tok_s"] is not None else "")
        attn = (f"{fmt(r['sdpa_flash_attn_ms_per_layer'], 2)} ({fmt(r['sdpa_flash_attn_ms_all_layers'], 0)})"
                if r["sdpa_flash_attn_ms_per_layer"] is not None else "—")
        out.append(f"| {r['prompt']} | {'one piece' if r['chunk'] == 0 else 'chunks of ' + str(r['chunk'])} | "
                   f"{fmt(r['ratekv_fp16_tok_s'])} | {fmt(r['ratekv_K3V3_tok_s'])} | {hf} | "
                   f"{fmt(r['fp16_over_hf'], 2, 'x')} | {fmt(r['K3V3_over_hf'], 2, 'x')} | {attn} | "
                   f"{fmt(None if r['flash_share_of_fp16_ttft'] is None else 100 * r['flash_share_of_fp16_ttft'], 0, ' %')} |")
    for r in rows:
        for who, e in r.get("errors", {}).items():
            out.append(f"- {r['prompt']} {'one piece' if r['chunk'] == 0 else 'chunks of ' + str(r['chunk'])}, "
                       f"{who}: error {e[:200]}")
    for m in missing:
        out.append(f"- missing: {m} (its command stopped before writing it)")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ratekv", nargs="+", default=[], help="ratekv bench -o json files")
    ap.add_argument("--torch", help="prefill_vs_sdpa.py output")
    ap.add_argument("--out", required=True, help="combined JSON")
    ap.add_argument("--md", help="also write the markdown here")
    a = ap.parse_args(argv)
    try:
        missing = [p for p in a.ratekv + ([a.torch] if a.torch else []) if not os.path.exists(p)]
        rk_docs = [(p, d) for p in a.ratekv for d in [load(p)] if d is not None]
        tdoc = load(a.torch) if a.torch else None
        rows, facts = build(rk_docs, tdoc)
    except BadInput as e:
        print(f"prefill_vs_sdpa_table: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"prefill_vs_sdpa_table: no row in any input (missing: {missing or 'none'})", file=sys.stderr)
        return 1
    text = markdown(rows, facts, missing)
    with open(a.out, "w") as f:
        json.dump({"facts": facts, "table": rows, "missing": missing, "ratekv": dict(rk_docs), "torch": tdoc}, f,
                  indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
