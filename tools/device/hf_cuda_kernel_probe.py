#!/usr/bin/env python3
"""Device probe 3 (session 12): one decode_attention call per layer of the tiny llama hd-128 model of
test_hf_packed_cache_on_cuda, on that model's own post-RoPE K/V (prompt 97 + 1 decode token) and decode-step
query: GPU packed (one prefill append / token-by-token appends) vs the CPU packed cache on the same K/V/Q, and the
CPU packed cache vs dense fp32 attention (the quantization's own effect). rel = max|a-b| / max|b|.
Run on the GPU machine after `STAGES=build tools/device/python_h200.sh`:
  source /tmp/ratekv-build-py/env.sh; PYTHONPATH=/tmp/ratekv-build-py/python:python/tests \\
    python3 tools/device/hf_cuda_kernel_probe.py
Output of that run: bench/results/hf_cuda_probe_h200.md, section 4 (run with the capture inline; it now
calls python/tests/test_cuda.py's model_kv_and_query, the same computation)."""
import torch

import ratekv
from conftest import rel
from ratekv.ops import PackedKVCache
from test_cuda import model_kv_and_query  # the model's K/V/Q, as the test of the same name uses them

rc, kv, qs = model_kv_and_query("llama", 128, 8, 2, 97, 2)
cuda = torch.cuda.is_available() and ratekv.has_cuda
for name, plan in [("uniform K3V3", ratekv.uniform_plan(rc, 3, 3)), ("uniform K3V4 (general kernel)", ratekv.uniform_plan(rc, 3, 4))]:
    for l, (K, V) in enumerate(kv):                           # (B, T, nkv, hd) each
        q = qs[l]                                            # (B, nh, hd)
        B, T, nkv, hd = K.shape
        nh = q.shape[1]
        scale = hd ** -0.5
        Kx = K.repeat_interleave(nh // nkv, dim=2)
        Vx = V.repeat_interleave(nh // nkv, dim=2)
        s = torch.einsum("bhd,bthd->bht", q, Kx) * scale
        dense = torch.einsum("bht,bthd->bhd", s.softmax(-1), Vx)
        cpu = PackedKVCache(plan, rc, B, 512, device="cpu")
        cpu.append(l, K, V)
        o_cpu = cpu.decode_attention(l, q, scale)
        line = f"{name} layer {l}: max|score| {s.abs().max():.1f}, max softmax weight {s.softmax(-1).max():.3f}; cpu-vs-dense {rel(o_cpu, dense):.2e}"
        if cuda:
            g1 = PackedKVCache(plan, rc, B, 512, device="cuda")
            g1.append(l, K.cuda(), V.cuda())
            o1 = g1.decode_attention(l, q.cuda(), scale)
            g2 = PackedKVCache(plan, rc, B, 512, device="cuda")
            for t in range(T):
                g2.append(l, K[:, t:t + 1].cuda(), V[:, t:t + 1].cuda())
            o2 = g2.decode_attention(l, q.cuda(), scale)
            line += f"; gpu(prefill)-vs-cpu {rel(o1, o_cpu):.2e}; gpu(token by token)-vs-cpu {rel(o2, o_cpu):.2e}"
            # the same with the query rounded to fp16 on the CPU side: what the GPU's fp16 query costs
            o_cpu16 = cpu.decode_attention(l, q.half().float(), scale)
            line += f"; cpu(q fp16)-vs-cpu {rel(o_cpu16, o_cpu):.2e}"
        print(line, flush=True)
