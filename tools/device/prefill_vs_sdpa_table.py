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
Refused (exit 2, naming the file, row index and field): a ratekv model that is not the torch
side's (other shapes); the same (prompt, chunk, cache) twice on the ratekv side (one file or two);
two torch-side rows of one kind, prompt and chunk; JSON nested deeper than MAX_DEPTH; a non-finite
number anywhere in an input (NaN, Infinity, 1e999: the combined JSON is strict, allow_nan=False)
or a ratio that overflows; any field read of the wrong type: rows / meta / meta.shapes not
objects, a shape key missing, prompt / chunk / test pp<N> not whole numbers (> 0; chunk ≥ 0),
tok/s and ms not finite numbers > 0, error / model / cache / device_name / device not strings,
backends_seen not a list of strings, a torch-side kind or mode that is not one of its own;
--out / --md a directory or in a directory that does not exist (before anything is read or
written). Exit 1 when no input has a row. Nothing is written on a refusal.

Usage: prefill_vs_sdpa_table.py --ratekv A.json [B.json ...] --torch T.json --out OUT.json [--md OUT.md]
Prints the markdown (also written to --md).
"""
import argparse
import json
import math
import os
import re
import sys

CACHES = ("fp16", "K3V3")
ATTN_KIND, HF_KIND = "sdpa-flash-attn", "hf-sdpa-prefill"
SHAPE_KEYS = ("hq", "hkv", "d", "layers", "d_model", "ffn")
MAX_DEPTH = 64  # JSON nesting; the inputs nest 4 deep


class BadInput(Exception):
    """An input file that cannot be read as the expected JSON, or inputs that do not belong together."""


def _scan(path, doc):
    """BadInput for nesting deeper than MAX_DEPTH or a non-finite number (NaN, Infinity, 1e999)
    anywhere in doc, naming the file and the place (rows[3].prefill_tok_s). Iterative: no recursion."""
    stack = [(doc, "", 0)]
    while stack:
        v, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadInput(f"{path}: nested deeper than {MAX_DEPTH} levels at {where or 'the top'}")
        if isinstance(v, float) and not math.isfinite(v):
            raise BadInput(f"{path}: {where or 'the document'}: non-finite number {v!r}")
        if isinstance(v, dict):
            stack.extend((x, f"{where}.{k}" if where else str(k), depth + 1) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))


def load(path):
    """The JSON document at path (a dict with a list "rows"), None when the file does not exist.
    BadInput (naming the file) for unreadable or invalid JSON, nesting deeper than MAX_DEPTH, a
    non-finite number anywhere (NaN / Infinity / an overflowing literal: the output is strict JSON)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            doc = json.load(f)
    except RecursionError:
        raise BadInput(f"{path}: not readable JSON (nested too deeply)")
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not readable JSON ({e})")
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise BadInput(f"{path}: no list 'rows' (expected `ratekv bench -o json` or prefill_vs_sdpa.py output)")
    _scan(path, doc)
    return doc


def _bad(path, field, expected, value):
    return BadInput(f"{path}: {field}: expected {expected}, got {json.dumps(value)[:80]}")


def _get(path, obj, where, key, check, expected, default=None):
    """obj[key] when check(value) holds, default when the key is absent; BadInput naming
    path, where.key and what was expected otherwise (null counts as present)."""
    if key not in obj:
        return default
    v = obj[key]
    if not check(v):
        raise _bad(path, f"{where}.{key}" if where else key, expected, v)
    return v


def is_str(v):
    return isinstance(v, str)


def is_count(v):
    """A whole number ≥ 0 (JSON integer, not a bool or 2048.0)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def is_positive_int(v):
    return is_count(v) and v > 0


def is_positive_number(v):
    """A finite number > 0 (not a bool or a string)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def is_str_list(v):
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


STR, COUNT, POS_INT, POS_NUM = ((is_str, "a string"), (is_count, "a whole number >= 0"),
                                (is_positive_int, "a whole number > 0"),
                                (is_positive_number, "a finite number > 0"))


def _row(path, rows, i):
    r = rows[i]
    if not isinstance(r, dict):
        raise _bad(path, f"rows[{i}]", "an object", r)
    return r


