#!/usr/bin/env python3
"""A Block-GTQ-shaped plan for a synthetic model (no calibration exists for
random weights): the key bit allocation of a real Block-GTQ plan (by default
SmolLM2's K3V3 plan, bench/results/niah_plans/block-gtq-k3v3.plan.json: 2, 3
and 4-bit RoPE-block groups per head) mapped onto the target's heads — target
(layer l, KV head h) takes source (l mod L_src, h mod H_src), target RoPE block
b takes source block floor(b · blocks_src / blocks_dst) — with 0-bit source
blocks raised to 2 bits (the GPU serves 1..4-bit groups) and uniform 3-bit
TQ-MSE values. Speed depends on the group structure, not on the weights;
the achieved bits are printed and recorded in the plan.

Usage: gtq_shape_plan.py --model llama-3.1-8b --out P.plan.json [--src PLAN] [--vbits 3]
"""
import argparse
import json
import random

SHAPES = {  # (arch, n_layers, n_kv_heads, head_dim, rope_layout)
    "llama-3.1-8b": ("llama", 32, 8, 128, "interleaved"),
    "qwen2.5-7b": ("qwen2", 28, 4, 128, "neox"),
    "qwen2.5-3b": ("qwen2", 36, 2, 128, "neox"),
}

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True, choices=sorted(SHAPES))
ap.add_argument("--src", default="bench/results/niah_plans/block-gtq-k3v3.plan.json")
ap.add_argument("--vbits", type=int, default=3)
ap.add_argument("--out", required=True)
a = ap.parse_args()
arch, L, H, d, layout = SHAPES[a.model]
src = json.load(open(a.src))
Ls, Hs, ds = src["model"]["n_layers"], src["model"]["n_kv_heads"], src["model"]["head_dim"]
rng = random.Random(1)
layers = []
code_bits = norm_bits = 0
for l in range(L):
    heads = []
    for h in range(H):
        sk = src["layers"][l % Ls]["heads"][h % Hs]["key"]
        width = {}
        for g in sk["groups"]:
            for b in g["blocks"]:
                width[b] = max(g["bits"], 2) if g["bits"] == 0 else g["bits"]
        groups = {}
        for b in range(d // 2):
            w = width[b * (ds // 2) // (d // 2)]
            groups.setdefault(w, []).append(b)
        key = {"kind": "tq-mse-grouped", "norm": "fp16", "group_size": 0,
               "groups": [{"bits": w, "blocks": bl, "seed": rng.randrange(1 << 31)} for w, bl in sorted(groups.items())]}
        code_bits += sum(w * 2 * len(bl) for w, bl in groups.items())
        norm_bits += 16 * len(groups)
        value = {"kind": "tq-mse", "norm": "fp16", "group_size": 0,
                 "groups": [{"bits": a.vbits, "channels": list(range(d)), "seed": rng.randrange(1 << 31)}]}
        heads.append({"key": key, "value": value})
    layers.append({"heads": heads})
n = L * H * d
k_eff = (code_bits + norm_bits) / n
plan = {"format": "ratekv-plan", "version": 1,
        "method": f"block-gtq-shape (key allocation of {src['method']} {a.src.split('/')[-1]} mapped onto {a.model})",
        "model": {"arch": arch, "n_layers": L, "n_kv_heads": H, "head_dim": d, "rope_layout": layout,
                  "file": "", "sha256": ""},
        "stats": "", "tensors": None, "seed": 0, "fp16_window": 0, "sink_tokens": 0,
        "budget": {"unit": "effective", "k": round(k_eff, 4), "v": a.vbits + 16 / d},
        "layers": layers}
json.dump(plan, open(a.out, "w"))
print(f"{a.out}: keys {code_bits / n:.3f} code bits, {k_eff:.3f} effective; values {a.vbits + 16 / d:.3f} effective")
