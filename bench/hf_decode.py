#!/usr/bin/env python3
"""Decode step time and KV memory of Hugging Face transformers with ratekv's PackedCache vs DynamicCache.

Issue 23 "What it must show": a Llama-3.1-8B-shaped model (random bf16 weights), depths 4K/32K/128K,
B = 1 and the largest B an fp16 cache fits, DynamicCache (SDPA) and PackedCache K3V3 / K2V2 /
Block-GTQ, eager and torch.compile'd where it compiles. Rows:
{"cache", "B", "depth", "step_ms", "decode_tok_s", "kv_gb", "compiled"} (+ "error" when a point fails).

The cache is filled to `depth` with random K/V (keys N(0,1)·0.5, values N(0,1)) through each cache's
own write path (DynamicCache.update; PackedCache's prefill op), not by a prefill of that length; then
`--steps` decode steps of one token per sequence are timed (CUDA events, median). Block-GTQ's plan
comes from ratekv.calibrate() of the random model on random tokens (its statistics are those of the
random weights: the point is speed and memory, not quality).

torch.compile rows (--compile compiled): model.forward compiled with dynamic shapes (inductor); the
first warmup step's time is the compile (``compile_s``), and the row records what dynamo did over all
steps (``graphs``, ``graph_breaks``, ``recompiles`` from torch._dynamo's counters), so a "compiled" row
that mostly ran eager is visible as such. A point that fails to compile records the reason in "error".

The output JSON is rewritten after every row (a run stopped by a time limit keeps what it measured;
the row in progress is written first with "error": "not finished ..." so the reason is in the file).
--append adds the rows to an existing file (one table from an eager and a compiled process).

    python bench/hf_decode.py --out bench/results/hf_h200.json          # GPU machine, full table
    python bench/hf_decode.py --config tiny --device cpu --depths 96,200  # logic check on a CPU
"""

import argparse
import gc
import json
import os
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import ratekv
import ratekv.hf

CONFIGS = {
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                         max_position_embeddings=131072 + 4096, rms_norm_eps=1e-5),
    "tiny": dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096),
}


