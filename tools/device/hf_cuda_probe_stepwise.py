#!/usr/bin/env python3
"""Device probe 2 (session 12): the prompt fed one token at a time (every cache write is
cuda::packed_append: fp32 rotation, the reference's codes up to fp32 summation order) against one
prefill call (cuda::packed_prefill, tensor_cores: TF32 rotation for fp32 inputs, codes may differ
near a midpoint). rel = max|GPU packed - FakeQuant| / max|FakeQuant| over the decode-step logits.
Run on the GPU machine after `STAGES=build tools/device/python_h200.sh` (session 12):
  source /tmp/ratekv-build-py/env.sh; PYTHONPATH=/tmp/ratekv-build-py/python:python/tests \\
    python3 tools/device/hf_cuda_probe_stepwise.py
Output of that run: bench/results/hf_cuda_probe_h200.md."""
import torch, ratekv, ratekv.hf
from conftest import rel, tiny_model
from test_hf_cache import inputs, teacher_forced

def stepwise(model, cache, ids, nxt):
    outs = []
    with torch.no_grad():
        for i in range(ids.shape[1]):
            o = model(ids[:, i:i + 1], past_key_values=cache, use_cache=True)
        outs.append(o.logits[:, -1])
        for t in range(nxt.shape[1]):
            o = model(nxt[:, t:t + 1], past_key_values=cache, use_cache=True)
            outs.append(o.logits[:, -1])
    return torch.stack(outs)

for arch, hd, nh, nkv, prompt, batch in [("llama", 128, 8, 2, 97, 2), ("llama", 128, 8, 2, 97, 1), ("qwen2", 64, 7, 1, 65, 1)]:
    mg = tiny_model(arch, hd, nh, nkv).cuda()
    rc = ratekv.model_config(mg.config)
    ids, nxt = (t.cuda() for t in inputs(batch, prompt))
    for name, plan in [("uniform K3V3", ratekv.uniform_plan(rc, 3, 3)), ("uniform K2V2", ratekv.uniform_plan(rc, 2, 2)),
                       ("uniform K3V4", ratekv.uniform_plan(rc, 3, 4)),
                       ("block-gtq 3/3", ratekv.make_plan(ratekv._core.identity_stats(rc), "block-gtq", k_bits=3, v_bits=3))]:
        fq1 = teacher_forced(mg, ratekv.hf.FakeQuantCache(plan, mg.config), ids, nxt)
        g1 = teacher_forced(mg, ratekv.hf.PackedCache(plan, mg.config), ids, nxt)
        fqs = stepwise(mg, ratekv.hf.FakeQuantCache(plan, mg.config), ids, nxt)
        gs = stepwise(mg, ratekv.hf.PackedCache(plan, mg.config), ids, nxt)
        print(f"{arch} hd={hd} nh={nh} nkv={nkv} T={prompt} B={batch} {name:14s}: one prefill call {rel(g1[1:], fq1[1:]):.2e}"
              f"   token by token (packed_append only) {rel(gs[1:], fqs[1:]):.2e}", flush=True)
