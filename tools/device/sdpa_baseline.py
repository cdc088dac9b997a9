#!/usr/bin/env python3
"""torch SDPA flash fp16 decode-attention baseline for bench_cuda_decode.

Same shapes and timing rules as bench/cuda/decode_attention.cpp: Llama-3.1-8B
(32 query / 8 KV heads) and Qwen2.5-3B (16 / 2) attention, head_dim 128, one
query token per sequence, the same (B, T) cases; CUDA events around the SDPA
call only, median of 30 runs, a 512 MB memset before each run to flush L2; at
T <= 32K also the call captured in a CUDA graph and replayed (ms_graph), as the
benchmark does for ours. Flash backend forced (no fallback: a failure is
recorded as an error row).
The grid is issue 19's: both shapes, B in {1, 8, 32}, T in {4K, 32K, 128K}, and
512K where the fp16 cache fits (bench_cuda_decode runs the same list).
--prefill also times the causal prefill attention of one layer (B = 1, T in
{4K, 32K, 128K}, the prompt's queries against its own K/V, flash backend), the
denominator of bench_cuda_decode's prefill-quantize fraction.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its siblings, from any working directory
from cuda_timing import l2_flush_buffer, median_ms  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--reps", type=int, default=30)
ap.add_argument("--prefill", action="store_true")
ap.add_argument("--only-T", default="", help="comma-separated context lengths: only these (bench_cuda_decode's --only-T)")
args = ap.parse_args()

D = 128
MODELS = {"llama-3.1-8b": (32, 8), "qwen2.5-3b": (16, 2)}
CASES = [(m, B, T) for m in ("llama-3.1-8b", "qwen2.5-3b") for B in (1, 8, 32) for T in (4096, 32768, 131072)]
CASES += [("llama-3.1-8b", 1, 524288), ("llama-3.1-8b", 8, 524288),
          ("qwen2.5-3b", 1, 524288), ("qwen2.5-3b", 8, 524288), ("qwen2.5-3b", 32, 524288)]
CASES += [("llama-3.1-8b", 109, 512)]  # a serving point (bench_cuda_decode has it too)
if args.only_T:
    keep = {int(t) for t in args.only_T.split(",")}
    CASES = [c for c in CASES if c[2] in keep]

dev = torch.device("cuda")
flush = l2_flush_buffer(dev)  # 512 MiB, filled before every timed run

rows = []
for model, B, T in CASES:
    HQ, HKV = MODELS[model]
    g = torch.Generator(device=dev).manual_seed(B * 1000003 + T + HQ)
    q = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.float16, generator=g)
    k = torch.randn(B, HKV, T, D, device=dev, dtype=torch.float16, generator=g)
    v = torch.randn(B, HKV, T, D, device=dev, dtype=torch.float16, generator=g)
    row = {"model": model, "cache": "sdpa-flash-fp16", "B": B, "T": T}
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            torch.cuda.synchronize()
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), args.reps, flush)
            ms_graph = -1.0
            if T <= 32768:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                ms_graph = median_ms(graph.replay, args.reps, flush)
        nbytes = B * T * HKV * 2 * D * 2
        row.update({"ms": ms, "ms_graph": ms_graph, "cache_bytes": nbytes,
                    "GBps": nbytes / (ms * 1e-3) / 1e9})
        print(f"sdpa-flash-fp16 {model} B={B} T={T}: {ms:.4f} ms (graph {ms_graph:.4f}), "
              f"{row['GBps']:.0f} GB/s", flush=True)
    except Exception as e:  # recorded, never replaced by another backend
        row["error"] = repr(e)
        print(f"sdpa-flash-fp16 {model} B={B} T={T}: ERROR {e!r}", flush=True)
    rows.append(row)
    del q, k, v
    torch.cuda.empty_cache()
prefill = []
if args.prefill:
    for model in MODELS:
        HQ, HKV = MODELS[model]
        for T in (4096, 32768, 131072):
            g = torch.Generator(device=dev).manual_seed(T + HQ)
            q = torch.randn(1, HQ, T, D, device=dev, dtype=torch.float16, generator=g)
            k = torch.randn(1, HKV, T, D, device=dev, dtype=torch.float16, generator=g)
            v = torch.randn(1, HKV, T, D, device=dev, dtype=torch.float16, generator=g)
            row = {"model": model, "B": 1, "T": T, "what": "causal prefill attention, one layer"}
            try:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    fn()
                    torch.cuda.synchronize()
                    ms = median_ms(fn, 5, flush)
                flop = 4.0 * HQ * D * T * T / 2  # QK^T and PV, causal half
                row.update({"ms": ms, "TFLOPs": flop / (ms * 1e-3) / 1e12})
                print(f"sdpa-flash prefill {model} T={T}: {ms:.3f} ms ({row['TFLOPs']:.0f} TFLOP/s)", flush=True)
            except Exception as e:
                row["error"] = repr(e)
                print(f"sdpa-flash prefill {model} T={T}: ERROR {e!r}", flush=True)
            prefill.append(row)
            del q, k, v
            torch.cuda.empty_cache()
json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows,
           "prefill": prefill}, open(args.out, "w"), indent=2)