def build_model(name, device, dtype):
    cfg = LlamaConfig(**CONFIGS[name], attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            m = LlamaForCausalLM(cfg)
        finally:
            torch.set_default_dtype(old)
    return m.eval()


def kv_fill(cfg, B, T, layer, device, dtype):
    g = torch.Generator(device=device).manual_seed(1000 + layer)
    shape = (B, cfg.num_key_value_heads, T, cfg.head_dim)
    k = torch.randn(shape, generator=g, device=device, dtype=dtype) * 0.5
    v = torch.randn(shape, generator=g, device=device, dtype=dtype)
    return k, v


def make_cache(kind, plans, model, B, T, device, dtype, chunk=8192):
    """A cache holding T random tokens per sequence in every layer. Packed caches are filled
    through the store's prefill op in chunks of `chunk` tokens (the write path of a prompt; the
    chunks keep the transient fp16 K/V small at large B·T)."""
    cfg = model.config
    if kind == "dynamic":
        cache = DynamicCache(config=cfg)
        for li in range(cfg.num_hidden_layers):
            k, v = kv_fill(cfg, B, T, li, device, dtype)
            cache.update(k, v, li)
            del k, v
        return cache
    cache = ratekv.hf.PackedCache(plans[kind], cfg, max_cache_len=T + 64)
    probe = torch.empty(B, cfg.num_key_value_heads, 0, cfg.head_dim, device=device, dtype=dtype)
    for li, layer in enumerate(cache.layers):
        layer.lazy_initialization(probe, probe)
        for t0 in range(0, T, chunk):
            k, v = kv_fill(cfg, B, min(chunk, T - t0), li * 1000 + t0 // chunk, device, dtype)
            cache.store.append(li, k.transpose(1, 2), v.transpose(1, 2))
            del k, v
        layer.length = T
        layer.mode = "decode"
    return cache


def kv_bytes(cache):
    if isinstance(cache, ratekv.hf.PackedCache):
        return cache.nbytes
    return sum(l.keys.numel() * l.keys.element_size() + l.values.numel() * l.values.element_size()
               for l in cache.layers)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(fwd, model, cache, B, T, steps, warmup, device, first=None):
    """Median ms of `steps` decode steps after `warmup`; `first` (a list) receives the first
    step's ms (with torch.compile: the compile)."""
    tok = torch.zeros(B, 1, dtype=torch.long, device=device)
    times = []
    for i in range(warmup + steps):
        pos = torch.full((B, 1), T + i, dtype=torch.long, device=device)
        if device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            with torch.no_grad():
                fwd(input_ids=tok, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
            e1.record()
            torch.cuda.synchronize()
            ms = e0.elapsed_time(e1)
        else:
            t0 = time.perf_counter()
            with torch.no_grad():
                fwd(input_ids=tok, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
            ms = (time.perf_counter() - t0) * 1e3
        if i == 0 and first is not None:
            first.append(ms)
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


def dynamo_counts():
    """Graphs compiled, graph breaks and recompiles so far (torch._dynamo's counters)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "recompiles": int(counters["recompiles"].get("total", 0)) if "recompiles" in counters else None}


class Output:
    """The JSON file, rewritten after every row (with --append: added to the file's rows)."""

    def __init__(self, path, append, meta):
        """meta: this run's; with append, it goes to the file's meta["appended_runs"]."""
        self.path, self.meta, self.rows, self.meta_run = path, meta, [], meta
        if path and append and os.path.exists(path):
            with open(path) as f:
                old = json.load(f)
            self.rows = old.get("rows", [])
            self.meta = old.get("meta", {})
            self.meta.setdefault("appended_runs", []).append(meta)

    def write(self):
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"meta": self.meta, "rows": self.rows}, f, indent=1)
            os.replace(tmp, self.path)

    def start(self, row):
        self.rows.append(dict(row, error="not finished: the process was stopped (time limit) during this point"))
        self.write()

    def finish(self, row):
        self.rows[-1] = row
        self.write()
        print(json.dumps(row), flush=True)


def largest_batch(per_seq_bytes, device, reserve_gb):
    if device.type != "cuda":
        return 2
    free, _ = torch.cuda.mem_get_info()
    return max(1, int((free - reserve_gb * 2**30) // per_seq_bytes))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="llama-3.1-8b", choices=sorted(CONFIGS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--depths", default="4096,32768,131072")
    ap.add_argument("--caches", default="dynamic,K3V3,K2V2,gtq-K3V3")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", default="eager,compiled", help="eager, compiled or both (comma list)")
    ap.add_argument("--batches", default="1,max", help="batch sizes; 'max' = the largest an fp16 cache fits")
    ap.add_argument("--reserve-gb", type=float, default=6.0, help="memory kept free for activations")
    ap.add_argument("--out", default="")
    ap.add_argument("--append", action="store_true", help="add the rows to --out's existing rows")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (inductor; 'eager' = dynamo only)")
    ap.add_argument("--no-capacity", action="store_true", help="skip the capacity measurements and rows")
    a = ap.parse_args()
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(a.config, device, dtype)
    cfg = model.config
    rc = ratekv.model_config(cfg)
    plans = {"K3V3": ratekv.uniform_plan(rc, 3, 3), "K2V2": ratekv.uniform_plan(rc, 2, 2)}
    if "gtq-K3V3" in a.caches:
        g = torch.Generator().manual_seed(7)
        st = ratekv.calibrate(model, token_ids=torch.randint(0, cfg.vocab_size, (1024,), generator=g), ctx=512)
        plans["gtq-K3V3"] = ratekv.make_plan(st, "block-gtq", k_bits=3, v_bits=3, budget_unit="code")
    fp16_per_token = rc.kv_bytes_per_token_fp16()
    meta = {"config": a.config, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "dtype": str(dtype), "torch": torch.__version__, "steps": a.steps, "warmup": a.warmup,
            "fill": "random K/V through each cache's write path (synthetic_fill)",
            "plans": {k: p.achieved for k, p in plans.items()}}
    meta["compile"] = a.compile
    if "compiled" in a.compile:
        meta["compile_backend"] = a.backend
    out = Output(a.out, a.append, meta)
    meta = out.meta_run
    fwds = {"eager": model.forward} if "eager" in a.compile else {}
    if "compiled" in a.compile:
        fwds["compiled"] = torch.compile(model.forward, dynamic=True, backend=a.backend)
    for T in [int(x) for x in a.depths.split(",")]:
        b_fp16 = largest_batch(fp16_per_token * (T + a.warmup + a.steps + 64), device, a.reserve_gb)
        batches = sorted({b_fp16 if x == "max" else int(x) for x in a.batches.split(",")})
        for B in batches:
            for kind in a.caches.split(","):
                for mode, fwd in fwds.items():
                    row = {"cache": kind if kind != "dynamic" else "dynamic-sdpa", "B": B, "depth": T,
                           "compiled": mode == "compiled"}
                    out.start(row)
                    try:
                        cache = make_cache(kind, plans, model, B, T, device, dtype)
                        row["kv_gb"] = kv_bytes(cache) / 1e9
                        first = []
                        before = dynamo_counts() if mode == "compiled" else None
                        ms = time_steps(fwd, model, cache, B, T, a.steps, a.warmup, device, first)
                        row.update(step_ms=ms, decode_tok_s=B * 1e3 / ms)
                        if mode == "compiled":
                            after = dynamo_counts()
                            row["compile_s"] = first[0] / 1e3
                            row.update({k: (None if after[k] is None else after[k] - (before[k] or 0))
                                        for k in after})
                    except Exception as e:  # a point that fails (OOM, compile error) is recorded, not hidden
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    finally:
                        cache = None
                        gc.collect()
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                    out.finish(row)
        # Capacity at this depth: the largest batch each cache's K/V fits (K/V bytes per sequence).
        for kind in [k for k in a.caches.split(",") if k != "dynamic" and not a.no_capacity]:
            per_seq = None
            try:
                c = make_cache(kind, plans, model, 1, T, device, dtype)
                per_seq = kv_bytes(c)
                c = None
                gc.collect()
            except Exception as e:
                meta.setdefault("capacity_errors", {})[f"{kind}@{T}"] = str(e)[:200]
            if per_seq:
                meta.setdefault("capacity", {})[f"{kind}@{T}"] = {
                    "bytes_per_seq": per_seq, "fp16_bytes_per_seq": fp16_per_token * T,
                    "ratio_vs_fp16": fp16_per_token * T / per_seq}
    # Capacity: at the deepest depth, one decode row of each packed cache at the largest batch its
    # pages fit (the fp16 cache's largest batch is b_fp16 above).
    T = max(int(x) for x in a.depths.split(","))
    for kind in [k for k in a.caches.split(",") if k != "dynamic"]:
        cap = meta.get("capacity", {}).get(f"{kind}@{T}")
        if not cap or device.type != "cuda":
            continue
        B = largest_batch(cap["bytes_per_seq"] * (T + 64 + a.warmup + a.steps) / T, device, a.reserve_gb)
        row = {"cache": kind, "B": B, "depth": T, "compiled": False, "largest_batch": True}
        out.start(row)
        try:
            cache = make_cache(kind, plans, model, B, T, device, dtype)
            row["kv_gb"] = kv_bytes(cache) / 1e9
            ms = time_steps(model.forward, model, cache, B, T, a.steps, a.warmup, device)
            row.update(step_ms=ms, decode_tok_s=B * 1e3 / ms)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            cache = None
            gc.collect()
            torch.cuda.empty_cache()
        out.finish(row)
    meta["fp16_largest_batch"] = {str(T): largest_batch(fp16_per_token * T, device, a.reserve_gb)
                                  for T in [int(x) for x in a.depths.split(",")]}
    out.write()
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
