#!/usr/bin/env python3
"""CPU (session 12): how far does fp16 rounding alone move the teacher-forced logits of the tiny HF models of
python/tests/test_cuda.py::test_hf_packed_cache_on_cuda? FakeQuant K3V3 in fp32 against FakeQuant with the decode
steps' query (q_proj output) and/or the K/V the attention reads rounded to fp16 (the GPU kernels round the
rotated, scaled query to fp16 and the levels to fp16 / int8). rel = max|diff| / max|fp32| over the decode steps.
Usage (repo root, the package built: PYTHONPATH=build/python): python3 tools/hf_fp16_emulation.py
Output of that run: bench/results/hf_cuda_probe_h200.md, section 3."""
import pathlib
import sys

import torch

import ratekv
import ratekv.hf
from ratekv.hf import FakeQuantLayer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python" / "tests"))
from conftest import rel, tiny_model
from test_hf_cache import inputs, teacher_forced

orig_update = FakeQuantLayer.update
MODE = {"kv": False}
def update16(self, k, v, *a, **kw):
    ko, vo = orig_update(self, k, v, *a, **kw)
    if MODE["kv"] and k.shape[-2] == 1:
        return ko.half().float(), vo.half().float()
    return ko, vo
FakeQuantLayer.update = update16

for arch, hd, nh, nkv, prompt, batch in [("llama", 128, 8, 2, 97, 2), ("qwen2", 64, 7, 1, 65, 1), ("llama", 64, 8, 2, 97, 2)]:
    m = tiny_model(arch, hd, nh, nkv)
    rc = ratekv.model_config(m.config)
    ids, nxt = inputs(batch, prompt)
    plan = ratekv.uniform_plan(rc, 3, 3)
    qmode = {"on": False}
    def hook(mod, inp, out):
        return out.half().float() if (qmode["on"] and out.shape[1] == 1) else out
    hs = [l.self_attn.q_proj.register_forward_hook(hook) for l in m.model.layers]
    res = {}
    for name, q, kv in [("fp32", False, False), ("q fp16", True, False), ("kv fp16", False, True), ("q+kv fp16", True, True)]:
        qmode["on"], MODE["kv"] = q, kv
        res[name] = teacher_forced(m, ratekv.hf.FakeQuantCache(plan, m.config), ids, nxt)
    print(f"{arch} hd={hd} T={prompt} B={batch} K3V3 FakeQuant: " + "  ".join(f"{n} vs fp32 {rel(res[n][1:], res['fp32'][1:]):.2e}" for n in ["q fp16", "kv fp16", "q+kv fp16"]), flush=True)
    for h in hs: h.remove()