def ratekv_rows(docs):
    """{(prompt, chunk): {cache: row}} of the pp rows (fp16 and K3V3) of (path, doc) pairs; the
    ratekv model name(s) seen. Rows of other tests (tg...) or caches are skipped. BadInput, naming
    the file, row index and field, for a (prompt, chunk, cache) twice (in one file or two), a test
    "pp..." that is not pp<whole number > 0>, a chunk that is not a whole number >= 0, a
    prefill_tok_s / ttft_ms that is not a finite number > 0, an error that is not a string, a row
    with neither prefill_tok_s nor error, a doc device_name / row model / cache / prefill_mode that
    is not a string."""
    out, models, where = {}, set(), {}
    for path, doc in docs:
        _get(path, doc, "", "device_name", *STR)
        for i, r in enumerate(doc["rows"]):
            r = _row(path, doc["rows"], i)
            at = f"rows[{i}]"
            test = _get(path, r, at, "test", *STR, default="")
            cache = _get(path, r, at, "cache", *STR)
            model = _get(path, r, at, "model", *STR, default="")
            _get(path, r, at, "prefill_mode", *STR)
            if not test.startswith("pp") or cache not in CACHES:
                continue
            m = re.fullmatch(r"pp([1-9][0-9]*)", test)
            if not m:
                raise _bad(path, f"{at}.test", "pp<prompt tokens, a whole number > 0>", test)
            key = (int(m.group(1)), _get(path, r, at, "chunk", *COUNT, default=0))
            tok_s = _get(path, r, at, "prefill_tok_s", *POS_NUM)
            _get(path, r, at, "ttft_ms", *POS_NUM)
            err = _get(path, r, at, "error", *STR)
            if tok_s is None and err is None:
                raise BadInput(f"{path}: {at} ({test} {cache}) has neither prefill_tok_s nor error")
            slot = out.setdefault(key, {})
            if cache in slot:
                raise BadInput(f"prompt {key[0]} chunk {key[1]} cache {cache} is in both {where[key + (cache,)]}"
                               f" and {path} {at}")
            slot[cache] = r
            where[key + (cache,)] = f"{path} {at}"
            models.add(model)
    return out, models


def torch_meta(path, doc):
    """doc["meta"] checked: an object whose model / device / torch / date are strings and whose
    shapes (when there) hold SHAPE_KEYS as whole numbers > 0; {} without a doc or a meta key."""
    if not doc:
        return {}
    meta = _get(path, doc, "", "meta", lambda v: isinstance(v, dict), "an object", default={})
    for k in ("model", "device", "torch", "date"):
        _get(path, meta, "meta", k, *STR)
    sh = _get(path, meta, "meta", "shapes", lambda v: isinstance(v, dict), "an object")
    if sh is not None:
        for k in SHAPE_KEYS:
            if k not in sh:
                raise BadInput(f"{path}: meta.shapes.{k}: missing (expected a whole number > 0)")
            _get(path, sh, "meta.shapes", k, *POS_INT)
    return meta


def torch_rows(path, doc, model=None):
    """({(prompt, chunk): row} of the attention rows, the same of the HF rows). BadInput, naming
    the file, row index and field, for: a row that is not an object, a kind other than the two, a
    prompt not a whole number > 0, a chunk not a whole number >= 0, a mode other than "one piece" /
    "chunks of <chunk>", a model other than meta's, ms_per_layer / ms_all_layers / tok_s / ttft_ms
    not a finite number > 0, an error not a string, backends_seen not a list of strings, a row with
    neither its numbers nor an error, two rows of one kind, prompt and chunk."""
    attn, hf, first = {}, {}, {}
    for i, r in enumerate(doc["rows"] if doc else []):
        r = _row(path, doc["rows"], i)
        at = f"rows[{i}]"
        kind = r.get("kind")
        if kind not in (ATTN_KIND, HF_KIND):
            raise _bad(path, f"{at}.kind", f"{ATTN_KIND!r} or {HF_KIND!r}", kind)
        if "prompt" not in r or "chunk" not in r:
            raise BadInput(f"{path}: {at}: torch-side row without a numeric prompt and chunk")
        key = (_get(path, r, at, "prompt", *POS_INT), _get(path, r, at, "chunk", *COUNT))
        mode = _get(path, r, at, "mode", *STR)
        if mode is not None and mode != ("one piece" if key[1] == 0 else f"chunks of {key[1]}"):
            raise _bad(path, f"{at}.mode", f"the mode of chunk {key[1]}", mode)
        rmodel = _get(path, r, at, "model", *STR)
        if rmodel is not None and model and rmodel != model:
            raise _bad(path, f"{at}.model", f"meta.model {model!r}", rmodel)
        err = _get(path, r, at, "error", *STR)
        fields = ("ms_per_layer", "ms_all_layers") if kind == ATTN_KIND else ("tok_s", "ttft_ms")
        vals = [_get(path, r, at, f, *POS_NUM) for f in fields]
        if kind == HF_KIND:
            _get(path, r, at, "backends_seen", is_str_list, "a list of strings")
        if None in vals and err is None:
            raise BadInput(f"{path}: {at} has neither {' and '.join(fields)} nor error")
        if (kind,) + key in first:
            raise BadInput(f"{path}: {first[(kind,) + key]} and {at} are both {kind} prompt {key[0]} chunk {key[1]} "
                           f"(a torch-side file holds one row per kind, prompt and chunk)")
        first[(kind,) + key] = at
        (attn if kind == ATTN_KIND else hf)[key] = r
    return attn, hf


