#!/usr/bin/env python3
"""The quality panel of issue 22: ratekv's plans and the caches users run, per model, at equal
stored bytes, as a grid of resumable cells (docs/quality_results.md).

  tools/quality_panel.py run    --out DIR [--models qwen15,qwen05,smollm2] [--only REGEX] [--dry-run]
  tools/quality_panel.py report --out DIR [--md F.md] [--json F.json] [--png F.png]
  tools/quality_panel.py status --out DIR

A cell is one unit of work with one output file under DIR/<model>/: a calibration, a plan, an
evaluation of one plan (`ratekv eval`, every seed), one llama.cpp run (`llama-perplexity` with its
own -ctk/-ctv cache types). Each output records the parameters it was made with ("params"); `run`
skips a cell whose output exists with the same parameters (a plan that changed re-runs its
evaluation: the plan file's sha256 is a parameter), so an interrupted or extended grid resumes.
Evaluations share one reference cache per model (`ratekv eval --reference-cache`: the fp16-cache
logits and fp32 activations of each window, computed once). A cell file that is not valid JSON (an
interrupted write) is named on stderr and counts as unfinished: `run` re-runs it, `status` lists it as
unfinished, `report` leaves it out and says so; so is a cell holding null / a list, a cell lacking a field the
report reads or holding a value of the wrong type there, a truncated plan or statistics file, and a side cell
(side/side.json) without every side plan or with a KLD that is not a positive finite number (no key weight is
derived from it; the key-weighted RateQuant cells wait). One predicate decides "finished" for run, status and
report (cell_done / use_cell). A non-finite perplexity is null in the JSON (the row's "ppl_status" says what it
was) and "nan (failed)" in the table; a reseeded run (evalr/) with a non-finite perplexity or other stored bits is
left out of its row's seeds (named; counted in ppl_status); a failed fp16 reference makes ΔPPL "n/a". `run` exits 1
when a cell failed ("N of M cells failed"; a cell whose command exits 0 but leaves an output that is not usable
fails, run once per pass; so does a reseed cell whose plan file is not a plan), 2 when --only matches no cell, 130
on Ctrl-C (the current cell stays unfinished; `status` and `report` also exit 130 with one line).

Environment: RATEKV_BIN (ratekv binary, default build/bin/ratekv), RATEKV_ASSETS (default
~/.cache/ratekv/assets), RATEKV_LLAMA_BIN (llama.cpp binaries, default ~/.cache/ratekv/llama-build/bin),
RATEKV_NICE (default 10), RATEKV_PANEL_THREADS (llama.cpp threads, default 2).
Stdlib only for `run`/`status`; `report --png` needs matplotlib.
"""
import argparse
import hashlib
import json
import math
import os
import re
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ASSETS = os.environ.get("RATEKV_ASSETS", os.path.expanduser("~/.cache/ratekv/assets"))
RATEKV = os.environ.get("RATEKV_BIN", os.path.join(REPO, "build", "bin", "ratekv"))
LLAMA = os.environ.get("RATEKV_LLAMA_BIN", os.path.expanduser("~/.cache/ratekv/llama-build/bin"))
NICE = os.environ.get("RATEKV_NICE", "10")
THREADS = os.environ.get("RATEKV_PANEL_THREADS", "2")

# name -> (GGUF file, head_dim, uses BOS)
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", 64),
    "qwen05": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 64),
    "qwen15": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 128),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", 256),
}
CALIB_TOKENS = 4096   # calibration statistics (energies, key means, curves)
SENS_SEQS = 4         # gradient sensitivity: sequences of 512 tokens
EVAL_TOKENS = 4096    # 8 windows of 512
CTX = 512
SEEDS = 3

# Per-model protocol. Qwen2.5-Coder-1.5B (fp32 weights, 7 GB) runs one 512-token forward in minutes on the
# shared 2-core machine, so its grid is cut: calibration on 1024 tokens without the gradient sensitivity
# and RateQuant curves (no RateQuant rows), one rotation seed per perplexity cell, and the per-layer
# attention MAE of every TQ plan at 3 seeds from one `eval --no-ppl` cell (it replays the reference
# cache's activations: no forward pass). Every row states its seeds and windows.
PROTOCOL = {
    "smollm2": {"calib_tokens": CALIB_TOKENS, "sens_seqs": SENS_SEQS, "curves": "tq-mse,block-gtq,kivi",
                "ppl_seeds": SEEDS, "ratequant": True,
                # issue 21's Block-GTQ vs uniform and issue 22's RateQuant-over-KIVI target first
                "order": ["calibrate", "plan/", "eval/gtq+off-K3", "eval/uniform-K3", "eval/gtq-K3", "mae/",
                          "eval/ratequant-kivi", "eval/uniform-kivi", "eval/uniform-K2", "eval/gtq-K2",
                          "eval/gtq+off-K4", "eval/gtq+off-K2", "eval/uniform-K4", "eval/q4_0", "eval/q8_0",
                          "eval/kivi", "eval/ratequant", "eval/uniform+off", "eval/gtq-K4", "llama/", "fit/",
                          "eval/tasq", "eval/cq"]},
    # Qwen2.5-Coder-0.5B (head_dim 64: Block-GTQ + offset at b bits stores b + 1/4, the whole budget): cut like
    # qwen15's — 2048 calibration tokens without the gradient sensitivity and curves (no RateQuant rows), one
    # seed per cell and seeds 1..2 of the key-offset rows in their own cells (seeds_more); TaSQ / CQ K-only rows.
    "qwen05": {"calib_tokens": 2048, "sens_seqs": 0, "curves": None, "ppl_seeds": 1, "ratequant": False,
               "llama": False, "tasq": True, "tasq_nn": True, "ratequant_kivi": True,  # TaSQ's fp16 scale is 1/8 bit here (2 x 64 channels)
               "seeds_more": ["gtq+off-K3V3", "gtq+off-K2V2", "gtq+off-K4V4"],
               "order": ["calibrate", "plan/", "eval/gtq+off-K3", "fit/", "eval/tasq-s0", "eval/cq-s0", "eval/tasq-s1",
                         "eval/cq-s1", "eval/tasq-s2", "eval/cq-s2", "eval/gtq+off-K2", "eval/gtq+off-K4",
                         "eval/uniform-K3", "eval/uniform-K2", "eval/uniform-K4", "eval/tasq-nn", "rq/", "eval/ratequant-kivi",
                         "eval/uniform-kivi", "reseed/", "evalr/gtq+off-K3",
                         "evalr/gtq+off-K2", "evalr/gtq+off-K4", "eval/gtq-K3", "eval/q4_0", "eval/kivi", "eval/q8_0"]},
    # RateQuant over KIVI (rq/ cells): its own calibration with 2 sensitivity sequences of 512 (backward passes).
    "qwen15": {"calib_tokens": 1024, "sens_seqs": 0, "curves": None, "ppl_seeds": 1, "ratequant": False,
               "ratequant_kivi": True, "rq_sens_seqs": 2, "side_tokens": 1024,  # the sensitivity's 2 x 512 tokens
               # TaSQ / CQ K-only rows: at d = 128 TaSQ's fp16 scale is 1/16 bit (2 x 128 channels): 1.3125 stored b
               "llama": False, "tasq": True,
               # rows re-run at SEEDS seeds once every 1-seed row is done (eval3/<row>.json replaces eval/<row>.json)
               # (cells the grid left unrun; run seeds 1.. of a finished 1-seed row with "seeds_more" instead)
               "seeds3": ["gtq+off-full-4.25", "gtq+off-K3V3", "gtq+off-K4V4", "gtq+off-K2V2", "uniform-K3V3", "gtq-K3V3"],
               # per-layer MAE cell: these plans only (18 plans x 3 seeds of d=128 attention is slow here)
               "mae_plans": ["uniform-K2V2", "gtq-K2V2", "uniform+off-K2V2", "gtq+off-K2V2",
                             "uniform-K3V3", "gtq-K3V3", "uniform+off-K3V3", "gtq+off-K3V3", "uniform+nc-K3V3",
                             "gtq+offonly-K3V3", "gtq+off+sink1-K3V3", "uniform-K4V4", "gtq+off-K4V4"],
               # run seeds 1..SEEDS-1 of these 1-seed rows as their own cells (evalr/<row>.r<s>.json, one
               # reseeded plan each, as `eval --seeds` re-mixes seed r); the report merges them with eval/<row>.json
               "seeds_more": ["gtq+off-full-3.25", "gtq+off-full-2.25", "gtq+off-K3V3", "gtq+off-K2V2"],
               "skip_eval": ["gtq-K4V4"],
               # keys vs values: K-only perplexity (V fp32) of these rows (evalk/<row>.json)
               "k_only": ["gtq+off-K3V3", "uniform-K3V3"]},  # Block-GTQ at K4V4 allocates 4 bits to every block: uniform-K4V4
    "gemma3": {"calib_tokens": CALIB_TOKENS, "sens_seqs": SENS_SEQS, "curves": "tq-mse,block-gtq,kivi",
               "ppl_seeds": SEEDS, "ratequant": True},
}
MAE_SEEDS = 3
MAE_QUERY_STRIDE = 4
# llama.cpp's own caches on Qwen2.5-Coder-1.5B, eval.txt, 8 windows of 512, -fa on, as issue 22 states them
# (llama-perplexity --kl-divergence; not re-run here: the panel's CPU time went to ratekv's rows).
ISSUE_LLAMA = {
    "qwen15": [("llama.cpp f16 (issue 22)", 16.0, 8.09, 0.0, 1.0),
               ("llama.cpp q8_0 (issue 22)", 8.5, 8.11, 0.0032, 0.972),
               ("llama.cpp q4_0 (issue 22)", 4.5, 2080.0, 5.79, 0.054),
               ("llama.cpp q4_0 no rotation (issue 22)", 4.5, 625.0, None, None)],
}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def atomic_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


UNREADABLE = []  # (path, why) of every cell file that could not be used (named on stderr once each)


class BadCell(ValueError):
    """A cell file whose content the panel cannot use: `why` names the field and what was expected."""


