#!/usr/bin/env python3
"""torch SDPA flash fp16 decode-attention baseline for bench_cuda_decode.

Same shapes and timing rules as bench/cuda/decode_attention.cpp: Llama-3.1-8B
attention (32 query / 8 KV heads, head_dim 128), one query token per sequence,
B in {1, 8}, T in {4K, 32K, 128K}; CUDA events around the SDPA call only,
median of 30 runs, a 512 MB memset before each run to flush L2. Flash backend
forced (no fallback: a failure is recorded as an error row).
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--reps", type=int, default=30)
args = ap.parse_args()

HQ, HKV, D = 32, 8, 128
dev = torch.device("cuda")
flush = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
rows = []
for B in (1, 8):
    for T in (4096, 32768, 131072):
        g = torch.Generator(device=dev).manual_seed(B * 1000003 + T)
        q = torch.randn(B, HQ, 1, D, device=dev, dtype=torch.float16, generator=g)
        k = torch.randn(B, HKV, T, D, device=dev, dtype=torch.float16, generator=g)
        v = torch.randn(B, HKV, T, D, device=dev, dtype=torch.float16, generator=g)
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                torch.cuda.synchronize()
                ts = []
                for i in range(args.reps):
                    flush.fill_(i & 0xFF)
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    b.record()
                    b.synchronize()
                    ts.append(a.elapsed_time(b))
            ts.sort()
            ms = ts[len(ts) // 2]
            nbytes = B * T * HKV * 2 * D * 2
            rows.append({"cache": "sdpa-flash-fp16", "B": B, "T": T, "ms": ms,
                         "cache_bytes": nbytes, "GBps": nbytes / (ms * 1e-3) / 1e9})
            print(f"sdpa-flash-fp16 B={B} T={T}: {ms:.4f} ms, {rows[-1]['GBps']:.0f} GB/s", flush=True)
        except Exception as e:  # recorded, never replaced by another backend
            rows.append({"cache": "sdpa-flash-fp16", "B": B, "T": T, "error": repr(e)})
            print(f"sdpa-flash-fp16 B={B} T={T}: ERROR {e!r}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows},
          open(args.out, "w"), indent=2)