def ratio(a, b, what):
    """a / b (None when either is missing); BadInput when it is not finite (overflow)."""
    if a is None or not b:
        return None
    q = a / b
    if not math.isfinite(q):
        raise BadInput(f"{what}: {a!r} / {b!r} is not finite")
    return q


def build(ratekv_docs, torch_doc):
    """The table rows and the header facts (same shapes / GPU / run) of the loaded inputs."""
    rk, models = ratekv_rows(ratekv_docs)
    tpath, torch_doc = torch_doc if torch_doc else (None, None)
    tmeta = torch_meta(tpath, torch_doc)
    attn, hf = torch_rows(tpath, torch_doc, tmeta.get("model"))
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
               "fp16_over_hf": ratio(f16, h.get("tok_s"), f"prompt {prompt} chunk {chunk} fp16 / HF tok/s"),
               "K3V3_over_hf": ratio(k3, h.get("tok_s"), f"prompt {prompt} chunk {chunk} K3V3 / HF tok/s")}
        row["flash_share_of_fp16_ttft"] = ratio(row["sdpa_flash_attn_ms_all_layers"], row["ratekv_fp16_ttft_ms"],
                                                f"prompt {prompt} chunk {chunk} flash ms / fp16 TTFT")
        if row["flash_share_of_fp16_ttft"] is not None and not math.isfinite(100 * row["flash_share_of_fp16_ttft"]):
            raise BadInput(f"prompt {prompt} chunk {chunk}: flash share of fp16 TTFT is not finite in percent")
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


def check_out(ap, flag, path):
    """ap.error (exit 2, naming the flag) when path is a directory or its directory does not exist:
    checked before any input is read, so nothing is written on a refusal."""
    if path is None:
        return
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        ap.error(f"{flag} {path!r} is a directory (expected a file to write)")
    if not os.path.isdir(d):
        ap.error(f"{flag} {path!r}: directory {d!r} does not exist")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ratekv", nargs="+", default=[], help="ratekv bench -o json files")
    ap.add_argument("--torch", help="prefill_vs_sdpa.py output")
    ap.add_argument("--out", required=True, help="combined JSON (strict: no NaN / Infinity); its directory must exist")
    ap.add_argument("--md", help="also write the markdown here; its directory must exist")
    a = ap.parse_args(argv)
    check_out(ap, "--out", a.out)
    check_out(ap, "--md", a.md)
    try:
        missing = [p for p in a.ratekv + ([a.torch] if a.torch else []) if not os.path.exists(p)]
        rk_docs = [(p, d) for p in a.ratekv for d in [load(p)] if d is not None]
        tdoc = load(a.torch) if a.torch else None
        rows, facts = build(rk_docs, (a.torch, tdoc) if tdoc is not None else None)
        if not rows:
            print(f"prefill_vs_sdpa_table: no row in any input (missing: {missing or 'none'})", file=sys.stderr)
            return 1
        text = markdown(rows, facts, missing)
        try:
            combined = json.dumps({"facts": facts, "table": rows, "missing": missing, "ratekv": dict(rk_docs),
                                   "torch": tdoc}, indent=1, allow_nan=False)
        except ValueError as e:  # the inputs were scanned: a number computed here that is not finite
            raise BadInput(f"the combined JSON would not be strict JSON ({e})")
    except BadInput as e:
        print(f"prefill_vs_sdpa_table: {e}", file=sys.stderr)
        return 2
    for flag, path, content in (("--out", a.out, combined), ("--md", a.md, text)):
        if path is None:
            continue
        try:
            with open(path, "w") as f:
                f.write(content)
        except OSError as e:
            print(f"prefill_vs_sdpa_table: {flag}: cannot write {path!r} ({e})", file=sys.stderr)
            return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
