#!/usr/bin/env python3
"""Why the H200 probe's "CPU vs FakeQuant" column reads 5.6e-3 for Block-GTQ 3/3 at B = 2 (section 1 of
bench/results/hf_cuda_probe_h200.md; write-up in bench/results/hf_code_tie_cpu.md). CPU only, no GPU.

That column compared the CPU packed cache on the CPU model with FakeQuantCache on the CUDA model
(tools/device/hf_cuda_probe.py: ``fq`` is run on ``mg``): FakeQuant quantizes on the CPU, but the K/V it
quantizes come from the GPU's fp32 arithmetic. This script
  1. compares the CPU packed cache with FakeQuant both on the CPU model (rel over the decode-step logits);
  2. recomputes every stored row's codes from the plan (the rotation Π and Lloyd–Max thresholds dumped by
     rotation_dump.cpp; checked against fake_quantize's output) and lists the coordinates nearest a
     threshold: y − θ in the fp32 model and in the same model run in float64 (prompt rows);
  3. forces the neighbouring code on each such coordinate in FakeQuant and prints the decode-logit change
     rel(flipped, unflipped), per sequence — the fingerprint a one-code difference leaves.

Build the helper against a CPU build of the library (Release, same flags as the build's objects):
  g++ -std=c++20 -O2 -march=native -fopenmp -Iinclude -Isrc -isystem /usr/include/eigen3 -DFMT_SHARED \\
    -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB tools/code_tie/rotation_dump.cpp \\
    -o /tmp/rotation_dump BUILD/src/libratekv_quant.a BUILD/src/libratekv_common.a -lfmt -lspdlog
Run (from the repo root; the Python package of a -DRATEKV_PYTHON=ON build on PYTHONPATH):
  ROTATION_DUMP=/tmp/rotation_dump PYTHONPATH=BUILD/python:python/tests python3 tools/code_tie/hf_code_tie_probe.py
Needs torch, transformers (≥ 5), numpy. About 1 minute on 2 cores."""
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
from transformers import DynamicCache

import ratekv
import ratekv.hf
from conftest import rel, tiny_model
from test_hf_cache import inputs, teacher_forced

TOOL = os.environ.get("ROTATION_DUMP", "/tmp/rotation_dump")
PROMPT = 97
MODEL = ("llama", 128, 8, 2)  # the probe's failing case: hd 128, 8 q heads, 2 KV heads, 2 layers
m = tiny_model(*MODEL)
rc = ratekv.model_config(m.config)
PLANS = {"uniform K3V3": ratekv.uniform_plan(rc, 3, 3), "uniform K4V4": ratekv.uniform_plan(rc, 4, 4),
         "uniform K2V2": ratekv.uniform_plan(rc, 2, 2), "uniform K3V4": ratekv.uniform_plan(rc, 3, 4),
         "uniform K4V3": ratekv.uniform_plan(rc, 4, 3),
         "block-gtq 3/3": ratekv.make_plan(ratekv._core.identity_stats(rc), "block-gtq", k_bits=3, v_bits=3)}
_rot = {}


def rot(mdim, bits, seed):
    """(Π (m, m) float64 with y = Π u, thresholds (2^b − 1), levels (2^b)) of one TQ-MSE group."""
    k = (mdim, bits, seed)
    if k not in _rot:
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            subprocess.run([TOOL, str(mdim), str(bits), str(seed), f.name], check=True)
            a = np.fromfile(f.name, dtype=np.float32)
        nt = 2**bits - 1
        _rot[k] = (a[:mdim * mdim].reshape(mdim, mdim).astype(np.float64), a[mdim * mdim:mdim * mdim + nt],
                   a[mdim * mdim + nt:])
    return _rot[k]


def groups(plan, layer, head, side):
    """[(channels, bits, seed)] of one codec; Block-GTQ blocks are neox pairs (b, b + d/2)."""
    j = json.loads(plan.to_json())["layers"][layer]["heads"][head][side]
    half = plan.head_dim // 2
    return [(np.array(g.get("channels") or [c for b in g["blocks"] for c in (b, b + half)]), g["bits"], g["seed"])
            for g in j["groups"] if g["bits"] > 0]


