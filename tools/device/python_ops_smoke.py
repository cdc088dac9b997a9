#!/usr/bin/env python3
"""A small run of every ratekv CUDA op (prefill, append, decode attention; fp32 and fp16 inputs;
head_dim 64/128/256; uniform and Block-GTQ-like mixed plans) for compute-sanitizer
(tools/device/python_h200.sh). Prints one line per case; exits non-zero on any error or on a
cache that outlives its last reference (a reference cycle or a reference kept by torch)."""
import gc
import sys
import weakref

import torch

import ratekv
from ratekv.ops import PackedKVCache


def cfg(hd, nh, nkv):
    c = ratekv.ModelConfig()
    c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim = "llama", 1, nh, nkv, hd
    c.d_model, c.d_ff, c.n_vocab, c.n_ctx_train, c.rope_theta, c.rms_eps = 256, 512, 100, 4096, 1e4, 1e-5
    c.rope_layout = ratekv.RopeLayout.neox
    return c


alive = []  # weak references to every cache: each must be freed once dropped (no reference cycle, no
# reference kept by torch or the CUDA stream), which is what nanobind's exit-time leak report checks
for hd, nh, nkv, T, bits in [(64, 4, 2, 70, 3), (128, 8, 2, 129, 2), (256, 2, 1, 33, 4), (128, 32, 2, 65, 0)]:
    c = cfg(hd, nh, nkv)
    # bits 0: a Block-GTQ plan, K at 3.5 effective bits (mixed widths: the runtime-tables kernels)
    plan = (ratekv.make_plan(ratekv._core.identity_stats(c), "block-gtq", k_bits=3.5, v_bits=3.25) if bits == 0
            else ratekv.uniform_plan(c, bits, bits))
    for dtype in (torch.float32, torch.float16):
        cache = PackedKVCache(plan, c, 2, 256, device="cuda")
        k = torch.randn(2, T, nkv, hd, device="cuda", dtype=dtype)
        cache.append(0, k, k)
        cache.append(0, k[:, :1], k[:, :1])
        out = cache.decode_attention(0, torch.randn(2, nh, hd, device="cuda", dtype=dtype))
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        print(f"ok hd={hd} gqa={nh // nkv} T={T} bits={bits} {dtype}", flush=True)
        alive.append(weakref.ref(cache))
        del cache, out
        gc.collect()
n_alive = sum(w() is not None for w in alive)
print(f"caches still alive after being dropped: {n_alive} of {len(alive)}", flush=True)
sys.exit(1 if n_alive else 0)
