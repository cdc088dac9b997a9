#!/usr/bin/env python3
"""Device probe (session 12): where test_hf_packed_cache_on_cuda's 5.4e-2 comes from.
rel(packed CUDA, FakeQuant) for the failing case and its neighbours: uniform KbVb (the uniform
kernel: int8 key and value levels) vs Block-GTQ at the same bits (the general kernel: fp16 levels),
the CPU packed cache, and FakeQuant vs the dense cache (the quantization effect itself).
Run on the GPU machine after `STAGES=build tools/device/python_h200.sh` (session 12):
  source /tmp/ratekv-build-py/env.sh; PYTHONPATH=/tmp/ratekv-build-py/python:python/tests \\
    python3 tools/device/hf_cuda_probe.py
Output of that run: bench/results/hf_cuda_probe_h200.md. Its "cpu-vs-fq" there compared the CPU packed cache on the
CPU model with FakeQuant on the CUDA model (FakeQuant quantizes on the CPU, but the K/V it is given come from the
GPU's fp32 arithmetic): a coordinate within ~1e-7 of a Lloyd-Max threshold can take the other code, which is what
its 5.6e-3 for Block-GTQ at B = 2 is (bench/results/hf_code_tie_cpu.md). "cpu-vs-fqcpu" now compares both on the
CPU model (fp32 summation order only, ~1e-6)."""
import torch, ratekv, ratekv.hf
from transformers import DynamicCache
from conftest import rel, tiny_model
from test_hf_cache import inputs, teacher_forced

for arch, hd, nh, nkv, prompt, batch in [("llama", 128, 8, 2, 97, 2), ("qwen2", 64, 7, 1, 65, 1), ("llama", 128, 8, 2, 97, 1), ("llama", 64, 8, 2, 97, 2)]:
    m = tiny_model(arch, hd, nh, nkv)
    rc = ratekv.model_config(m.config)
    ids, nxt = inputs(batch, prompt)
    dense = teacher_forced(m, DynamicCache(config=m.config), ids, nxt)
    mg = tiny_model(arch, hd, nh, nkv).cuda(); idc, nxc = ids.cuda(), nxt.cuda()
    for name, plan in [("uniform K3V3", ratekv.uniform_plan(rc, 3, 3)), ("uniform K4V4", ratekv.uniform_plan(rc, 4, 4)),
                       ("uniform K2V2", ratekv.uniform_plan(rc, 2, 2)), ("uniform K3V4", ratekv.uniform_plan(rc, 3, 4)),
                       ("uniform K4V3", ratekv.uniform_plan(rc, 4, 3)),
                       ("block-gtq 3/3", ratekv.make_plan(ratekv._core.identity_stats(rc), "block-gtq", k_bits=3, v_bits=3))]:
        fq = teacher_forced(mg, ratekv.hf.FakeQuantCache(plan, mg.config), idc, nxc)
        cpu = teacher_forced(m, ratekv.hf.PackedCache(plan, m.config), ids, nxt)
        fqc = teacher_forced(m, ratekv.hf.FakeQuantCache(plan, m.config), ids, nxt)
        gpu = teacher_forced(mg, ratekv.hf.PackedCache(plan, mg.config), idc, nxc)
        # per-step: prefill logits (step 0) vs decode steps
        r_pref = rel(gpu[0], fq[0]); r_dec = rel(gpu[1:], fq[1:])
        print(f"{arch} hd={hd} nh={nh} nkv={nkv} T={prompt} B={batch} {name:14s}: gpu-vs-fq {rel(gpu, fq):.2e} (prefill step {r_pref:.2e}, decode {r_dec:.2e})  cpu-vs-fq {rel(cpu, fq):.2e}  cpu-vs-fqcpu {rel(cpu, fqc):.2e}  fq-vs-dense {rel(fq, dense):.2e}", flush=True)