def load_json(path):
    """The JSON object at `path`, or None when it is not valid JSON (what an interrupted cell leaves: a truncated
    write), is not a JSON object (null, a list) or cannot be read (permissions): the file is named on stderr once,
    recorded in UNREADABLE, and the caller treats its cell as unfinished (`run` re-runs it, `status` lists it
    unfinished, `report` leaves it out)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        note_unreadable(path, f"not valid JSON ({e})")
        return None
    except OSError as e:
        note_unreadable(path, f"cannot be read ({e.strerror})", cause="permission")
        return None
    if not isinstance(doc, dict):
        note_unreadable(path, f"not a JSON object (it holds {json.dumps(doc)[:40]}); expected a cell's object",
                        cause="content")
        return None
    return doc


def note_unreadable(path, why, cause="interrupted"):
    """Names an unusable cell file on stderr (once) and records it in UNREADABLE. cause: "interrupted" (not valid
    JSON: what an interrupted write leaves), "permission" (the file cannot be read) or "content" (valid JSON whose
    content is not a finished cell's: a field missing or of the wrong type)."""
    if all(p != path for p, _ in UNREADABLE):
        UNREADABLE.append((path, why))
        tail = {"interrupted": "an interrupted cell leaves such a file: its cell counts as unfinished",
                "permission": "check the file's permissions; its cell counts as unfinished",
                "content": "its cell counts as unfinished (`run` re-runs it)"}[cause]
        print(f"quality_panel: {path}: {why}; {tail}", file=sys.stderr, flush=True)


def number(x, field, finite=False, none=False, positive=False):
    """x when it is a JSON number (not a bool; finite / > 0 when asked; None allowed with none=True), else BadCell
    naming `field` and what was expected."""
    if x is None and none:
        return x
    ok = isinstance(x, (int, float)) and not isinstance(x, bool)
    if ok and (finite or positive) and not math.isfinite(x):
        ok = False
    if ok and positive and not x > 0:
        ok = False
    if not ok:
        want = "a " + ("positive " if positive else "") + ("finite " if finite or positive else "") + "number" + (
            " or null" if none else "")
        raise BadCell(f"{field} is {json.dumps(x)[:40] if not isinstance(x, float) else x}; expected {want}")
    return x


def numbers(v, field, none=False):
    """v when it is a list of JSON numbers (None allowed with none=True), else BadCell naming `field`."""
    if v is None and none:
        return v
    if not isinstance(v, list):
        raise BadCell(f"{field} is {json.dumps(v)[:40]}; expected a list of numbers")
    for i, x in enumerate(v):
        number(x, f"{field}[{i}]", none=True)
    return v


def finite_or_none(x):
    """x with every NaN / ±inf float replaced by None (JSON null): the report's JSON is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x


# --------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------

def plan_rows(model, d):
    """(row name, `ratekv plan` arguments after --stats, modes) of the plans of one model.
    modes: "kv" (K+V perplexity) or "k" (K only). Budgets: K b V b code bits; Block-GTQ's tile-priced
    allocator stores at most uniform TQ-MSE's bytes at the same code budget (the report states both)."""
    rows = []
    rq = PROTOCOL[model]["ratequant"]
    for b in (2, 3, 4):
        code = ["--budget-unit", "code"]
        tag = f"K{b}V{b}"
        rows.append((f"uniform-{tag}", ["--method", "uniform", "--kbits", str(b), "--vbits", str(b)] + code, "kv"))
        rows.append((f"gtq-{tag}", ["--method", "block-gtq", "--kbits", str(b), "--vbits", str(b)] + code, "kv"))
        if rq:
            rows.append((f"ratequant-{b}", ["--method", "ratequant", "--bits", str(b)] + code, "kv"))
            rows.append((f"ratequant+gtq-{b}", ["--method", "ratequant+block-gtq", "--bits", str(b)] + code, "kv"))
        # The study's plans (docs/quality_results.md): pre-RoPE key offset (calibrated key mean) and norm
        # correction, on uniform TQ-MSE and on Block-GTQ (allocated on the centered energies).
        rows.append((f"uniform+off-{tag}", ["--method", "uniform", "--kbits", str(b), "--vbits", str(b),
                                            "--key-offset", "mean", "--norm-correction"] + code, "kv"))
        rows.append((f"gtq+off-{tag}", ["--method", "block-gtq", "--kbits", str(b), "--vbits", str(b),
                                        "--key-offset", "mean", "--norm-correction"] + code, "kv"))
        # Ablations (the MAE cell only): each half of the "+off" plans alone.
        rows.append((f"uniform+nc-{tag}", ["--method", "uniform", "--kbits", str(b), "--vbits", str(b),
                                           "--norm-correction"] + code, "mae"))
        rows.append((f"gtq+offonly-{tag}", ["--method", "block-gtq", "--kbits", str(b), "--vbits", str(b),
                                            "--key-offset", "mean"] + code, "mae"))
        # The whole stored budget b + 1/4 (mean over K and V): keys b + 3/8 with Block-GTQ (5-bit blocks
        # allowed at b = 4), values b + 1/8 (uniform b-bit TQ-MSE and its norm), key offsets and norm correction.
        if d == 128:  # (the split b + 3/8, b + 1/8 is d = 128's: TQ-MSE's fp16 norm is 1/8 bit there)
          rows.append((f"gtq+off-full-{b}.25", ["--method", "block-gtq", "--kbits", f"{b}.375", "--vbits", f"{b}.125",
                                              "--key-offset", "mean", "--norm-correction"]
                       + (["--bmax", "5"] if b == 4 else []), "kv"))
        # Which tokens: the first token (the attention sink) kept in fp16, charged per sequence (not a target row).
        rows.append((f"gtq+off+sink1-{tag}", ["--method", "block-gtq", "--kbits", str(b), "--vbits", str(b),
                                              "--key-offset", "mean", "--norm-correction", "--sink-tokens", "1"]
                     + code, "mae"))
    if not rq:
        return rows
    # RateQuant over KIVI-int at RateQuant's convention: 2.5 code bits on average, and the better uniform split.
    rows.append(("ratequant-kivi-2.5", ["--method", "ratequant", "--quantizer", "kivi", "--bits", "2.5",
                                        "--budget-unit", "code"], "kv"))
    rows.append(("uniform-kivi-2.5", ["--method", "uniform", "--quantizer", "kivi", "--bits", "2.5",
                                      "--budget-unit", "code"], "kv"))
    # the other uniform split at the same stored bits (uniform-kivi-2.5 is the one the plan picks)
    rows.append(("uniform-kivi-K3V2", ["--method", "uniform", "--quantizer", "kivi", "--kbits", "3", "--vbits", "2",
                                       "--budget-unit", "code"], "kv"))
    return rows


# The fp16 row is the reference every eval report carries ("fp16_cache": K and V rounded to fp16), not a cell.
BASELINES = [("q8_0", "kv"), ("q4_0", "kv"), ("kivi2", "kv"), ("kivi4", "kv")]
LLAMA_ROWS = [  # (row, cache type, rotation disabled)
    ("llama.cpp f16", "f16", False),
    ("llama.cpp q8_0", "q8_0", False),
    ("llama.cpp q4_0", "q4_0", False),
    ("llama.cpp q8_0 (no rotation)", "q8_0", True),
    ("llama.cpp q4_0 (no rotation)", "q4_0", True),
]
# TaSQ / CQ keys (K-only rows, values fp16): g = 4 channels per group and 32 centroids = 1.25 index
# bits per key element (+ TaSQ's shared fp16 scale), fitted on 8192 calibration tokens (>= 39 per
# centroid), 3 k-means seeds.
VQ_FIT = ["--group", "4", "--centroids", "32", "--tokens", "8192", "--ctx", "512", "--kmeans-seeds", "3",
          "--vquantizer", "fp16", "--also", "cq"]


# Evaluation order within a model (cheap prerequisites first, then the rows the targets need).
ORDER = ["calibrate", "plan/", "reseed/", "evalr/gtq+off-full-3", "evalr/gtq+off-full-2", "eval/gtq+off-K3", "eval/gtq+off-K4", "eval/gtq+off-K2", "eval/gtq+off-full-4",
         "eval/uniform-K3", "eval/gtq-K3", "mae/", "eval/q4_0", "eval/gtq+off-full-3", "eval/gtq+off-full-2",
         "eval/uniform-K4", "evalk/gtq+off-K3", "eval/kivi", "eval3/gtq+off-full-4", "eval/uniform-K2", "eval/gtq-K2",
         "eval/q8_0", "eval3/gtq+off-K3", "evalk/", "eval3/uniform-K3", "eval3/gtq-K3", "eval3/gtq+off-K4", "eval3/gtq+off-K2",
         "eval/uniform+off", "eval/gtq-K4", "llama/f16", "llama/q4_0", "llama/", "eval/ratequant-kivi",
         "eval/uniform-kivi", "eval/ratequant", "fit/", "eval/tasq", "eval/cq"]


def priority(c):
    rest = c["id"].split("/", 1)[1]
    for i, prefix in enumerate(PROTOCOL[c["model"]].get("order", ORDER)):
        if rest.startswith(prefix):
            return i
    return len(ORDER)


def cells(models):
    grid = []
    for m in models:
        grid += sorted(model_cells(m), key=priority)
    return grid


def model_cells(m):
    out = []
    if True:
        gguf, d = MODELS[m]
        mpath = os.path.join(ASSETS, "models", gguf)
        calib = os.path.join(ASSETS, "text", "calib.txt")
        evalt = os.path.join(ASSETS, "text", "eval.txt")
        stats = f"{m}/calib_stats.safetensors"
        pr = PROTOCOL[m]
        ccmd = [RATEKV, "calibrate", "-m", mpath, "-f", calib, "--tokens", str(pr["calib_tokens"]), "--ctx", str(CTX)]
        if pr["sens_seqs"]:
            ccmd += ["--sensitivity", "--sens-seqs", str(pr["sens_seqs"])]
        if pr["curves"]:
            ccmd += ["--curves", pr["curves"], "--curves-json", f"{m}/curves.json"]
        out.append({"id": f"{m}/calibrate", "kind": "calibrate", "model": m, "out": stats,
                    "cmd": ccmd + ["-o", stats, "--force"],
                    "params": {"tokens": pr["calib_tokens"], "sens_seqs": pr["sens_seqs"], "ctx": CTX}})
        evals = []
        mae_plans = []
        for name, args, mode in plan_rows(m, d):
            plan = f"{m}/plans/{name}.json"
            out.append({"id": f"{m}/plan/{name}", "kind": "plan", "model": m, "out": plan, "after": [stats],
                        "cmd": [RATEKV, "plan", "--stats", stats, "-o", plan, "--force", "-q"] + args,
                        "params": {"args": args}})
            default_mae = [] if "+sink" in name else [name]  # sink rows only where listed
            if "--quantizer" not in args and name in pr.get("mae_plans", default_mae):
                mae_plans.append(plan)
            if mode != "mae" and name not in pr.get("skip_eval", []):
                evals.append((name, ["--plan", plan], mode, plan))
        # RateQuant over KIVI-int at RateQuant's convention (2.5 code bits) and both uniform KIVI splits, from a
        # second calibration with the gradient sensitivity and KIVI's curves only (a model whose main calibration
        # was cut: its plans and finished cells stay as they are).
        if pr.get("ratequant_kivi"):
            rq_stats = f"{m}/calib_stats_rq.safetensors"
            out.append({"id": f"{m}/rq/calibrate", "kind": "calibrate", "model": m, "out": rq_stats,
                        "cmd": [RATEKV, "calibrate", "-m", mpath, "-f", calib, "--tokens", str(pr["calib_tokens"]),
                                "--ctx", str(CTX), "--sensitivity", "--sens-seqs", str(pr.get("rq_sens_seqs", SENS_SEQS)), "--curves", "kivi",
                                "--curves-json", f"{m}/curves_rq.json", "-o", rq_stats, "--force"],
                        "params": {"tokens": pr["calib_tokens"], "sens_seqs": pr.get("rq_sens_seqs", SENS_SEQS), "ctx": CTX,
                                   "curves": "kivi"}})
            for name, args in [("ratequant-kivi-2.5", ["--method", "ratequant", "--quantizer", "kivi", "--bits", "2.5"]),
                               ("uniform-kivi-K2V3", ["--method", "uniform", "--quantizer", "kivi", "--kbits", "2",
                                                      "--vbits", "3"]),
                               ("uniform-kivi-K3V2", ["--method", "uniform", "--quantizer", "kivi", "--kbits", "3",
                                                      "--vbits", "2"])]:
                args = args + ["--budget-unit", "code"]
                plan = f"{m}/plans/{name}.json"
                out.append({"id": f"{m}/rq/plan/{name}", "kind": "plan", "model": m, "out": plan, "after": [rq_stats],
                            "cmd": [RATEKV, "plan", "--stats", rq_stats, "-o", plan, "--force", "-q"] + args,
                            "params": {"args": args, "stats": rq_stats}})
                evals.append((name, ["--plan", plan], "kv", plan))
        # Side calibration of RateQuant (docs/quality_results.md §8): K-only and V-only uniform KIVI caches at 2 and
        # 3 code bits evaluated on the CALIBRATION text (the sensitivity's own tokens); the key weight is the ratio
        # of their next-token KLDs over the ratio RateQuant's model predicts (Σ w·α·β^-b per side), and RateQuant
        # over KIVI at 2.5 code bits is re-planned with it (`plan --key-weight`), evaluated like its other rows.
        if pr.get("ratequant_kivi") or pr["ratequant"]:
            kst = f"{m}/calib_stats_rq.safetensors" if pr.get("ratequant_kivi") else stats
            splans = []
            for side, b in SIDE_PLANS:
                name = f"{side}only-kivi{b}"
                args = (["--method", "uniform", "--quantizer", "kivi", "--vquantizer", "fp16", "--kbits", str(b),
                         "--vbits", "16"] if side == "k" else
                        ["--method", "uniform", "--quantizer", "fp16", "--vquantizer", "kivi", "--kbits", "16",
                         "--vbits", str(b)]) + ["--budget-unit", "code"]
                plan = f"{m}/side/{name}.json"
                splans.append(plan)
                out.append({"id": f"{m}/side/plan/{name}", "kind": "plan", "model": m, "out": plan, "after": [kst],
                            "cmd": [RATEKV, "plan", "--stats", kst, "-o", plan, "--force", "-q"] + args,
                            "params": {"args": args, "stats": kst}})
            scell = f"{m}/side/side.json"
            stoks = pr.get("side_tokens", 2048)
            out.append({"id": f"{m}/side/eval", "kind": "eval", "model": m, "row": "side", "out": scell, "plan": None,
                        "plans": splans, "after": splans,
                        "cmd": [RATEKV, "eval", "-m", mpath, "-f", calib, "--tokens", str(stoks), "--ctx", str(CTX),
                                "--seeds", "1", "--query-stride", "8", "--reference-cache", f"{m}/side/reference",
                                "--no-ppl-k", "--json", scell + ".report", "--force"]
                               + [x for pl in splans for x in ("--plan", pl)],
                        "params": {"tokens": stoks, "ctx": CTX, "seeds": 1, "mode": "side", "plans": splans}})
            # kw: the gradient sensitivity with the side calibration's key weight; flat-kw: no per-component
            # sensitivity (every w_i = 1, `--sensitivity none`: the curves' α alone) with that estimator's key weight.
            # -b2: widths from 2 bits (`--bmin 2`; the curves are fitted at 1..5 and RateQuant hands 1-bit KIVI to
            # some components, which the flat plans show to be far costlier than the fitted curve says).
            rq_rows = [("ratequant-kivi-2.5-kw", "grad", 1), ("ratequant-kivi-2.5-flat-kw", "none", 1),
                       ("ratequant-kivi-2.5-b2", "grad", 2), ("ratequant-kivi-2.5-kw-b2", "grad", 2),
                       ("ratequant-kivi-2.5-flat-kw-b2", "none", 2)]
            for name, sens, bmin in rq_rows:
                kw = (side_key_weight(os.path.join(PANEL_ROOT, scell), os.path.join(PANEL_ROOT, kst), sens)
                      if PANEL_ROOT else None)
                if kw is None:
                    continue
                args = ["--method", "ratequant", "--quantizer", "kivi", "--bits", "2.5", "--budget-unit", "code",
                        "--sensitivity", sens]
                if "-kw" in name:
                    args += ["--key-weight", f"{kw['key_weight']:.4g}"]
                if bmin != 1:
                    args += ["--bmin", str(bmin)]
                plan = f"{m}/plans/{name}.json"
                out.append({"id": f"{m}/rq/plan/{name}", "kind": "plan", "model": m, "out": plan, "after": [kst, scell],
                            "cmd": [RATEKV, "plan", "--stats", kst, "-o", plan, "--force", "-q"] + args,
                            "params": {"args": args, "stats": kst}})
                evals.append((name, ["--plan", plan], "kv", plan))
        # Per-layer attention-logit MAE / KL of every TQ plan at MAE_SEEDS seeds on the same windows, from the
        # reference cache's fp32 activations (no perplexity pass); needs the cache written by a first eval.
        mcell = f"{m}/mae/all.json"
        out.append({"id": f"{m}/mae/all", "kind": "eval", "model": m, "row": "mae", "out": mcell, "plan": None,
                    "plans": mae_plans, "after": mae_plans + [f"{m}/reference/window{EVAL_TOKENS // CTX - 1}.safetensors"],
                    "cmd": [RATEKV, "eval", "-m", mpath, "-f", evalt, "--tokens", str(EVAL_TOKENS), "--ctx", str(CTX),
                            "--seeds", str(MAE_SEEDS), "--query-stride", str(MAE_QUERY_STRIDE), "--no-ppl",
                            "--reference-cache", f"{m}/reference", "--json", mcell + ".report", "--force"]
                           + [x for p in mae_plans for x in ("--plan", p)],
                    "params": {"tokens": EVAL_TOKENS, "ctx": CTX, "seeds": MAE_SEEDS, "mode": "mae",
                               "query_stride": MAE_QUERY_STRIDE, "plans": mae_plans}})
        for name, mode in BASELINES:
            evals.append((name, ["--baseline", name], mode, None))
        for name, mode, plan in vq_plans(m, pr.get("tasq_nn", False)) if pr.get("tasq", True) else []:
            evals.append((name, ["--plan", plan], mode, plan))
        evals3 = [(n, a, mo, pl) for n, a, mo, pl in evals if n in pr.get("seeds3", [])]
        for n, a, mo, pl in evals:
            for r in range(1, SEEDS) if n in pr.get("seeds_more", []) else []:
                rplan = f"{m}/plans/{n}.r{r}.json"
                out.append({"id": f"{m}/reseed/{n}.r{r}", "kind": "reseed", "model": m, "out": rplan, "after": [pl],
                            "plan": pl, "run_seed": r, "params": {"plan": pl, "run_seed": r}})
                out.append({"id": f"{m}/evalr/{n}.r{r}", "kind": "eval", "model": m, "row": n, "run_seed": r,
                            "out": f"{m}/evalr/{n}.r{r}.json", "plan": rplan, "after": [rplan],
                            "cmd": [RATEKV, "eval", "-m", mpath, "-f", evalt, "--tokens", str(EVAL_TOKENS),
                                    "--ctx", str(CTX), "--seeds", "1", "--reference-cache", f"{m}/reference",
                                    "--json", f"{m}/evalr/{n}.r{r}.json.report", "--force", "--plan", rplan]
                                   + (["--no-ppl-k"] if mo == "kv" else ["--no-ppl-kv"]),
                            "params": {"tokens": EVAL_TOKENS, "ctx": CTX, "seeds": 1, "run_seed": r, "mode": mo,
                                       "args": ["--plan", rplan]}})
        evalsk = [(n, a, "k", pl) for n, a, mo, pl in evals if n in pr.get("k_only", [])]
        for (name, args, mode, plan), edir in ([(e, "eval") for e in evals] + [(e, "eval3") for e in evals3]
                                               + [(e, "evalk") for e in evalsk]):
            cell = f"{m}/{edir}/{name}.json"
            seeds = SEEDS if edir == "eval3" else pr["ppl_seeds"]
            cmd = [RATEKV, "eval", "-m", mpath, "-f", evalt, "--tokens", str(EVAL_TOKENS), "--ctx", str(CTX),
                   "--seeds", str(seeds), "--reference-cache", f"{m}/reference", "--json", cell + ".report",
                   "--force"] + args + (["--no-ppl-k"] if mode == "kv" else ["--no-ppl-kv"])
            out.append({"id": f"{m}/{edir}/{name}", "kind": "eval", "model": m, "row": name, "out": cell,
                        "plan": plan, "cmd": cmd, "after": [plan] if plan else [],
                        "params": {"tokens": EVAL_TOKENS, "ctx": CTX, "seeds": seeds, "mode": mode, "args": args}})
        base = f"{m}/llama/f16.kld"
        for row, t, norot in LLAMA_ROWS if pr.get("llama", True) else []:
            cell = f"{m}/llama/{t}{'-norot' if norot else ''}.json"
            cmd = [os.path.join(LLAMA, "llama-perplexity"), "-m", mpath, "-f", evalt, "-c", str(CTX), "--chunks",
                   str(EVAL_TOKENS // CTX), "-b", str(CTX), "-t", THREADS, "-tb", THREADS, "-ctk", t, "-ctv", t,
                   "-fa", "on"]
            cmd += ["--kl-divergence-base", base] if t == "f16" else ["--kl-divergence-base", base, "--kl-divergence"]
            out.append({"id": f"{m}/llama/{t}{'-norot' if norot else ''}", "kind": "llama", "model": m, "row": row,
                        "out": cell, "cmd": cmd, "env": {"LLAMA_ATTN_ROT_DISABLE": "1"} if norot else {},
                        "after": [] if t == "f16" else [f"{m}/llama/f16.json"],
                        "params": {"type": t, "no_rotation": norot, "ctx": CTX, "chunks": EVAL_TOKENS // CTX}})
        fits = [("tasq", VQ_FIT)] if pr.get("tasq", True) else []
        if pr.get("tasq_nn"):  # TaSQ without its shared fp16 scale: CQ's stored bits exactly (its own capture)
            fits.append(("tasqnn", VQ_FIT[:-2] + ["--also", "no-normalization"]))
        for name, args in fits:
            plan = f"{m}/plans/{name}.json"
            out.append({"id": f"{m}/fit/{name}", "kind": "plan", "model": m, "out": f"{m}/plans/{name}.s0.json",
                        "cmd": [RATEKV, "plan", "--method", "tasq", "-m", mpath, "-f", calib, "-o", plan, "--force",
                                "--json"] + args, "params": {"args": args}})
    return out


SIDE_PLANS = [("k", 2), ("v", 2), ("k", 3), ("v", 3)]
PANEL_ROOT = None  # set by run/report/status: the panel directory (the key weight is read from a finished side cell)


def read_safetensors(path, names):
    """float32 tensors `names` of a safetensors file as flat lists, and its ratekv metadata (stdlib only)."""
    import array
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        out = {}
        for name in names:
            t = head[name]
            assert t["dtype"] == "F32", (path, name, t["dtype"])
            a, b = t["data_offsets"]
            f.seek(8 + n + a)
            v = array.array("f")
            v.frombytes(f.read(b - a))
            out[name] = (list(v), t["shape"])
    return out, json.loads(head["__metadata__"]["ratekv"])


SAID = set()  # what side_key_weight has said about a statistics file


def side_key_weight(side_json, stats_path, sensitivity="grad"):
    """RateQuant's side calibration from a finished side cell: per side s and width b, the measured next-token KLD
    of the s-only KIVI cache and RateQuant's prediction P_s(b) = Σ_(s components) w_i α_i β_s^(-b) (w: the
    `sensitivity` estimator, "grad" or "none" = 1; KIVI's fitted curves: what the allocator minimizes); key_weight =
    the geometric mean over b of (KLD_K / KLD_V) / (P_K / P_V). None while the cell is not done."""
    if not os.path.exists(side_json):
        return None
    klds = side_klds(side_json)
    if klds is None:
        return None
    rep = klds["report"]
    try:
        t, meta = read_safetensors(stats_path, ["grad_sq_k_post", "grad_sq_v", "curves.kivi.alpha_k", "curves.kivi.alpha_v"])
    except (OSError, ValueError, KeyError, AssertionError, struct.error) as e:  # a truncated / foreign file
        if stats_path not in SAID:  # once per file (the grid is rebuilt per pass, 5 key-weighted rows each)
            SAID.add(stats_path)
            print(f"quality_panel: {stats_path}: unreadable statistics ({e!r}); the side calibration waits for them",
                  file=sys.stderr, flush=True)
        return None
    d = t["grad_sq_k_post"][1][-1]
    cur = meta["curves"]["kivi"]
    out = {"widths": {}}
    logs = []
    for b in sorted({b for _, b in SIDE_PLANS}):
        kld, pred = {}, {}
        for side, key in (("k", "k"), ("v", "v")):
            kld[side] = klds[f"{side}only-kivi{b}"]
            g = t["grad_sq_k_post" if side == "k" else "grad_sq_v"][0]
            alpha = t[f"curves.kivi.alpha_{key}"][0]
            w = [sum(g[i * d:(i + 1) * d]) if sensitivity == "grad" else 1.0 for i in range(len(alpha))]
            pred[side] = sum(wi * ai for wi, ai in zip(w, alpha)) * cur[f"beta_{key}"] ** (-b)
        for side in ("k", "v"):
            if not (math.isfinite(pred[side]) and pred[side] > 0):
                if (stats_path, sensitivity) in SAID:
                    return None
                SAID.add((stats_path, sensitivity))
                print(f"quality_panel: {stats_path}: RateQuant's predicted {side.upper()}-only distortion at {b} bits "
                      f"(estimator {sensitivity}) is {pred[side]}; expected a positive finite number: no key weight "
                      "from it (the key-weighted RateQuant cells wait)", file=sys.stderr, flush=True)
                return None
        ratio = (kld["k"] / kld["v"]) / (pred["k"] / pred["v"])
        logs.append(math.log(ratio))
        out["widths"][str(b)] = {"kld_k": kld["k"], "kld_v": kld["v"], "pred_k": pred["k"], "pred_v": pred["v"],
                                 "measured_k_over_v": kld["k"] / kld["v"], "predicted_k_over_v": pred["k"] / pred["v"],
                                 "ratio": ratio}
    out["key_weight"] = math.exp(sum(logs) / len(logs))
    out["text"], out["tokens"] = rep["text"]["file"], rep["n_tokens"]
    return out


def side_klds(side_json):
    """The measured next-token KLD of each side plan (SIDE_PLANS: "konly-kivi2" ...) of a finished side cell, with
    its "report"; None when the cell is not usable: not valid JSON, a side plan missing, a KLD that is not a
    positive finite number (a key weight from it would be log(0), nan or inf): the file and field are named on
    stderr (once), the cell counts as unfinished (`run` re-runs it) and the key-weighted RateQuant cells wait."""
    doc = load_json(side_json)
    if doc is None:
        return None
    try:
        rep = field(doc, "report")
        plans = field(rep, "plans")
        if not isinstance(plans, list):
            raise BadCell(f"report.plans is {json.dumps(plans)[:40]}; expected a list of plans")
        out = {"report": rep}
        for side, b in SIDE_PLANS:
            name = f"{side}only-kivi{b}"
            p = next((p for p in plans if isinstance(p, dict) and p.get("name") == name), None)
            if p is None:
                raise BadCell(f"no plan named {name!r} in report.plans; expected every side plan "
                              f"({', '.join(f'{s}only-kivi{w}' for s, w in SIDE_PLANS)})")
            out[name] = number(field(p, "next_token.kv.kld_mean.mean"),
                               f"report.plans[{name}].next_token.kv.kld_mean.mean", positive=True)
        if not isinstance(field(rep, "text.file"), str):
            raise BadCell("report.text.file is not a string; expected the text's file name")
        number(field(rep, "n_tokens"), "report.n_tokens", positive=True)
        if not isinstance(field(doc, "command"), str):
            raise BadCell("command is not a string; expected the cell's command line")
    except BadCell as e:
        note_unreadable(side_json, f"not a usable side calibration ({e}); the key-weighted RateQuant cells "
                        "(rq/plan/ratequant-kivi-2.5-*) wait for it", cause="content")
        return None
    return out


def vq_plans(m, nn=False):
    """TaSQ / CQ K-only rows: the fit writes <plan>.s<k>.json per k-means seed and .cq variants; with nn, the
    TaSQ-without-scale rows of the second fit (tasqnn.no-normalization.s<k>.json)."""
    rows = []
    stems = {"tasq": "tasq", "cq": "tasq.cq", "tasq-nn": "tasqnn.no-normalization"}
    for method in ("tasq", "cq") + (("tasq-nn",) if nn else ()):
        for k in range(3):
            rows.append((f"{method}-s{k}", "k", f"{m}/plans/{stems[method]}.s{k}.json"))
    return rows


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

def mix32(seed, run):
    """cache/plan_codecs.cpp mix32: the run seed r's re-mix of a rotation seed (reseeded_plan)."""
    M = (1 << 64) - 1
    z = (seed ^ (run * 0x9e3779b97f4a7c15)) & M
    z = (z + 0x9e3779b97f4a7c15) & M
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M
    return ((z ^ (z >> 31)) >> 32) & 0xFFFFFFFF


def reseed_plan(src, dst, run):
    """The plan file `src` as `ratekv eval` runs it at run seed `run` (cache::reseeded_plan: every TQ-MSE /
    grouped TQ-MSE / QuaRot group with bits > 0 gets seed mix32(seed, run)), written to `dst`. BadCell naming `src`
    when it is not a plan file (not valid JSON, no "layers", a layer / head / group of the wrong shape) or has no
    rotation seed; `run` fails that cell only (run_cell)."""
    plan = load_json(src)
    if not isinstance(plan, dict) or "layers" not in plan:
        raise BadCell(f"reseed: {src}: not a plan file (not valid JSON or no \"layers\"); re-run its plan cell")
    n = 0
    try:
        for layer in plan["layers"]:
            for h in layer["heads"]:
                for side in ("key", "value"):
                    c = h[side]
                    if c.get("kind") not in ("tq-mse", "tq-mse-grouped", "quarot"):
                        continue
                    for g in c.get("groups", []):
                        if number(g.get("bits", 0), "bits") > 0:
                            g["seed"] = mix32(number(g["seed"], "seed"), run)
                            n += 1
    except (BadCell, KeyError, IndexError, TypeError, AttributeError) as e:
        raise BadCell(f"reseed: {src}: not a plan file (a layer, head or group of the wrong shape: "
                      f"{type(e).__name__} {e}); re-run its plan cell") from None
    if n == 0:
        raise BadCell(f"reseed: {src}: no rotation seed to re-mix (a deterministic plan needs no more seeds)")
    tmp = dst + ".tmp"
    with open(tmp, "w") as f:
        json.dump(plan, f, indent=1)
    os.replace(tmp, dst)


CELL_ERRORS = (BadCell, KeyError, IndexError, TypeError, AttributeError, ValueError)


def use_cell(path, doc, reader, what, then=""):
    """reader(doc) (the row / values the report takes from a cell), or None when it raises on the content (a field
    missing or of the wrong type): the file is named on stderr once and the cell counts as unfinished. The one test
    of a finished cell's content: `status`, `run` (cell_done) and `report` (rows_of) all go through it."""
    if doc is None:
        return None
    try:
        return reader(doc)
    except BadCell as e:
        note_unreadable(path, f"not a finished {what} ({e}){then}", cause="content")
    except CELL_ERRORS as e:
        note_unreadable(path, f"not a finished {what} (no usable field {e}){then}", cause="content")
    return None


def safetensors_complete(path):
    """Whether the safetensors file at `path` has a readable header and every tensor's bytes (a truncated file from
    an interrupted calibration does not); named on stderr when not."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > size:
                raise ValueError(f"header of {n} bytes in a file of {size}")
            head = json.loads(f.read(n))
        end = max([t["data_offsets"][1] for k, t in head.items() if k != "__metadata__"] or [0])
        if 8 + n + end > size:
            raise ValueError(f"{size} bytes, its header describes {8 + n + end}")
        return True
    except OSError as e:
        note_unreadable(path, f"cannot be read ({e.strerror})", cause="permission")
    except (ValueError, struct.error, KeyError, TypeError, IndexError, AttributeError) as e:
        note_unreadable(path, f"not a complete safetensors file ({e})")
    return False


def cell_output_usable(c, root, doc=None):
    """Whether cell c's output holds what its readers take from it (see use_cell): statistics complete, a plan file
    that is a JSON object, an eval / llama.cpp cell whose row the report can build."""
    path = os.path.join(root, c["out"])
    if c["kind"] == "calibrate":
        return safetensors_complete(path)
    if c["kind"] in ("plan", "reseed"):
        return (doc if doc is not None else load_json(path)) is not None
    if c["kind"] == "llama":
        return use_cell(path, doc, llama_row, "llama.cpp cell") is not None
    if c.get("row") == "side":
        return side_klds(path) is not None
    if c.get("row") == "mae":
        return use_cell(path, doc, lambda d: mae_rows(d, []) or True, "per-layer MAE cell") is not None
    return use_cell(path, doc, lambda d: eval_row(d, os.path.basename(path)), "eval cell") is not None


def cell_done(c, root):
    """Whether cell c is finished: its output exists with the parameters it would be made with now and holds what
    the report reads (cell_output_usable). An output (or its .params.json) that is not valid JSON or lacks a field is
    named on stderr and counts as unfinished (load_json, use_cell)."""
    meta = os.path.join(root, c["out"] + ".params.json") if c["kind"] in ("calibrate", "plan", "reseed") else None
    if c["kind"] in ("calibrate", "plan", "reseed"):
        if not os.path.exists(os.path.join(root, c["out"])) or not os.path.exists(meta):
            return False
        doc = load_json(meta)
        if not isinstance(doc, dict):
            return False
        if c["kind"] == "reseed":
            same = doc.get("params") == dict(c["params"], plan_sha256=sha256_file(os.path.join(root, c["plan"])))
        else:
            same = doc.get("params") == c["params"]
        return same and cell_output_usable(c, root)
    path = os.path.join(root, c["out"])
    if not os.path.exists(path):
        return False
    doc = load_json(path)
    return isinstance(doc, dict) and doc.get("params") == full_params(c, root) and cell_output_usable(c, root, doc)


def full_params(c, root):
    p = dict(c["params"])
    if c.get("plan"):
        p["plan_sha256"] = sha256_file(os.path.join(root, c["plan"]))
    if c.get("plans"):
        if not all(os.path.exists(os.path.join(root, x)) for x in c["plans"]):
            return None
        p["plans_sha256"] = [sha256_file(os.path.join(root, x)) for x in c["plans"]]
    return p


def parse_llama(log):
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    if not m:
        return None
    r = {"ppl": float(m.group(1)), "ppl_stderr": float(m.group(2))}
    for key, pat in [("kld_mean", r"Mean\s+KLD:\s+([-0-9.e]+)\s+±\s+([-0-9.e]+)"),
                     ("kld_median", r"Median\s+KLD:\s+([-0-9.e]+)"), ("kld_p99", r"99\.0%\s+KLD:\s+([-0-9.e]+)"),
                     ("kld_max", r"Maximum\s+KLD:\s+([-0-9.e]+)"),
                     ("top1", r"Same top p:\s+([0-9.]+)\s+±"), ("ppl_ratio", r"Mean\s+PPL\(Q\)/PPL\(base\)\s*:\s+([0-9.]+)")]:
        mm = re.search(pat, log)
        if mm:
            r[key] = float(mm.group(1))
    if "top1" in r:
        r["top1"] /= 100.0
    return r


def run_cell(c, root, dry):
    deps = [os.path.join(root, a) for a in c.get("after", [])]
    missing = [a for a in deps if not os.path.exists(a)]
    if missing:
        print(f"[skip] {c['id']}: waits for {', '.join(os.path.relpath(a, root) for a in missing)}", flush=True)
        return "wait"
    if c["kind"] == "reseed":
        print(f"[run ] {c['id']}: reseed {c['plan']} run seed {c['run_seed']}", flush=True)
        if dry:
            return "dry"
        CURRENT[:] = [os.path.join(root, c["out"])]
        try:
            reseed_plan(os.path.join(root, c["plan"]), os.path.join(root, c["out"]), c["run_seed"])
        except BadCell as e:  # this cell fails; the others still run
            print(f"[FAIL] {c['id']}: {e}", flush=True)
            return "fail"
        atomic_json(os.path.join(root, c["out"] + ".params.json"),
                    {"params": dict(c["params"], plan_sha256=sha256_file(os.path.join(root, c["plan"])))})
        return finished(c, root, "")
    cmd = ["nice", "-n", NICE] + c["cmd"]
    print(f"[run ] {c['id']}: {' '.join(c['cmd'])}", flush=True)
    if dry:
        return "dry"
    CURRENT[:] = [os.path.join(root, c["out"])]
    os.makedirs(os.path.dirname(os.path.join(root, c["out"])), exist_ok=True)
    env = dict(os.environ, OMP_WAIT_POLICY="passive", **c.get("env", {}))
    t0 = time.time()
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, errors="replace")
    secs = time.time() - t0
    log = res.stdout + res.stderr
    with open(os.path.join(root, c["out"] + ".log"), "w") as f:
        f.write(log)
    if res.returncode != 0:
        print(f"[FAIL] {c['id']} ({secs:.0f} s, exit {res.returncode}):\n{log[-2000:]}", flush=True)
        return "fail"
    if c["kind"] in ("calibrate", "plan"):
        atomic_json(os.path.join(root, c["out"] + ".params.json"), {"params": c["params"], "seconds": secs})
    elif c["kind"] == "eval":
        rep_path = os.path.join(root, c["out"] + ".report")
        rep = load_json(rep_path)
        if not isinstance(rep, dict):
            print(f"[FAIL] {c['id']}: ratekv eval exited 0 but its report {rep_path} is missing or not JSON", flush=True)
            return "fail"
        atomic_json(os.path.join(root, c["out"]), {"params": full_params(c, root), "seconds": secs,
                                                    "command": " ".join(c["cmd"]), "report": rep})
        os.remove(rep_path)
    elif c["kind"] == "llama":
        r = parse_llama(log)
        if r is None:
            print(f"[FAIL] {c['id']}: no final estimate in the log", flush=True)
            return "fail"
        atomic_json(os.path.join(root, c["out"]), {"params": c["params"], "seconds": secs, "row": c["row"],
                                                    "command": " ".join(c["cmd"]), "env": c.get("env", {}),
                                                    "result": r})
    return finished(c, root, f" ({secs:.0f} s)")


def finished(c, root, took):
    """After cell c's command succeeded: "done" when its output now counts as finished (cell_done, the predicate
    `run` skips cells by), else "fail" with the reason. Without this a cell whose command exits 0 but writes an
    output the report cannot use (a field missing) would count as progress and be re-run by every pass, forever."""
    out = os.path.join(root, c["out"])
    UNREADABLE[:] = [(p, w) for p, w in UNREADABLE if p not in (out, out + ".params.json")]  # judge the new output
    n = len(UNREADABLE)
    if cell_done(c, root):
        print(f"[done] {c['id']}{took}", flush=True)
        return "done"
    why = "; ".join(w for _, w in UNREADABLE[n:]) or "missing, or not made with the parameters of this cell"
    print(f"[FAIL] {c['id']}: output not usable ({why})", flush=True)
    return "fail"


CURRENT = []  # the output path of the cell `run` is making (what an interrupt leaves unfinished)


def cmd_run(a):
    global PANEL_ROOT
    root = PANEL_ROOT = os.path.abspath(a.out)
    only = a.only_re
    if only:  # a pattern that matches nothing would run nothing and exit 0 as if the grid were done
        ids = [c["id"] for c in cells(a.model_list)]
        if not any(only.search(i) for i in ids):
            print(f"quality_panel run: no cell matches --only {a.only!r} in --models {a.models}; cell ids are e.g. "
                  + ", ".join(ids[:3] + ids[-2:]) + " (`status` lists them all; the key-weighted RateQuant cells "
                  "appear once their side cell is done)", file=sys.stderr, flush=True)
            sys.exit(2)
    os.makedirs(root, exist_ok=True)
    # Passes repeat until nothing new can run (plans wait for their statistics, evals for plans); the grid is
    # rebuilt every pass (a key-weighted RateQuant plan appears once its side cell is done).
    outcome = {}  # cell id -> the last attempt's outcome ("done" / "fail")
    try:
        while True:
            grid = cells(a.model_list)
            progressed = False
            for c in grid:
                if only and not only.search(c["id"]):
                    continue
                if cell_done(c, root):
                    continue
                res = run_cell(c, root, a.dry_run)
                CURRENT[:] = []
                if res in ("done", "fail"):
                    outcome[c["id"]] = res
                progressed = res == "done" or progressed
            if not progressed or a.dry_run:
                break
    except KeyboardInterrupt:
        for path in CURRENT:  # a partial report / temporary file of the interrupted cell (its output is written last)
            for part in (path + ".report", path + ".tmp", path + ".params.json.tmp"):
                if os.path.exists(part):
                    os.remove(part)
        where = f" ({os.path.relpath(CURRENT[0], root)})" if CURRENT else ""
        print(f"\nquality_panel run: interrupted; the current cell{where} stays unfinished and is re-run next time",
              file=sys.stderr, flush=True)
        sys.exit(130)
    failed = sorted(i for i, r in outcome.items() if r == "fail")
    if failed:
        print(f"quality_panel run: {len(failed)} of {len(outcome)} cells failed: {', '.join(failed)} (their logs: "
              "<cell>.log under --out)", file=sys.stderr, flush=True)
        sys.exit(1)


def cmd_status(a):
    global PANEL_ROOT
    root = PANEL_ROOT = os.path.abspath(a.out)
    for c in cells(a.model_list):
        print(f"{'done' if cell_done(c, root) else '----'}  {c['id']}", flush=True)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def clean_cmd(cmd):
    """A cell's command as a reader re-runs it: `ratekv` for the binary, $RATEKV_ASSETS for the assets."""
    cmd = re.sub(r"^\S*/ratekv(-v\d+)?(?= )", "ratekv", cmd)  # whichever build ran the cell (RATEKV_BIN)
    return cmd.replace(RATEKV, "ratekv").replace(ASSETS, "$RATEKV_ASSETS")


def mean(v):
    return sum(v) / len(v) if v else float("nan")


ROW_FILE = {}  # id(row) -> the cell file it was read from (for messages; not written to the report)


def rows_of(root, m):
    """The JSON rows of one model: ratekv cells and llama.cpp cells."""
    rows = []
    edir = os.path.join(root, m, "eval")
    files = {}
    for d in ("eval", "eval3"):  # eval3/<row>.json (more seeds) replaces eval/<row>.json
        dd = os.path.join(root, m, d)
        for fn in sorted(os.listdir(dd)) if os.path.isdir(dd) else []:
            if fn.endswith(".json"):
                files[fn] = os.path.join(dd, fn)
    kdir = os.path.join(root, m, "evalk")
    for fn in sorted(os.listdir(kdir)) if os.path.isdir(kdir) else []:
        if fn.endswith(".json"):
            files["k:" + fn] = os.path.join(kdir, fn)
    for fn, path in sorted(files.items()):
        doc = load_json(path)
        if doc is None:
            continue
        fn = fn[2:-5] + " (K only).json" if fn.startswith("k:") else fn
        row = use_cell(path, doc, lambda d: eval_row(d, os.path.basename(path)), "eval cell")
        if row is None:
            continue
        row["plan"] = fn[:-5]
        ROW_FILE[id(row)] = path
        x = row["ppl"]
        if x is None or not math.isfinite(x):  # a diverged evaluation (ratekv writes a non-finite number as null)
            row["ppl_status"] = "null" if x is None else str(x)
            row["ppl"] = None
            print(f"quality_panel: {path}: perplexity is {row['ppl_status']} (the evaluation failed); the row is kept "
                  "with ppl null and ppl_status set", file=sys.stderr, flush=True)
        rows.append(row)
    merge_run_seeds(root, m, rows)
    # The fp16 row: the reference of every report (K and V rounded to fp16), the same windows.
    fp16 = None
    for fn in sorted(os.listdir(edir)) if os.path.isdir(edir) else []:
        if fn.endswith(".json"):
            doc = load_json(os.path.join(edir, fn))
            rep = doc.get("report") if isinstance(doc, dict) else None
            if isinstance(rep, dict) and "fp16_cache" in rep:
                fp16 = fp16_row(doc, os.path.join(edir, fn), fn)
                if fp16 is None:  # named on stderr; the next eval cell's reference is used
                    continue
                break
    if fp16:
        rows.insert(0, fp16)
    # Per-layer MAE at MAE_SEEDS seeds (mae/all.json) replaces the perplexity cell's; plans without one get a row.
    mpath = os.path.join(root, m, "mae", "all.json")
    mdoc = load_json(mpath) if os.path.exists(mpath) else None
    if use_cell(mpath, mdoc, lambda d: mae_rows(d, []) or True, "per-layer MAE cell"):
        mae_rows(mdoc, rows)
    ldir = os.path.join(root, m, "llama")
    for fn in sorted(os.listdir(ldir)) if os.path.isdir(ldir) else []:
        if not fn.endswith(".json"):
            continue
        row = use_cell(os.path.join(ldir, fn), load_json(os.path.join(ldir, fn)), llama_row, "llama.cpp cell")
        if row is not None:
            rows.append(row)
    if not rows:  # no finished cell of this model: issue 22's quoted numbers alone are no report
        return rows
    for name, bits, ppl, kld, top1 in ISSUE_LLAMA.get(m, []):
        rows.append({"plan": name, "method": "llama.cpp (numbers from issue 22, not re-run)", "mode": "K+V (llama.cpp)",
                     "stored_bits_k": bits, "stored_bits_v": bits, "ppl": ppl, "ppl_sd": 0.0, "kld_mean": kld,
                     "top1": top1, "mae": None, "seeds": 1, "windows": 8,
                     "command": "llama-perplexity -c 512 --chunks 8 -fa on -ctk T -ctv T (issue 22)"})
    return rows


def fp16_row(doc, path, fn):
    """The fp16 row (the reference of every report: K and V rounded to fp16, the same windows) from the eval cell
    `doc` read from `path` (eval/<fn>), or None when a field it reads is missing (report.fp16_cache.ppl, report.fp.ppl,
    report.fp.next_token.kld_mean, report.n_chunks / n_tokens / ppl_scored_tokens): the file and the field are
    named on stderr and the caller takes the next cell's reference. The cell itself stays as eval_row judges it (the
    row of its own plan does not read these). A reference perplexity that is not a positive finite number gives
    ppl null with ppl_status (every ΔPPL against it would be wrong: -100 %, nan %); another field that is not a
    finite number is null (not measured). Both are named."""
    try:
        row = {"plan": "fp16", "method": "fp16 cache (the eval reference)", "mode": "K+V",
               "stored_bits_k": 16.0, "stored_bits_v": 16.0, "bytes_per_token": None,
               "ppl": field(doc, "report.fp16_cache.ppl"), "ppl_sd": 0.0, "kld_mean": 0.0, "kld_p99": 0.0,
               "top1": 1.0, "mae": 0.0, "seeds": 1, "windows": field(doc, "report.n_chunks"),
               "fp32_ppl": field(doc, "report.fp.ppl"),
               "fp32_kld_mean": field(doc, "report.fp.next_token.kld_mean"), "tokens": field(doc, "report.n_tokens"),
               "scored_tokens": field(doc, "report.ppl_scored_tokens"), "command": f"(reference of eval/{fn})"}
    except BadCell as e:
        print(f"quality_panel: {path}: not usable as the fp16 reference ({e}); the next eval cell's reference is used",
              file=sys.stderr, flush=True)
        return None
    try:
        number(row["ppl"], "report.fp16_cache.ppl", positive=True)
    except BadCell as e:
        ref = row["ppl"]
        row["ppl_status"] = json.dumps(ref)[:40] if not isinstance(ref, float) else str(ref)
        row["ppl"] = None
        print(f"quality_panel: {path}: {e} (the fp16 reference failed): ΔPPL vs fp16 is unavailable for every row of "
              "this model", file=sys.stderr, flush=True)
    for k, f in (("fp32_ppl", "report.fp.ppl"), ("windows", "report.n_chunks"), ("tokens", "report.n_tokens"),
                 ("scored_tokens", "report.ppl_scored_tokens"), ("fp32_kld_mean", "report.fp.next_token.kld_mean")):
        try:
            number(row[k], f, finite=True)
        except BadCell as e:
            print(f"quality_panel: {path}: the fp16 reference's {k}: {e}: shown as not measured", file=sys.stderr,
                  flush=True)
            row[k] = None
    return row


def field(d, path):
    """d's value at the dotted `path` ("report.plans.0.stored"), or BadCell naming the first part that is missing."""
    x = d
    done = []
    for k in path.split("."):
        if isinstance(x, list) and k.isdigit() and int(k) < len(x):
            x = x[int(k)]
        elif isinstance(x, dict) and k in x:
            x = x[k]
        else:
            raise BadCell(f"no field {'.'.join(done + [k])}" + (f" ({'.'.join(done)} is {json.dumps(x)[:40]})"
                                                                  if done and not isinstance(x, dict) else ""))
        done.append(k)
    return x


def eval_row(doc, fn):
    """The row of one eval cell (eval/, eval3/, evalk/, evalr/ <fn>). BadCell (naming the field) on a cell that
    lacks a field the row reads or holds a value of the wrong type there (a number where one is read; a finite
    one for the stored bits and bytes); the caller treats such a cell like an unreadable one (unfinished)."""
    rep = field(doc, "report")
    p = field(doc, "report.plans.0")
    mode = field(doc, "params.mode")
    if mode not in ("kv", "k"):
        raise BadCell(f"params.mode is {json.dumps(mode)[:40]}; expected \"kv\" or \"k\"")
    pk = "ppl_kv" if mode == "kv" else "ppl_k"
    ppl = field(doc, "report.plans.0." + pk)
    nk = "kv" if mode == "kv" else "k"
    nt = field(doc, "report.plans.0.next_token." + nk)
    st = field(doc, "report.plans.0.stored")
    for k in ("mean", "sd"):
        number(field(doc, f"report.plans.0.{pk}.{k}"), f"report.plans.0.{pk}.{k}", none=True)
    numbers(field(doc, f"report.plans.0.{pk}.per_seed"), f"report.plans.0.{pk}.per_seed")
    for k in ("kld_mean", "kld_p99", "top1"):
        number(field(doc, f"report.plans.0.next_token.{nk}.{k}.mean"), f"report.plans.0.next_token.{nk}.{k}.mean", none=True)
    for k in ("kld_mean", "kld_p99", "top1"):
        numbers(field(doc, f"report.plans.0.next_token.{nk}.{k}.per_seed"), f"report.plans.0.next_token.{nk}.{k}.per_seed")
    for k in ("k_bits_per_element",) + (("v_bits_per_element", "bytes_per_token") if mode == "kv" else
                                        ("k_bytes_per_token",)):
        number(field(doc, f"report.plans.0.stored.{k}"), f"report.plans.0.stored.{k}", finite=True)
    number(field(doc, "report.plans.0.mae.mean"), "report.plans.0.mae.mean", none=True)
    numbers(field(doc, "report.plans.0.mae.layers_mean"), "report.plans.0.mae.layers_mean", none=True)
    for k in ("n_chunks", "n_tokens", "ppl_scored_tokens"):
        number(field(doc, "report." + k), "report." + k, finite=True)
    if not isinstance(field(doc, "command"), str):
        raise BadCell(f"command is {json.dumps(doc['command'])[:40]}; expected the command line (a string)")
    return {
        "plan": fn[:-5], "method": p["method"], "mode": "K+V" if mode == "kv" else "K only (V fp32)",
        "stored_bits_k": st["k_bits_per_element"], "stored_bits_v": st["v_bits_per_element"] if mode == "kv" else None,
        "bytes_per_token": st["bytes_per_token"] if mode == "kv" else st["k_bytes_per_token"],
        "fixed_bytes": st.get("fixed_bytes", 0),
        "ppl": ppl["mean"], "ppl_sd": ppl["sd"], "ppl_per_seed": ppl["per_seed"],
        "kld_mean": nt["kld_mean"]["mean"], "kld_p99": nt["kld_p99"]["mean"], "top1": nt["top1"]["mean"],
        "kld_per_seed": nt["kld_mean"]["per_seed"],
        "mae": p["mae"]["mean"], "mae_layers": p["mae"]["layers_mean"], "mae_per_seed": p["mae"]["per_seed"],
        "seeds": 1 if p["deterministic"] else rep["seeds"], "mae_seeds": 1 if p["deterministic"] else rep["seeds"],
        "windows": rep["n_chunks"],
        "first_window_planned_bytes": st.get("first_window", {}).get("planned_bytes"),
        "first_window_measured_bytes": st.get("first_window", {}).get("measured_bytes"),
        "first_window_measured_by": st.get("first_window", {}).get("measured_by"),
        "fp32_ppl": rep["fp"]["ppl"], "tokens": rep["n_tokens"], "scored_tokens": rep["ppl_scored_tokens"],
        "seconds": doc["seconds"], "command": clean_cmd(doc["command"]),
    }


def mae_rows(mdoc, rows):
    """Per-layer MAE cell (mae/all.json): its values replace the perplexity cells' MAE; plans without one get a row."""
    mrep = mdoc["report"]
    for i, p in enumerate(mrep["plans"]):  # the fields read below: numbers (BadCell naming the field otherwise)
        number(field(p, "mae.mean"), f"report.plans.{i}.mae.mean", none=True)
        numbers(field(p, "mae.layers_mean"), f"report.plans.{i}.mae.layers_mean", none=True)
        for k in ("k_bits_per_element", "v_bits_per_element"):
            number(field(p, "stored." + k), f"report.plans.{i}.stored.{k}", finite=True)
    for p in mrep["plans"]:
        name = p["name"][:-5] if p["name"].endswith(".json") else p["name"]
        r = next((r for r in rows if r["plan"] == name), None)
        if r is None:
            st = p["stored"]
            r = {"plan": name, "method": p["method"], "mode": "MAE only (keys)", "ppl": None, "kld_mean": None,
                 "top1": None, "seeds": 0, "stored_bits_k": st["k_bits_per_element"],
                 "stored_bits_v": st["v_bits_per_element"], "windows": mrep["n_chunks"],
                 "command": clean_cmd(mdoc["command"])}
            rows.append(r)
        r["mae"] = p["mae"]["mean"]
        r["mae_sd"] = p["mae"]["mean_sd"]
        r["mae_layers"] = p["mae"]["layers_mean"]
        r["mae_per_seed"] = p["mae"]["per_seed"]
        r["attn_kl"] = p["kl"]["mean"]
        r["mae_seeds"] = 1 if p["deterministic"] else mrep["seeds"]
        r["mae_query_stride"] = mrep["query_stride"]
        r["mae_command"] = clean_cmd(mdoc["command"])


def llama_row(doc):
    """The row of one llama.cpp cell (llama/<type>.json)."""
    r = doc["result"]
    t = doc["params"]["type"]
    number(field(r, "ppl"), "result.ppl", finite=True)
    for k in ("kld_mean", "kld_p99", "top1"):
        number(r.get(k), "result." + k, none=True)
    bits = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5}[t]
    return {"plan": doc["row"], "method": "llama.cpp " + t, "mode": "K+V (llama.cpp)",
            "stored_bits_k": bits, "stored_bits_v": bits, "ppl": r["ppl"], "ppl_sd": 0.0,
            "kld_mean": r.get("kld_mean", 0.0 if t == "f16" else None), "kld_p99": r.get("kld_p99"),
            "top1": r.get("top1", 1.0 if t == "f16" else None), "mae": None, "seeds": 1,
            "seconds": doc["seconds"], "command": clean_cmd(doc["command"]) + (
                " (LLAMA_ATTN_ROT_DISABLE=1)" if doc["params"]["no_rotation"] else "")}


def merge_run_seeds(root, m, rows):
    """Rows with run seeds 1.. in their own cells (evalr/<row>.r<s>.json, seeds_more): seed 0 is eval/<row>.json;
    the per-seed values are joined and the mean / sample sd taken as `eval --seeds` reports them. A seed cell that
    is not a finished eval cell stops the merge there (named, unfinished); one whose stored bits differ from seed 0's
    or whose per-layer MAE has another number of layers is excluded (both files named); a seed whose perplexity is
    not finite (seed 0 included) is excluded and counted in the row's ppl_status."""
    rdir = os.path.join(root, m, "evalr")
    if not os.path.isdir(rdir):
        return
    for r in rows:
        if r["mode"] != "K+V" or r["seeds"] != 1 or len(r.get("ppl_per_seed") or []) != 1:
            continue
        base = ROW_FILE.get(id(r), f"{m}/eval/{r['plan']}.json")
        extra = []
        for s in range(1, 1000):
            path = os.path.join(rdir, f"{r['plan']}.r{s}.json")
            if not os.path.exists(path):
                break
            doc = load_json(path)
            if doc is None:  # unfinished: the seeds from here on are left out
                break
            x = use_cell(path, doc, lambda d: eval_row(d, os.path.basename(path)), "eval cell",
                         f"; seeds from here on are left out of {r['plan']}")
            if x is None:
                break
            if x["mode"] != "K+V" or len(x["ppl_per_seed"]) != 1:
                note_unreadable(path, f"not a one-seed K+V eval cell; seeds from here on are left out of {r['plan']}",
                                cause="content")
                break
            if abs(x["stored_bits_k"] - r["stored_bits_k"]) >= 1e-12:
                print(f"quality_panel: {path}: stored K bits {x['stored_bits_k']} differ from seed 0's "
                      f"{r['stored_bits_k']} in {base} (another plan); this seed is left out of {r['plan']}",
                      file=sys.stderr, flush=True)
                continue
            la, lb = x["mae_layers"], r.get("mae_layers")
            if la is not None and lb is not None and len(la) != len(lb):
                print(f"quality_panel: {path}: report.plans.0.mae.layers_mean has {len(la)} layers, seed 0's in "
                      f"{base} has {len(lb)}; this seed is left out of {r['plan']}", file=sys.stderr, flush=True)
                continue
            extra.append((path, doc))
        if not extra:
            continue
        seeds = [(base, {"ppl": r["ppl_per_seed"][0], "kld": list(r["kld_per_seed"]), "p99": [r["kld_p99"]],
                         "top1": [r["top1"]], "mae": r["mae"], "layers": r["mae_layers"],
                         "mae_ps": list(r["mae_per_seed"]), "command": r["command"], "seconds": r["seconds"]})]
        for path, doc in extra:
            p = doc["report"]["plans"][0]
            nt = p["next_token"]["kv"]
            seeds.append((path, {"ppl": p["ppl_kv"]["per_seed"][0], "kld": nt["kld_mean"]["per_seed"],
                                 "p99": nt["kld_p99"]["per_seed"], "top1": nt["top1"]["per_seed"],
                                 "mae": p["mae"]["mean"], "layers": p["mae"]["layers_mean"],
                                 "mae_ps": p["mae"]["per_seed"],  # per seed: its per-layer MAE (as eval --seeds writes it)
                                 "command": clean_cmd(doc["command"]), "seconds": doc["seconds"]}))
        bad = [(path, v["ppl"]) for path, v in seeds if v["ppl"] is None or not math.isfinite(v["ppl"])]
        for path, x in bad:
            print(f"quality_panel: {path}: perplexity is {'null' if x is None else x} (the evaluation failed); this "
                  f"seed is left out of {r['plan']} and counted in its ppl_status", file=sys.stderr, flush=True)
        good = [v for path, v in seeds if v["ppl"] is not None and math.isfinite(v["ppl"])]
        status = f"{len(bad)} of {len(seeds)} seeds failed (perplexity not finite; left out)" if bad else None
        if not good:
            r.update({"ppl": None, "ppl_status": status, "seeds": 0})
            continue
        per = {k: [] for k in ("ppl", "kld", "p99", "top1", "mae", "layers", "mae_ps")}
        for v in good:
            per["ppl"].append(v["ppl"])
            per["kld"] += v["kld"]
            per["p99"] += v["p99"]
            per["top1"] += v["top1"]
            per["mae"].append(v["mae"])
            per["layers"].append(v["layers"])
            per["mae_ps"] += v["mae_ps"]
        n = len(per["ppl"])
        mu = mean(per["ppl"])
        r.update({"ppl": mu, "ppl_sd": math.sqrt(sum((x - mu) ** 2 for x in per["ppl"]) / (n - 1)) if n > 1 else 0.0,
                  "ppl_per_seed": per["ppl"], "kld_mean": mean(per["kld"]), "kld_per_seed": per["kld"],
                  "kld_p99": mean(per["p99"]), "top1": mean(per["top1"]),
                  "mae": mean(per["mae"]) if None not in per["mae"] else None, "mae_per_seed": per["mae_ps"],
                  "mae_layers": ([mean(v) for v in zip(*per["layers"])] if None not in per["layers"] else None),
                  "seeds": n, "mae_seeds": n,
                  "seed_commands": [v["command"] for v in good],
                  "seconds": good[0]["seconds"] + sum(v["seconds"] for v in good[1:])})
        if status:
            r["ppl_status"] = status
        elif r.get("ppl_status"):
            del r["ppl_status"]


def mae_comparison(rows, a, b):
    """Per-layer MAE of row a vs row b (mean over seeds): layers where a is lower, mean reduction."""
    ra = next((r for r in rows if r["plan"] == a), None)
    rb = next((r for r in rows if r["plan"] == b), None)
    if not ra or not rb:
        return None
    if not ra.get("mae_layers") or not rb.get("mae_layers"):
        return None
    la, lb = ra["mae_layers"], rb["mae_layers"]
    if len(la) != len(lb):  # zip would silently compare the first layers only
        print(f"quality_panel: the per-layer MAE of {a} ({ROW_FILE.get(id(ra), 'mae/all.json')}) has {len(la)} layers, "
              f"{b}'s ({ROW_FILE.get(id(rb), 'mae/all.json')}) {len(lb)}; expected the model's layers in both: the "
              "comparison is left out", file=sys.stderr, flush=True)
        return None
    red = [1 - x / y for x, y in zip(la, lb) if y > 0]
    return {"a": a, "b": b, "stored_bits_k_a": ra["stored_bits_k"], "stored_bits_k_b": rb["stored_bits_k"],
            "layers_lower": sum(1 for x, y in zip(la, lb) if x < y), "n_layers": len(la),
            "seeds": min(ra.get("mae_seeds", 1), rb.get("mae_seeds", 1)),
            "mean_reduction": mean(red)}


def fmt(x, digits=3):
    """x to `digits` decimals; "–" for a value not measured (None), "nan" / "inf" said as such."""
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}f}"


def cmd_report(a):
    global PANEL_ROOT
    root = PANEL_ROOT = os.path.abspath(a.out)
    doc = {"format": "ratekv-quality-panel", "version": 1,
           "settings": {"eval_text": "eval.txt", "calib_text": "calib.txt", "eval_tokens": EVAL_TOKENS, "ctx": CTX,
                        "windows": EVAL_TOKENS // CTX, "scored_tokens": (EVAL_TOKENS // CTX) * (CTX - CTX // 2 - 1),
                        "seeds": "per row ('seeds': perplexity/KLD, 'mae_seeds': per-layer MAE); per model: 'protocol'",
                        "mode": "evaluation mode (every cached K/V quantized before attention, no fp16 window/sink)"},
           "models": {}}
    md = ["# Quality panel (issue 22): ratekv's plans and the caches users run, at equal stored bytes\n",
          f"`tools/quality_panel.py report`; eval.txt, {EVAL_TOKENS} tokens = {EVAL_TOKENS // CTX} windows of {CTX}, "
          "the second half of each scored; evaluation mode (every cached K/V quantized before attention, no fp16 "
          "window/sink unless named); KLD/top-1 of the next token against the fp16 cache. Seeds per row (PPL / "
          "per-layer MAE); each model's protocol and every row's exact command are in the JSON. Rows not listed "
          "were not run. Stored bits: format/stored_bytes.h (key offsets: fixed bytes per plan, not per token).\n"]
    for m in a.model_list:
        n_unreadable = len(UNREADABLE)
        rows = rows_of(root, m)
        # RateQuant's side calibration (side/ cells), read here so that an unusable side cell is listed as left out
        pr = PROTOCOL[m]
        kst = os.path.join(root, m, "calib_stats_rq.safetensors" if pr.get("ratequant_kivi") else "calib_stats.safetensors")
        scell = os.path.join(root, m, "side", "side.json")
        sest = ({e: side_key_weight(scell, kst, e) for e in ("grad", "none")}
                if rows and os.path.exists(scell) and os.path.exists(kst) else {})
        skipped = [{"file": os.path.relpath(path, root), "why": why} for path, why in UNREADABLE[n_unreadable:]]
        if not rows:
            print(f"quality_panel report: {m}: no finished cell under {os.path.join(root, m)}; the model is left out",
                  file=sys.stderr, flush=True)
            continue
        fp16 = next((r for r in rows if r["plan"] == "fp16"), None)
        llama16 = next((r for r in rows if r["plan"] == "llama.cpp f16 (issue 22)"), None)
        for r in rows:  # llama.cpp's rows against llama.cpp's own f16 cache
            base = llama16 if "issue 22" in r["plan"] else fp16
            r["ppl_rel"] = (r["ppl"] / base["ppl"] - 1) if base and base.get("ppl") and r["ppl"] else None
            if base is fp16 and fp16 and fp16.get("ppl_status"):
                r["ppl_rel_status"] = "fp16 reference failed"
        cmps = []
        for b in (2, 3, 4):
            for x, y in [(f"gtq-K{b}V{b}", f"uniform-K{b}V{b}"), (f"gtq+off-K{b}V{b}", f"uniform+off-K{b}V{b}"),
                         (f"gtq+off-K{b}V{b}", f"uniform-K{b}V{b}"), (f"uniform+off-K{b}V{b}", f"uniform-K{b}V{b}"),
                         (f"gtq+offonly-K{b}V{b}", f"gtq-K{b}V{b}"), (f"uniform+nc-K{b}V{b}", f"uniform-K{b}V{b}")]:
                c = mae_comparison(rows, x, y)
                if c:
                    cmps.append(c)
        doc["models"][m] = {"file": MODELS[m][0], "head_dim": MODELS[m][1],
                            "protocol": {k: v for k, v in PROTOCOL[m].items() if k != "order"},
                            "rows": rows, "mae_comparisons": cmps, "skipped_cells": skipped}
        md.append(f"## {MODELS[m][0]} (head_dim {MODELS[m][1]})\n")
        if skipped:
            md.append("Left out (unfinished: the cell file is unreadable or incomplete; `run` re-runs it): "
                      + "; ".join(f"`{x['file']}` ({x['why']})" for x in skipped) + ".\n")
        if fp16:
            ref = fmt(fp16["ppl"], 4) if not fp16.get("ppl_status") else f"{fp16['ppl_status']} (failed)"
            md.append(f"fp16 cache PPL {ref}, fp32 cache {fmt(fp16['fp32_ppl'], 4)}; "
                      f"{fmt(fp16['tokens'], 0)} tokens = "
                      f"{fmt(fp16['tokens'] // CTX if fp16['tokens'] is not None else None, 0)} windows of {CTX}, "
                      f"{fmt(fp16['scored_tokens'], 0)} scored.\n")
        md.append("| plan | mode | K bits | V bits | PPL | ΔPPL vs fp16 | KLD mean | KLD p99 | top-1 % | MAE | "
                  "seeds (PPL / MAE) | windows |")
        md.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        def key(r):
            return (r["mode"].startswith("K only") or r["mode"].startswith("MAE"),
                    (r["stored_bits_k"] or 0) + (r["stored_bits_v"] or 0), r["plan"])
        for r in sorted(rows, key=key):
            ppl = fmt(r["ppl"], 3) + (f" ± {r['ppl_sd']:.3f}" if r.get("ppl_sd") else "")
            if r.get("ppl_status") and r["ppl"] is None:  # a failed (non-finite) perplexity: said, not "not run"
                ppl = f"{r['ppl_status']} (failed)"
            elif r.get("ppl_status"):  # some seeds failed: the mean of the others, and how many
                ppl += f" ({r['ppl_status']})"
            elif r["ppl"] is None:
                ppl = "–"
            rel = (fmt(100 * r["ppl_rel"], 1) + " %" if r.get("ppl_rel") is not None else
                   f"n/a ({r['ppl_rel_status']})" if r.get("ppl_rel_status") and r["ppl"] is not None else "–")
            md.append(f"| {r['plan']} | {r['mode']} | {fmt(r['stored_bits_k'], 4)} | {fmt(r['stored_bits_v'], 4)} | "
                      f"{ppl} | {rel} | "
                      f"{fmt(r['kld_mean'], 4)} | {fmt(r.get('kld_p99'), 3)} | "
                      f"{fmt(100 * r['top1'], 1) if r.get('top1') is not None else '–'} | {fmt(r.get('mae'), 3)} | "
                      f"{r['seeds']} / {r.get('mae_seeds', '–')} | {r.get('windows', '–')} |")
        md.append("")
        vq = []  # TaSQ vs CQ (K only), paired by k-means seed
        for k in range(3):
            rc = next((r for r in rows if r["plan"] == f"cq-s{k}"), None)
            for t in ("tasq", "tasq-nn"):
                rt = next((r for r in rows if r["plan"] == f"{t}-s{k}"), None)
                if rc and rt and rc["ppl"] and rt["ppl"]:
                    vq.append({"a": rt["plan"], "b": rc["plan"], "stored_bits_k_a": rt["stored_bits_k"],
                               "stored_bits_k_b": rc["stored_bits_k"], "ppl_a": rt["ppl"], "ppl_b": rc["ppl"],
                               "kld_a": rt["kld_mean"], "kld_b": rc["kld_mean"]})
        doc["models"][m]["vq_comparisons"] = vq
        for c in vq:
            md.append(f"- {c['a']} vs {c['b']} (K only; stored K {c['stored_bits_k_a']:.4f} vs {c['stored_bits_k_b']:.4f} "
                      f"bits): PPL {c['ppl_a']:.3f} vs {c['ppl_b']:.3f}, KLD {c['kld_a']:.4f} vs {c['kld_b']:.4f}")
        # RateQuant over KIVI at 2.5 code bits (as published, side-calibrated) against the better uniform split.
        splits = [r for r in rows if r["plan"] in ("uniform-kivi-K3V2", "uniform-kivi-K2V3", "uniform-kivi-2.5")
                  and r.get("ppl")]
        best = min(splits, key=lambda r: r["ppl"]) if splits else None
        rqc = []
        for name in ("ratequant-kivi-2.5", "ratequant-kivi-2.5-kw", "ratequant-kivi-2.5-flat-kw", "ratequant-kivi-2.5-b2",
                     "ratequant-kivi-2.5-kw-b2", "ratequant-kivi-2.5-flat-kw-b2"):
            r = next((r for r in rows if r["plan"] == name and r.get("ppl")), None)
            if r and best:
                rqc.append({"a": name, "b": best["plan"], "stored_bits_a": (r["stored_bits_k"] + r["stored_bits_v"]) / 2,
                            "stored_bits_b": (best["stored_bits_k"] + best["stored_bits_v"]) / 2, "ppl_a": r["ppl"],
                            "ppl_b": best["ppl"], "kld_a": r["kld_mean"], "kld_b": best["kld_mean"],
                            "below": r["ppl"] < best["ppl"]})
                md.append(f"- {name} vs the better uniform split {best['plan']} (stored {rqc[-1]['stored_bits_a']:.4f} vs "
                          f"{rqc[-1]['stored_bits_b']:.4f} b, KIVI deterministic: 1 seed): PPL {r['ppl']:.3f} vs "
                          f"{best['ppl']:.3f}, KLD {r['kld_mean']:.4f} vs {best['kld_mean']:.4f}: "
                          + ("below on PPL and KLD" if rqc[-1]["below"] and r["kld_mean"] < best["kld_mean"] else
                             "below on PPL only" if rqc[-1]["below"] else "not below"))
        doc["models"][m]["ratequant_kivi_comparisons"] = rqc
        # RateQuant's side calibration (side/ cells): measured K-only / V-only KLD ratio vs the model's prediction.
        if sest and None not in sest.values():  # (an unusable side cell is named on stderr and left out)
            sdoc = load_json(scell)
            sc = {"command": clean_cmd(sdoc["command"]), "note": sdoc.get("note"), "estimators": sest}
            doc["models"][m]["ratequant_side_calibration"] = sc
            g = sc["estimators"]["grad"]
            md.append(f"- RateQuant side calibration ({g['text']}, {g['tokens']} tokens; KIVI K-only vs V-only): "
                      + "; ".join(f"{b} b: KLD {w['kld_k']:.4f} / {w['kld_v']:.4f}, measured K/V {w['measured_k_over_v']:.2f}, "
                                  f"predicted (grad) {w['predicted_k_over_v']:.2f}" for b, w in g["widths"].items())
                      + f"; key weight grad {g['key_weight']:.3g}, none {sc['estimators']['none']['key_weight']:.3g}")
        for c in cmps:
            md.append(f"- {c['a']} vs {c['b']} (stored K {c['stored_bits_k_a']:.4f} vs {c['stored_bits_k_b']:.4f} "
                      f"bits): lower per-layer MAE in {c['layers_lower']}/{c['n_layers']} layers, mean reduction "
                      f"{100 * c['mean_reduction']:.1f} %")
        md.append("")
    if not doc["models"]:
        sys.exit(f"quality_panel report: --out {a.out}: no finished cell of {', '.join(a.model_list)}; nothing to "
                 "report (run `tools/quality_panel.py run` first, or name the models it ran with --models)")
    doc = finite_or_none(doc)  # strict JSON: a NaN / inf number is null (a row's ppl_status says why)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1, allow_nan=False)
    text = "\n".join(md) + "\n"
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if a.png:
        plot(doc, a.png)


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(doc["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, m in zip(axes[0], models):
        rows = [r for r in doc["models"][m]["rows"] if r["mode"].startswith("K+V") and r["ppl"]]
        fp16 = next((r for r in rows if r["plan"] == "fp16"), None)
        fams = {}
        for r in rows:
            fam = re.sub(r"-(K\d+V\d+|\d+(\.\d+)?)$", "", r["plan"])
            fams.setdefault(fam, []).append(r)
        for fam, rs in sorted(fams.items()):
            rs = sorted(rs, key=lambda r: r["stored_bits_k"] + r["stored_bits_v"])
            xs = [(r["stored_bits_k"] + r["stored_bits_v"]) / 2 for r in rs]
            ys = [100 * r["ppl_rel"] if r.get("ppl_rel") is not None else r["ppl"] for r in rs]
            ax.plot(xs, ys, "o-" if len(rs) > 1 else "s", label=fam)
        ax.set_xlabel("stored bits per element (mean of K and V)")
        ax.set_ylabel("PPL above the fp16 cache (%)")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(f"{doc['models'][m]['file']} (d={doc['models'][m]['head_dim']})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "status", "report"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--models", default="qwen15,qwen05,smollm2")
        if name == "run":
            s.add_argument("--only", help="regex on cell ids")
            s.add_argument("--dry-run", action="store_true")
        if name == "report":
            s.add_argument("--md")
            s.add_argument("--json")
            s.add_argument("--png")
    a = ap.parse_args()
    check_args(sub.choices[a.cmd], a)
    try:
        {"run": cmd_run, "status": cmd_status, "report": cmd_report}[a.cmd](a)
    except OSError as e:  # e.g. an output that cannot be written: the path and the reason, not a traceback
        sys.exit(f"quality_panel {a.cmd}: {e.filename or ''}: {e.strerror or e}")
    except KeyboardInterrupt:  # status / report (run handles its own: it cleans up the current cell)
        what = ("nothing was changed" if a.cmd == "status" else
                "the panel directory is unchanged; an output file being written may be incomplete: run report again")
        print(f"\nquality_panel {a.cmd}: interrupted; {what}", file=sys.stderr, flush=True)
        sys.exit(130)


def check_args(p, a):
    """Refuses bad flags before any work (p.error: usage + message, exit 2), naming the flag and what was expected."""
    names = a.models.split(",")
    for n in names:
        if n not in MODELS:
            p.error(f"--models {a.models}: unknown model {n!r}; expected a comma-separated list of: {', '.join(MODELS)}")
    if len(set(names)) != len(names):
        p.error(f"--models {a.models}: a model is named twice")
    a.model_list = names
    a.only_re = None
    if getattr(a, "only", None) is not None:
        try:
            a.only_re = re.compile(a.only)
        except re.error as e:
            p.error(f"--only {a.only!r}: not a valid regular expression ({e}); expected a Python regex on cell ids "
                    "such as 'smollm2/eval/'")
    out = os.path.abspath(a.out)
    if a.cmd == "run":  # run makes the panel directory, not its parents (a mistyped path fails here)
        if os.path.exists(out) and not os.path.isdir(out):
            p.error(f"--out {a.out}: exists and is not a directory; expected the panel directory")
        if not os.path.isdir(os.path.dirname(out)):
            p.error(f"--out {a.out}: the parent directory {os.path.dirname(out)} does not exist; expected the panel "
                    "directory (new or existing) in an existing directory")
    elif not os.path.isdir(out):
        p.error(f"--out {a.out}: no such directory; expected the panel directory that `run --out` writes")
    for flag in ("md", "json", "png"):
        path = getattr(a, flag, None)
        if path is None:
            continue
        if not path.strip():
            p.error(f"--{flag}: an empty path; expected an output file path")
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path) or not os.path.isdir(parent):
            p.error(f"--{flag} {path}: " + ("is a directory" if os.path.isdir(path) else
                                            f"the directory {parent} does not exist") + "; expected an output file path")
    if getattr(a, "png", None):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error(f"--png {a.png}: needs matplotlib (pip install matplotlib)")


if __name__ == "__main__":
    main()