def codes_of(x, P, th):
    """x (..., m) → (y = Π x/‖x‖ in float64, codes #{θ_j < y})."""
    y = (x / np.linalg.norm(x, axis=-1, keepdims=True)) @ P.T
    return y, (y[..., None] > th).sum(-1)


def fp16_norm(x):
    """The stored norm as TQ-MSE makes it: ‖x‖ summed in double, cast to fp32, rounded to fp16 (rounding the
    double straight to fp16 differs at fp16 ties: a 5e-4 relative change of the row)."""
    return np.linalg.norm(x, axis=-1, keepdims=True).astype(np.float32).astype(np.float16).astype(np.float64)


_orig_update = ratekv.hf.FakeQuantLayer.update


def fake_quant_run(plan, batch, flip=None, capture=None):
    """Teacher-forced FakeQuant logits (9, B, vocab) on the CPU model. flip = (layer, side, b, head, token, group,
    coord, code): that coordinate's code forced, its row rebuilt as ñ Πᵀ c[idx]. capture: dict filled with the
    K/V rows each layer quantized."""
    ids, nxt = inputs(batch, PROMPT)

    def hook(self, k, v, *a, **kw):
        t_old = self.get_seq_length()
        if capture is not None:
            capture.setdefault(self.layer_idx, []).append((k.clone(), v.clone()))
        out = _orig_update(self, k, v, *a, **kw)
        if flip and flip[0] == self.layer_idx:
            layer, side, b, h, t, gi, i, code = flip
            if t_old <= t < t_old + k.shape[2]:
                ch, bits, seed = groups(plan, layer, h, side)[gi]
                P, th, lv = rot(len(ch), bits, seed)
                x = (k if side == "key" else v)[b, h, t - t_old].double().numpy()[ch]
                _, c = codes_of(x, P, th)
                c[i] = code
                row = (self.keys if side == "key" else self.values)[b, h, t]
                row[torch.as_tensor(ch)] = torch.from_numpy(fp16_norm(x) * lv[c] @ P).float()
        return out

    ratekv.hf.FakeQuantLayer.update = hook
    try:
        cache = ratekv.hf.FakeQuantCache(plan, m.config)
        return teacher_forced(m, cache, ids, nxt), cache
    finally:
        ratekv.hf.FakeQuantLayer.update = _orig_update


def near_ties(plan, batch):
    """All stored coordinates sorted by |y − θ| (fp32 CPU model), and max rel of the rebuilt rows vs FakeQuant's."""
    cap = {}
    _, cache = fake_quant_run(plan, batch, capture=cap)
    rows, worst = [], 0.0
    for layer in range(rc.n_layers):
        for si, side in enumerate(("key", "value")):
            X = torch.cat([kv[si] for kv in cap[layer]], dim=2).double().numpy()  # (B, H, T, d)
            Xq = (cache.layers[layer].keys if si == 0 else cache.layers[layer].values).numpy()
            for b in range(batch):
                for h in range(rc.n_kv_heads):
                    rec = np.zeros(X.shape[2:])
                    for gi, (ch, bits, seed) in enumerate(groups(plan, layer, h, side)):
                        P, th, lv = rot(len(ch), bits, seed)
                        y, c = codes_of(X[b, h][:, ch], P, th)
                        rec[:, ch] = fp16_norm(X[b, h][:, ch]) * lv[c] @ P
                        d = np.abs(y[..., None] - th).min(-1)
                        for t in range(y.shape[0]):
                            i = int(d[t].argmin())
                            j = int(np.abs(y[t, i] - th).argmin())
                            rows.append((d[t, i], layer, side, b, h, t, gi, i, y[t, i] - th[j], c[t, i],
                                         c[t, i] - 1 if y[t, i] > th[j] else c[t, i] + 1))
                    worst = max(worst, np.abs(rec - Xq[b, h]).max() / np.abs(Xq[b, h]).max())
    rows.sort(key=lambda r: r[0])
    return rows, worst


def prompt_kv(model, batch):
    ids, _ = inputs(batch, PROMPT)
    c = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, past_key_values=c, use_cache=True)
    return {(l, s): (c.layers[l].keys if s == "key" else c.layers[l].values).double().numpy()
            for l in range(rc.n_layers) for s in ("key", "value")}


def main():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print("1. CPU packed cache vs FakeQuant, both on the CPU model: rel over the decode-step logits")
    for batch in (2, 1):
        ids, nxt = inputs(batch, PROMPT)
        for name, plan in PLANS.items():
            fq, _ = fake_quant_run(plan, batch)
            pk = teacher_forced(m, ratekv.hf.PackedCache(plan, m.config), ids, nxt)
            print(f"   B={batch} {name:14s} {rel(pk[1:], fq[1:]):.1e}", flush=True)
    m64 = tiny_model(*MODEL).double()
    kv32, kv64 = prompt_kv(m, 2), prompt_kv(m64, 2)
    print("2./3. B=2: coordinates within 4e-7 of a Lloyd-Max threshold (y = Π x/‖x‖), y − θ in the fp32 model and (prompt"
          " rows) in the float64 model; rel(decode logits) with the neighbouring code forced")
    for name, plan in PLANS.items():
        rows, worst = near_ties(plan, 2)
        base, _ = fake_quant_run(plan, 2)
        print(f"   -- {name} (rebuilt rows vs FakeQuant's: rel {worst:.1e})")
        for r in [r for r in rows if r[0] < 4e-7]:
            _, layer, side, b, h, t, gi, i, d32, cur, other = r
            d64 = ""
            if t < PROMPT:
                ch, bits, seed = groups(plan, layer, h, side)[gi]
                P, th, _ = rot(len(ch), bits, seed)
                y64, _ = codes_of(kv64[(layer, side)][b, h, t][ch], P, th)
                d64 = f"{y64[i] - th[np.abs(y64[i] - th).argmin()]:+.2e}"
            f, _ = fake_quant_run(plan, 2, (layer, side, b, h, t, gi, i, other))
            per = " ".join(f"{rel(f[1:, s], base[1:, s]):.1e}" for s in range(2))
            print(f"   layer {layer} {side:5s} seq {b} head {h} token {t:3d} group {gi} coord {i:3d}: y-θ fp32 {d32:+.2e}"
                  f" fp64 {d64 or '(decode row)':>9s}  code {cur}->{other}: rel {rel(f[1:], base[1:]):.2e} (seq 0, 1: {per})",
                  flush=True)
    # fp32 rounding noise of the rotated coordinates (layer-1 prompt keys, Block-GTQ group 0 of head 0)
    plan = PLANS["block-gtq 3/3"]
    ch, bits, seed = groups(plan, 1, 0, "key")[0]
    P, th, _ = rot(len(ch), bits, seed)
    dy = codes_of(kv32[(1, "key")][:, 0][..., ch], P, th)[0] - codes_of(kv64[(1, "key")][:, 0][..., ch], P, th)[0]
    k32, k64 = kv32[(1, "key")], kv64[(1, "key")]
    print(f"fp32 vs float64 model, layer-1 prompt keys: rel {np.abs(k32 - k64).max() / np.abs(k64).max():.1e}; "
          f"Block-GTQ group-0 rotated coords of head 0: |δy| rms {np.sqrt((dy ** 2).mean()):.1e}, max {np.abs(dy).max():.1e}")
    k1 = prompt_kv(m, 1)[(1, "key")]
    print(f"fp32 CPU model: seq 0's prompt keys at B=1 and B=2 bit-identical: {np.array_equal(k1[0], k32[0])}")


if __name__ == "__main__":
    main()
